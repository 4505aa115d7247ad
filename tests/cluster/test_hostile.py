"""The fleet layer against a hostile or unlucky deployment: bad events, restarts, faults.

One test (or a few) per way the index was seen to go wrong, each driven through
the public API as a deployment would: real managers' events, crafted events
and frames, a real redis-server. The expected values come from the engines
themselves (their own hit search and cached-block count) or are worked out by
hand in the comments.
"""

from __future__ import annotations

import random
import time
import tracemalloc

import pytest
from clusterhelpers import Engine, engine_hit, full, layout, prompt_hits, window

import kvcore
from kvcore.cluster import (
    ClusterIndex,
    EmbeddedBackend,
    EngineConflictError,
    EngineLoad,
    EventBatch,
    EventPublisher,
    EventSubscriber,
    IndexUnavailableError,
    InvalidEventError,
    Router,
    SubmitResult,
)
from kvcore.testing import admit

SPECS = [full(), window()]
ENDPOINT = "tcp://127.0.0.1:*"


def stored(hashes, group=0, block_size=4, kind=None) -> kvcore.events.BlockStored:
    return kvcore.events.BlockStored(
        block_hashes=hashes,
        parent_block_hash=None,
        token_ids=[0] * (block_size * len(hashes)),
        block_size=block_size,
        group_idx=group,
        kind=kind,
    )


def removed(hashes, group=0) -> kvcore.events.BlockRemoved:
    return kvcore.events.BlockRemoved(block_hashes=hashes, group_idx=group)


def fill(engine: Engine, name: str, tokens) -> None:
    request = kvcore.Request(name, list(tokens))
    blocks, _ = admit(engine.manager, request)
    assert blocks is not None
    engine.manager.free(request)


# -- 1. a clear and stores in one batch ------------------------------------------------


def test_a_clear_then_stores_in_one_batch_leave_exactly_the_stores(make_index):
    """A reset and an allocation in one step left phantom blocks, inherited by the next engine."""
    now = [0.0]
    index = make_index([full()], heartbeat_timeout_s=5.0, clock=lambda: now[0])
    engine = Engine("a", [full()])
    fill(engine, "r1", range(16))
    index.submit("a", *engine.publish())
    assert engine.manager.reset_prefix_cache()
    second = kvcore.Request("r2", list(range(100, 112)))
    admit(engine.manager, second)
    batch = engine.publish()
    assert [type(e).__name__ for e in batch[2]] == ["AllBlocksCleared", "BlockStored"]
    index.submit("a", *batch)
    # The engine holds r2's three blocks and nothing of r1.
    assert engine.manager.block_pool.num_cached_blocks() == 3
    assert index.cached_blocks("a") == 3
    assert prompt_hits(index, range(100, 113)) == {"a": 12}
    assert prompt_hits(index, range(17)) == {"a": 0}
    engine.manager.free(second)
    assert engine.manager.reset_prefix_cache()
    index.submit("a", *engine.publish())
    assert index.cached_blocks("a") == 0
    assert prompt_hits(index, range(100, 113)) == {"a": 0}
    # "a" dies; "b" takes its place in the backend and holds nothing.
    now[0] = 10.0
    index.heartbeat("b")
    assert index.live_engines() == ["b"]
    assert prompt_hits(index, range(100, 113)) == {"b": 0}


def random_history(engine: Engine, rng: random.Random, steps: int) -> list:
    """Admissions, frees and cache resets; events of one to three steps per batch."""
    bases = [[rng.randrange(40) for _ in range(24)] for _ in range(3)]
    batches = []
    pending = 0
    for step in range(steps):
        manager = engine.manager
        roll = rng.random()
        if roll < 0.2 and not engine.live:
            manager.reset_prefix_cache()
        elif roll < 0.5 and engine.live:
            manager.free(engine.live.pop(rng.randrange(len(engine.live))))
        else:
            base = rng.choice(bases)
            tokens = base[: rng.randrange(4, 24)] + [rng.randrange(40)]
            request = kvcore.Request(f"{engine.name}-{step}", tokens)
            if admit(manager, request)[0] is not None:
                engine.live.append(request)
        pending += 1
        if pending >= rng.randrange(1, 4):
            batch = engine.publish()
            if batch is not None:
                batches.append(batch)
            pending = 0
    batch = engine.publish()
    if batch is not None:
        batches.append(batch)
    return bases, batches


