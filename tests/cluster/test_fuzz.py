"""Fuzzing the wire decoder and the index: random and mutated batches through both backends.

Each example is a history of submissions (valid, invalid and mutated
batches, replays, gaps, restarts, announcements), heartbeats, resyncs and
clock steps, applied to an index on the in-process backend and one on a real
Redis. After every step both must have answered alike (the same result or
the same kvcore error) and hold alike (entries per engine, live engines,
counters, hits of random prompts); nothing but kvcore's errors may come out.
The budget is fixed (CI runs it in seconds); ``benchmarks/fuzz_cluster_index.py``
runs the same comparison over millions of batches.
"""

from __future__ import annotations

import uuid

import attrs
import msgspec
import pytest
from clusterhelpers import full, layout, window
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvcore
from kvcore.cluster import (
    ClusterIndex,
    EmbeddedBackend,
    EventBatch,
    EventFormatError,
    ReadyBatch,
    RedisBackend,
    decode_batch,
    encode_batch,
)
from kvcore.errors import KVCoreError

SPECS = [full(), window()]
ENGINES = ("a", "b", "c")
POOL = 12  # the layout's pool: caps matter

KINDS = ("full_attention", "sliding_window")
hashes = st.lists(st.integers(0, 9), max_size=6)


@st.composite
def valid_event(draw):
    kind = draw(st.sampled_from(["stored", "stored", "removed", "removed", "cleared"]))
    if kind == "cleared":
        return kvcore.events.AllBlocksCleared()
    group = draw(st.sampled_from([0, 1]))
    if kind == "removed":
        return kvcore.events.BlockRemoved(block_hashes=draw(hashes), group_idx=group)
    return kvcore.events.BlockStored(
        block_hashes=draw(hashes),
        parent_block_hash=None,
        token_ids=[],
        block_size=4,
        group_idx=group,
        kind=draw(st.sampled_from([None, KINDS[group]])),
    )


# One way to spoil an event (the batch must then be refused by both backends alike).
SPOILERS = {
    "hash": lambda e, v: attrs.evolve(e, block_hashes=[*e.block_hashes, v]),
    "group": lambda e, v: attrs.evolve(e, group_idx=v),
    "block size": lambda e, v: attrs.evolve(e, block_size=8),
    "kind": lambda e, v: attrs.evolve(e, kind="mamba"),
    "not an event": lambda e, v: "BlockStored",
}
odd_values = st.sampled_from(
    [-1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, b"12345678", b"", 1.5, 2, -1, 10**7]
)


@st.composite
def batch_events(draw):
    events = draw(st.lists(valid_event(), max_size=5))
    if events and draw(st.integers(0, 9)) == 0:
        i = draw(st.integers(0, len(events) - 1))
        spoiler = draw(st.sampled_from(sorted(SPOILERS)))
        if not isinstance(events[i], kvcore.events.AllBlocksCleared) or spoiler == "not an event":
            stored = isinstance(events[i], kvcore.events.BlockStored)
            if spoiler in ("block size", "kind") and not stored:
                spoiler = "group"
            events[i] = SPOILERS[spoiler](events[i], draw(odd_values))
    return events


submission = st.fixed_dictionaries(
    {
        "action": st.just("submit"),
        "engine": st.sampled_from(ENGINES),
        "seq": st.sampled_from(["next", "next", "next", "ahead", "old", "same"]),
        "incarnation": st.sampled_from(["same", "same", "same", "new", "old", None, "bad id"]),
        "num_blocks": st.sampled_from([None, None, 8, POOL, 10**6, 0]),
        "events": batch_events(),
        "wire": st.booleans(),
        "mutation": st.none() | st.tuples(st.integers(0, 200), st.integers(0, 255)),
    }
)
other = st.fixed_dictionaries(
    {
        "action": st.sampled_from(["heartbeat", "resync", "tick", "long tick"]),
        "engine": st.sampled_from(ENGINES),
    }
)
histories = st.lists(st.one_of(submission, submission, submission, other), min_size=1, max_size=30)


class Publisher:
    """What the history says each engine sends: sequence numbers and incarnations."""

    def __init__(self) -> None:
        self.seq = dict.fromkeys(ENGINES, 0)
        self.incarnation = dict.fromkeys(ENGINES, "i0")
        self.runs = dict.fromkeys(ENGINES, 0)

    def batch(self, step: dict) -> tuple[int, str | None]:
        engine = step["engine"]
        choice = step["incarnation"]
        if choice == "new":
            self.runs[engine] += 1
            self.incarnation[engine] = f"i{self.runs[engine]}"
            self.seq[engine] = 0
        incarnation = {
            "same": self.incarnation[engine],
            "new": self.incarnation[engine],
            "old": "i0",
            None: None,
            "bad id": "bad id",
        }[choice]
        seq = self.seq[engine]
        seq = {"next": seq, "ahead": seq + 2, "old": max(0, seq - 2), "same": max(0, seq - 1)}[
            step["seq"]
        ]
        self.seq[engine] = max(self.seq[engine], seq + 1)
        return seq, incarnation


def outcome(call):
    try:
        return ("ok", call())
    except KVCoreError as exc:
        return ("error", type(exc).__name__, str(exc))


def through_the_wire(step: dict, ts: float, incarnation, num_blocks):
    """The step's events encoded (as a publisher would), maybe mutated, decoded: or ``None``."""
    wire_events = [e for e in step["events"] if not isinstance(e, str)]
    try:
        payload = encode_batch(
            EventBatch(ts, wire_events, incarnation=incarnation, num_blocks=num_blocks)
        )
    except (TypeError, OverflowError, msgspec.EncodeError):
        return None  # no publisher can send it
    if step["mutation"] is not None:
        position, value = step["mutation"]
        data = bytearray(payload)
        if position < len(data):
            data[position] = value
        else:
            data = data[: position % (len(data) + 1)]
        payload = bytes(data)
    try:
        return decode_batch(payload)
    except EventFormatError:
        return "refused"


def state_of(index: ClusterIndex, probes) -> tuple:
    return (
        index.live_engines(),
        [index.cached_blocks(engine) for engine in ENGINES],
        [index.hit_tokens(probe, 4 * len(probe) + 1, list(ENGINES)) for probe in probes],
        attrs.asdict(index.stats, filter=lambda a, _: not a.name.endswith("_s")),
    )


@pytest.fixture
def twin(redis_session):
    """``make()``: an embedded and a Redis index (fresh namespace) on one clock."""
    made = []

    def make():
        now = [0.0]
        options = {"heartbeat_timeout_s": 5.0, "clock": lambda: now[0], "max_pending": 4}
        lay = layout(SPECS, POOL)
        namespace = f"fuzz-{uuid.uuid4().hex[:10]}"
        pair = (
            ClusterIndex(lay, EmbeddedBackend(2), **options),
            ClusterIndex(lay, RedisBackend(redis_session.url, 2, namespace=namespace), **options),
        )
        made.extend(pair)
        return pair, now

    yield make
    for index in made:
        index.close()


def run_step(step: dict, pair, now, publisher: Publisher) -> None:
    action, engine = step["action"], step["engine"]
    if action == "tick":
        now[0] += 1.0
        return
    if action == "long tick":
        now[0] += 6.0
        return
    if action in ("heartbeat", "resync"):
        results = [outcome(lambda i=index: getattr(i, action)(engine)) for index in pair]
        assert results[0] == results[1]
        return
    seq, incarnation = publisher.batch(step)
    batch_events = step["events"]
    num_blocks = step["num_blocks"]
    if step["wire"]:
        decoded = through_the_wire(step, now[0], incarnation, num_blocks)
        if decoded is None or decoded == "refused":
            return
        batch_events, incarnation, num_blocks = (
            decoded.events,
            decoded.incarnation,
            decoded.num_blocks,
        )
    results = [
        outcome(
            lambda i=index: i.submit(
                engine, seq, now[0], batch_events, incarnation=incarnation, num_blocks=num_blocks
            )
        )
        for index in pair
    ]
    assert results[0] == results[1], step


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=histories, probes=st.lists(st.lists(st.integers(0, 9), max_size=5), max_size=2))
def test_both_backends_answer_every_history_alike(twin, history, probes):
    pair, now = twin()
    publisher = Publisher()
    for step in history:
        run_step(step, pair, now, publisher)
        assert state_of(pair[0], probes) == state_of(pair[1], probes), step


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=300))
def test_the_decoder_refuses_any_bytes_with_its_own_error(payload):
    try:
        batch = decode_batch(payload)
    except EventFormatError:
        return
    assert isinstance(batch, EventBatch)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=8)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=msgpack_values)
def test_the_decoder_refuses_any_msgpack_with_its_own_error(value):
    try:
        batch = decode_batch(msgspec.msgpack.encode(value))
    except EventFormatError:
        return
    assert isinstance(batch, EventBatch)


# -- the backends alone: what two routers sharing one backend would send ---------------

ops = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([1, -1]), st.sampled_from([0, 1]), hashes),
        st.just((0, 0, ())),
    ),
    max_size=4,
).map(tuple)
ready_batches = st.lists(
    st.builds(
        ReadyBatch,
        engine=st.sampled_from(ENGINES),
        seq=st.integers(0, 6),
        ts=st.just(1.0),
        ops=ops,
        reset=st.booleans(),
        incarnation=st.sampled_from(["", "x", "y", "z"]),
        max_blocks=st.sampled_from([None, 3, 8]),
    ),
    max_size=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(calls=st.lists(ready_batches, max_size=4))
def test_both_backends_apply_any_batch_stream_alike(redis_session, calls):
    embedded = EmbeddedBackend(2)
    redis_backend = RedisBackend(redis_session.url, 2, namespace=f"fuzz-{uuid.uuid4().hex[:10]}")
    try:
        for batches in calls:
            assert embedded.apply(batches) == redis_backend.apply(batches), batches
            for backend in (embedded, redis_backend):
                assert backend.engines() == embedded.engines()
            for engine in ENGINES:
                assert embedded.cached_blocks(engine) == redis_backend.cached_blocks(engine)
                assert embedded.last_seq(engine) == redis_backend.last_seq(engine)
            probe = [list(range(10)), list(range(10))]
            mine, theirs = (b.snapshot(list(ENGINES), probe) for b in (embedded, redis_backend))
            for position in range(len(ENGINES)):
                for group in (0, 1):
                    for block_hash in range(10):
                        assert mine.holds(position, group, block_hash) == theirs.holds(
                            position, group, block_hash
                        )
    finally:
        redis_backend.clear_namespace()
        redis_backend.close()