@pytest.mark.parametrize("seed", range(4))
def test_random_histories_with_cache_resets_end_as_the_engine_does(make_index, seed):
    """41 of 200 random histories ended with the index claiming blocks the engine had not."""
    index = make_index([full()], num_blocks=24)
    rng = random.Random(seed)
    for history in range(50):
        engine = Engine(f"h{history}", [full()], num_blocks=24)
        bases, batches = random_history(engine, rng, 12)
        for batch in batches:
            index.submit(engine.name, *batch)
        assert index.cached_blocks(engine.name) == engine.manager.block_pool.num_cached_blocks()
        for base in bases:
            probe = base[:20]
            assert prompt_hits(index, probe)[engine.name] == engine_hit(engine, probe)


# -- 2. one bad publisher ---------------------------------------------------------------

BAD_EVENTS = {
    "negative group": (stored([1], group=-1), "group_idx -1"),
    "group past the layout": (stored([1], group=2), "group_idx 2"),
    "huge group": (stored([1], group=10**7), "group_idx 10000000"),
    "removal in a negative group": (removed([1], group=-1), "group_idx -1"),
    "int and bytes hashes": (stored([1, b"12345678"]), "block hash"),
    "bytes hash in an int layout": (stored([b"12345678"]), "block hash"),
    "hash past 64 bits": (stored([2**64]), "block hash"),
    "wrong block size": (stored([1], block_size=8), "block_size 8"),
    "wrong kind": (stored([1], kind="mamba"), "kind 'mamba'"),
    "not an event": ("BlockStored", "not a KV cache event"),
}


@pytest.mark.parametrize("name", sorted(BAD_EVENTS))
def test_a_bad_event_is_refused_whole_and_no_other_engine_notices(make_index, name):
    """group_idx=-1 made every later query raise for all engines, retried on every flush."""
    bad_event, message = BAD_EVENTS[name]
    index = make_index(SPECS)
    good, bad = Engine("good", SPECS), Engine("bad", SPECS)
    fill(good, "g", range(20))
    fill(bad, "b", range(500, 520))
    index.submit("good", *good.publish())
    index.submit("bad", *bad.publish())
    assert prompt_hits(index, range(21)) == {"good": 20, "bad": 0}
    # A valid store first: the batch is refused whole, so 77 is not applied.
    with pytest.raises(InvalidEventError, match=message):
        index.submit("bad", bad.seq, 9.0, [stored([77]), bad_event])
    bad.seq += 1
    assert index.stats.rejected == 1
    # What the bad engine caches is no longer known: its entries are dropped.
    assert index.cached_blocks("bad") == 0
    assert prompt_hits(index, range(21)) == {"good": 20, "bad": 0}
    router = Router("prefix", index)
    loads = [EngineLoad(engine="bad"), EngineLoad(engine="good")]
    request = kvcore.Request("next", [*range(20), 99])
    kvcore.hashing.BlockHasher(index.hash_block_size, "fast").update(request)
    route = router.route(request.block_hashes, request.num_tokens, loads)
    assert (route.engine, route.expected_hit_tokens, route.degraded) == ("good", 20, False)
    # The bad engine is followed again from its next batch; nothing is retried.
    fill(bad, "b2", range(700, 708))
    assert index.submit("bad", *bad.publish()) == SubmitResult.APPLIED
    assert prompt_hits(index, range(700, 709))["bad"] == 8
    index.flush()
    assert index.stats.rejected == 1


def test_a_huge_group_index_costs_no_memory(make_index):
    """One 61-byte event with group_idx=10**7 cost 1.4 GiB and 5-14 s."""
    index = make_index([full()])
    event = stored([1], group=10**7)
    tracemalloc.start()
    try:
        start = time.perf_counter()
        with pytest.raises(InvalidEventError, match="group_idx"):
            index.submit("a", 0, 1.0, [event])
        index.flush()
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert elapsed < 1.0


# -- 3. an empty hash on Redis ----------------------------------------------------------


def test_an_empty_hash_never_reaches_redis(redis_server, namespace):
    """b"" packed to width 0 and the script looped forever: Redis BUSY for every tenant."""
    import redis

    from kvcore.cluster import RedisBackend

    backend = RedisBackend(redis_server.url, 2, namespace=namespace, socket_timeout_s=1.0)
    index = ClusterIndex(layout(SPECS, hash_algorithm="sha256"), backend)
    try:
        with pytest.raises(InvalidEventError, match="32-byte"):
            index.submit("a", 0, 1.0, [stored([b""])])
        index.flush()
        client = redis.Redis.from_url(redis_server.url, socket_timeout=1.0)
        assert client.ping()
        assert index.cached_blocks("a") == 0
        client.close()
    finally:
        index.close()


# -- 4. a failed Redis batch ------------------------------------------------------------


def test_a_refused_batch_leaves_redis_as_it_was(redis_session, namespace):
    """Writes before an error stayed, each retry added them again ({41: 3, 42: 3})."""
    import redis

    from kvcore.cluster import RedisBackend

    backend = RedisBackend(redis_session.url, 2, namespace=namespace)
    index = ClusterIndex(layout(SPECS), backend)
    client = redis.Redis.from_url(redis_session.url)
    try:
        engine = Engine("a", SPECS)
        fill(engine, "r", range(8))
        index.submit("a", *engine.publish())
        assert index.cached_blocks("a") == 4
        with pytest.raises(InvalidEventError):
            index.submit("a", engine.seq, 5.0, [stored([41, 42]), stored([43], group=-1)])
        engine.seq += 1
        for _ in range(4):
            index.flush()
        assert client.type(f"{namespace}:e:a:meta") == b"hash"
        members = client.smembers(f"{namespace}:e:a:g:0")
        assert not {m for m in members if m[-1] in (41, 42, 43)}
        assert index.cached_blocks("a") == 0  # refused: entries dropped, nothing added
        fill(engine, "s", range(200, 208))
        assert index.submit("a", *engine.publish()) == SubmitResult.APPLIED
        assert prompt_hits(index, range(200, 209)) == {"a": 8}
    finally:
        client.close()
        index.close()


# -- 5. restarts ------------------------------------------------------------------------


def connected(engine: str, publisher: EventPublisher) -> EventSubscriber:
    """A subscriber that has received at least one of the publisher's batches."""
    subscriber = EventSubscriber(engine, publisher.endpoint, publisher.replay_endpoint)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        publisher.publish(EventBatch(0.0, []))
        if subscriber.receive(50) is not None:
            return subscriber
    subscriber.close()
    pytest.fail("the subscriber never connected")


def pump_until(subscriber: EventSubscriber, index: ClusterIndex, done) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        subscriber.pump(index, timeout_ms=50)
        if done():
            return
    pytest.fail("the batches never arrived")


def serve(engine_name: str, index: ClusterIndex, ts: float, tokens, last_hits) -> None:
    """One engine incarnation: publish its prompt's events at time ``ts`` into ``index``."""
    with EventPublisher(ENDPOINT, ENDPOINT) as publisher:
        subscriber = connected(engine_name, publisher)
        try:
            engine = Engine(engine_name, [full()])
            fill(engine, "r", tokens)
            publisher.publish(EventBatch(ts, engine.manager.take_events()))
            pump_until(subscriber, index, lambda: last_hits() > 0)
        finally:
            subscriber.close()


def test_a_restart_is_seen_whatever_the_clock_says(make_index):
    """A restarted engine whose clock stepped back was ignored until it passed the old time."""
    index = make_index([full()])
    old, new = range(16), range(100, 108)
    serve("a", index, 1000.0, old, lambda: prompt_hits(index, [*old, 0])["a"])
    assert prompt_hits(index, [*old, 0]) == {"a": 16}
    serve("a", index, 5.0, new, lambda: prompt_hits(index, [*new, 0])["a"])
    assert prompt_hits(index, [*old, 0]) == {"a": 0}
    assert prompt_hits(index, [*new, 0]) == {"a": 8}
    assert index.cached_blocks("a") == 2
    assert index.stats.restarts == 1


def test_an_engine_restarted_within_the_ttl_replaces_its_entries_in_redis(redis_session, namespace):
    """A restart kept the old seq in Redis: new batches looked applied, old blocks stayed."""
    from kvcore.cluster import RedisBackend

    old, new = range(16), range(100, 108)
    first = ClusterIndex(layout([full()]), RedisBackend(redis_session.url, 1, namespace=namespace))
    serve("a", first, 10.0, old, lambda: prompt_hits(first, [*old, 0])["a"])
    first.close()
    # The router restarts too: a fresh index on the same Redis, within the TTL.
    second = ClusterIndex(layout([full()]), RedisBackend(redis_session.url, 1, namespace=namespace))
    try:
        second.heartbeat("a")  # the router knows its engines
        assert prompt_hits(second, [*old, 0]) == {"a": 16}  # what Redis kept
        serve("a", second, 20.0, new, lambda: prompt_hits(second, [*new, 0])["a"])
        assert prompt_hits(second, [*old, 0]) == {"a": 0}
        assert prompt_hits(second, [*new, 0]) == {"a": 8}
        assert second.cached_blocks("a") == 2
    finally:
        second.close()


def test_a_late_batch_of_a_replaced_incarnation_is_ignored(make_index):
    index = make_index([full()])
    assert index.submit("a", 0, 1.0, [stored([1, 2])], incarnation="old") == SubmitResult.APPLIED
    assert index.submit("a", 0, 0.5, [stored([5])], incarnation="new") == SubmitResult.RESTARTED
    # A replay of the old incarnation's first batch arrives late: it is stale.
    assert index.submit("a", 0, 1.0, [stored([1, 2])], incarnation="old") == SubmitResult.STALE
    assert index.cached_blocks("a") == 1
    assert index.stats.stale == 1


# -- 6. Redis faults --------------------------------------------------------------------


def test_redis_out_of_memory_is_an_outage_and_the_queue_stays_bounded(redis_server, namespace):
    """At maxmemory redis-py's errors escaped, the router raised, 241 batches piled up."""
    import redis

    from kvcore.cluster import RedisBackend

    backend = RedisBackend(redis_server.url, 2, namespace=namespace, socket_timeout_s=2.0)
    index = ClusterIndex(layout(SPECS, num_blocks=400), backend, max_pending=32)
    router = Router("prefix", index)
    client = redis.Redis.from_url(redis_server.url)
    try:
        engine = Engine("a", SPECS, num_blocks=400)
        fill(engine, "r0", range(16))
        index.submit("a", *engine.publish())
        assert prompt_hits(index, range(17)) == {"a": 16}
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        for n in range(1, 200):
            fill(engine, f"r{n}", range(1000 * n, 1000 * n + 8))
            index.submit("a", *engine.publish())
        with pytest.raises(IndexUnavailableError, match=r"OutOfMemoryError.*maxmemory"):
            index.flush()
        assert index.queued_batches <= 32 + 1
        assert index.stats.dropped > 0
        route = router.route([], 9, [EngineLoad(engine="a")])
        assert route.degraded
        client.config_set("maxmemory", "0")
        # Back: what was dropped is gone (an under-estimate, never a claim the
        # engine does not back), and the engine is followed exactly again.
        fill(engine, "last", range(90_000, 90_008))
        index.submit("a", *engine.publish())
        assert prompt_hits(index, range(90_000, 90_009)) == {"a": 8}
        assert index.cached_blocks("a") <= engine.manager.block_pool.num_cached_blocks()
        for n in range(200):
            probe = [*range(1000 * n, 1000 * n + 8), 1]
            assert prompt_hits(index, probe)["a"] <= engine_hit(engine, probe)
    finally:
        client.close()
        index.close()


def test_a_key_of_the_wrong_type_breaks_nothing_but_that_engine(redis_session, namespace):
    """A key of the wrong type raised WRONGTYPE from every query, for every engine."""
    import redis

    from kvcore.cluster import RedisBackend

    index = ClusterIndex(layout(SPECS), RedisBackend(redis_session.url, 2, namespace=namespace))
    client = redis.Redis.from_url(redis_session.url)
    try:
        a, b = Engine("a", SPECS), Engine("b", SPECS)
        fill(a, "ra", range(12))
        fill(b, "rb", range(12))
        index.submit("a", *a.publish())
        index.submit("b", *b.publish())
        assert prompt_hits(index, range(13)) == {"a": 12, "b": 12}
        client.delete(f"{namespace}:e:b:g:0")
        client.set(f"{namespace}:e:b:g:0", "not a set")
        assert prompt_hits(index, range(13)) == {"a": 12, "b": 0}
        fill(b, "rb2", range(300, 308))
        index.submit("b", *b.publish())
        assert prompt_hits(index, range(300, 309)) == {"a": 0, "b": 8}
        assert index.stats.rejected == 1  # the batch met the broken key: b resynced
    finally:
        client.close()
        index.close()


# -- 7. bad ZMQ frames ------------------------------------------------------------------


def good_frames(seq: int, hashes) -> list[bytes]:
    from kvcore.cluster import encode_batch

    events = [stored(hashes)] if hashes else []
    return [b"", seq.to_bytes(8, "big"), encode_batch(EventBatch(1.0, events))]


def test_the_subscriber_skips_malformed_messages_and_keeps_following():
    """A 2- or 4-frame message, or a sequence frame of 0xff x 8, killed the subscriber."""
    import zmq

    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.bind(ENDPOINT)
    endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
    subscriber = EventSubscriber("e0", endpoint)
    index = ClusterIndex(layout([full()]))
    try:
        deadline = time.monotonic() + 10
        while subscriber.receive(50) is None:
            assert time.monotonic() < deadline, "the subscriber never connected"
            pub.send_multipart(good_frames(0, []))
        for bad in (
            [b"", b"\x00" * 8],
            [b"", b"\x00" * 8, b"x", b"y"],
            [b"", b"\xff" * 8, good_frames(1, [5])[2]],
            [b"", b"\x01", good_frames(1, [5])[2]],
            [b"", (1).to_bytes(8, "big"), b"not msgpack"],
        ):
            pub.send_multipart(bad)
        pub.send_multipart(good_frames(1, [2]))
        pump_until(subscriber, index, lambda: index.cached_blocks("e0") > 0)
        assert (subscriber.bad_frames, subscriber.bad_payloads) == (4, 1)
        assert index.cached_blocks("e0") == 1
        assert prompt_hits(index, [0] * 5) == {"e0": 0}
    finally:
        subscriber.close()
        pub.close(linger=0)


def fake_replay_endpoint(answers, stop):
    """A ROUTER socket that answers every replay request with ``answers`` (frames after the id)."""
    import threading

    import zmq

    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.bind(ENDPOINT)
    endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def run():
        try:
            while not stop.is_set():
                if not socket.poll(20):
                    continue
                identity = socket.recv_multipart()[0]
                for frames in answers():
                    if stop.is_set():
                        break
                    socket.send_multipart([identity, *frames])
        finally:
            socket.close(linger=0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return endpoint, thread


def test_a_replay_answer_that_is_not_a_batch_is_skipped():
    import threading

    end = [b"", (-1).to_bytes(8, "big", signed=True), b""]
    answers = [
        [b"", (0).to_bytes(8, "big"), b"garbage"],
        [b"", (0).to_bytes(8, "big")],
        good_frames(1, [3]),
        end,
    ]
    stop = threading.Event()
    endpoint, thread = fake_replay_endpoint(lambda: answers, stop)
    subscriber = EventSubscriber("e0", "tcp://127.0.0.1:1", endpoint)
    try:
        replayed = subscriber.replay(0, timeout_ms=2000)
        assert [(seq, batch.events) for seq, batch in replayed] == [(1, [stored([3])])]
        assert (subscriber.bad_frames, subscriber.bad_payloads) == (1, 1)
    finally:
        stop.set()
        thread.join(5)
        subscriber.close()


def test_a_replay_endpoint_that_never_stops_answering_is_cut_off():
    import itertools
    import threading

    def endless():
        for seq in itertools.count():
            yield good_frames(seq, [seq])

    stop = threading.Event()
    endpoint, thread = fake_replay_endpoint(endless, stop)
    subscriber = EventSubscriber("e0", "tcp://127.0.0.1:1", endpoint)
    try:
        start = time.monotonic()
        replayed = subscriber.replay(0, timeout_ms=500, max_batches=1000)
        assert time.monotonic() - start < 5
        assert len(replayed) == 1000
    finally:
        stop.set()
        thread.join(5)
        subscriber.close()


# -- 8. an engine's share, and two engines under one id ---------------------------------


def test_an_engines_entries_are_capped_at_its_pool(make_index):
    """Nothing bounded an engine's share of the index: 10**6 hashes added 330 MiB."""
    index = make_index([full()], num_blocks=40)
    tracemalloc.start()
    try:
        huge = stored(list(range(10**6)), block_size=4)
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        with pytest.raises(InvalidEventError, match="40"):
            index.submit("a", 0, 1.0, [huge])
        index.flush()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak - base < 1 << 20
    assert index.cached_blocks("a") == 0
    # Two batches of 30 distinct blocks: the second would take the engine
    # past its pool of 40, so the backend refuses it; the engine's entries
    # are dropped and the batch applied alone (30 entries, those of the second).
    index.submit("a", 1, 2.0, [stored(list(range(100, 130)))])
    index.submit("a", 2, 3.0, [stored(list(range(200, 230)))])
    assert index.cached_blocks("a") == 30
    assert index.stats.rejected == 2
    # A batch that removes as much as it stores fits: 30 - 30 + 30.
    index.submit("a", 3, 4.0, [removed(list(range(200, 230))), stored(list(range(300, 330)))])
    assert index.cached_blocks("a") == 30
    assert index.stats.rejected == 2


def test_an_engine_announcing_its_pool_is_held_to_it(make_index):
    index = make_index([full()], num_blocks=40)
    with pytest.raises(InvalidEventError, match="num_blocks"):
        index.submit("a", 0, 1.0, [], incarnation="x", num_blocks=10**9)
    assert index.stats.rejected == 1
    # 25 blocks do not fit a pool of 20, even onto empty entries: refused.
    index.submit("a", 1, 1.0, [stored(list(range(25)))], incarnation="x", num_blocks=20)
    assert index.cached_blocks("a") == 0
    assert index.stats.rejected == 2
    index.submit("a", 2, 1.0, [stored(list(range(20)))], incarnation="x", num_blocks=20)
    assert index.cached_blocks("a") == 20
    # The announcement holds for the batches that do not repeat it.
    # (21 blocks would fit the index's default of 40; against 20 the batch
    # is refused and applied onto emptied entries.)
    index.submit("a", 3, 1.0, [stored([100])], incarnation="x")
    assert index.cached_blocks("a") == 1
    assert index.stats.rejected == 3


def test_two_engines_under_one_id_are_refused(make_index):
    """Two engines announcing one id were not detected."""
    now = [0.0]
    index = make_index([full()], heartbeat_timeout_s=5.0, clock=lambda: now[0])
    index.submit("other", 0, 0.0, [stored([9])], incarnation="o")
    index.submit("a", 0, 0.0, [stored([1])], incarnation="first")
    # A second engine starts under the same id: at first, a restart.
    assert index.submit("a", 0, 0.0, [stored([2])], incarnation="second") == "restarted"
    # Then the first publishes again: both are alive, the id is refused.
    with pytest.raises(EngineConflictError, match="'a'"):
        index.submit("a", 1, 0.0, [stored([3])], incarnation="first")
    with pytest.raises(EngineConflictError):
        index.submit("a", 1, 0.0, [stored([4])], incarnation="second")
    assert index.stats.conflicts == 2
    assert index.live_engines() == ["other"]
    assert index.cached_blocks("a") == 0
    assert index.cached_blocks("other") == 1
    # The first goes quiet; once it has been silent for the timeout, the
    # second is followed again (from an empty entry set).
    now[0] = 3.0
    index.heartbeat("other")
    with pytest.raises(EngineConflictError):
        index.submit("a", 2, 3.0, [stored([5])], incarnation="second")
    now[0] = 6.0
    index.heartbeat("other")
    assert index.submit("a", 3, 6.0, [stored([6])], incarnation="second") == "applied"
    assert index.live_engines() == ["a", "other"]
    assert index.cached_blocks("a") == 1
    assert index.stats.conflicts == 3


def test_two_publishers_under_one_engine_id_do_not_stop_the_subscribers(make_index):
    index = make_index([full()])
    with EventPublisher(ENDPOINT, ENDPOINT) as one, EventPublisher(ENDPOINT, ENDPOINT) as two:
        first, second = connected("a", one), connected("a", two)
        try:
            deadline = time.monotonic() + 10
            while index.stats.conflicts == 0:
                assert time.monotonic() < deadline, "no conflict seen"
                for publisher in (one, two):
                    publisher.publish(EventBatch(1.0, [stored([7])]))
                first.pump(index, timeout_ms=20)
                second.pump(index, timeout_ms=20)
            assert first.rejected + second.rejected >= 1
            assert "a" not in index.live_engines()
        finally:
            first.close()
            second.close()


# -- a test gap: two indexes sharing one backend ----------------------------------------


def test_two_indexes_sharing_an_embedded_backend_apply_each_batch_once():
    backend = EmbeddedBackend()
    first = ClusterIndex(layout(SPECS), backend)
    second = ClusterIndex(layout(SPECS), backend)
    engine = Engine("a", SPECS)
    for n in range(3):
        fill(engine, f"r{n}", range(100 * n, 100 * n + 6))  # one block of each group
        batch = engine.publish()
        first.submit("a", *batch)
        first.flush()
        second.submit("a", *batch)
        second.flush()
    # Each 6-token prompt fills one 4-token block in each of the two groups.
    assert engine.manager.block_pool.num_cached_blocks() == 6
    assert first.cached_blocks("a") == second.cached_blocks("a") == 6
    assert (first.stats.batches, second.stats.batches) == (3, 0)
    assert second.stats.duplicates == 3


def test_an_engine_known_from_heartbeats_starts_with_its_first_incarnation(make_index):
    index = make_index([full()])
    index.heartbeat("a")
    assert index.submit("a", 0, 1.0, [stored([1])], incarnation="x") == SubmitResult.APPLIED
    assert index.stats.restarts == 0
    assert index.cached_blocks("a") == 1


def test_refused_batches_ahead_of_a_gap_are_held_within_the_bounds(make_index):
    # A publisher sending only bad batches, each two ahead of the last, so a
    # gap stays open: each is held (to drop the entries once it is due), at
    # most max_pending = 8 of them. The 9th held resyncs (the first held one
    # is released), so 199 batches resync 199 - 8 times.
    index = make_index([full()], max_pending=8)
    index.submit("a", 0, 0.0, [stored([1])])
    for seq in range(2, 400, 2):
        with pytest.raises(InvalidEventError):
            index.submit("a", seq, 1.0, [stored([1], group=9)])
    assert index.stats.rejected == 199
    assert index.stats.resyncs == 199 - 8
    assert index.missing("a") == 400 - 2 * 8 - 1
    assert index.cached_blocks("a") == 0  # the refused batches dropped the entries


def test_calls_with_bad_ids_or_hashes_name_the_argument(make_index):
    index = make_index([full()])
    for bad in ([], "a b", "", 5, "x" * 201):
        with pytest.raises(kvcore.errors.InvalidConfigError, match="engine must be"):
            index.submit(bad, 0, 0.0, [])
        with pytest.raises(kvcore.errors.InvalidConfigError, match="engine must be"):
            index.cached_blocks(bad)
        with pytest.raises(kvcore.errors.InvalidConfigError, match="engine must be"):
            index.hit_tokens([1], 5, [bad])
    with pytest.raises(kvcore.errors.InvalidRequestError, match="block_hashes must be integers"):
        index.hit_tokens([b"12345678"], 5)
    with pytest.raises(InvalidEventError, match="incarnation must be"):
        index.submit("a", 0, 0.0, [], incarnation="two words")
    assert index.live_engines() == []
