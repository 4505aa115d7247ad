"""The Redis backend against a real redis-server: expiry, sharing, outages."""

from __future__ import annotations

import logging
import random
import time

import pytest
from clusterhelpers import Engine, engine_hit, full, layout, random_step, window

import kvcore
from kvcore.cluster import ClusterIndex, EngineLoad, RedisBackend, Router
from kvcore.testing import admit

SPECS = [full(), window()]


@pytest.fixture
def redis_index(request):
    made = []

    def make(url, namespace, **backend_options):
        backend = RedisBackend(url, len(SPECS), namespace=namespace, **backend_options)
        made.append(ClusterIndex(layout(SPECS), backend))
        return made[-1]

    yield make
    for index in made:
        index.close()


def test_entries_mirror_the_engine_pool_so_memory_is_bounded(redis_session, namespace, redis_index):
    index = redis_index(redis_session.url, namespace)
    engine = Engine("a", SPECS, num_blocks=30)
    rng = random.Random(5)
    bases = [[rng.randrange(50) for _ in range(60)] for _ in range(4)]
    for step in range(300):
        random_step(engine, rng, bases, step)
        batch = engine.publish()
        if batch is not None:
            index.submit("a", *batch)
    # Every field is a block the engine has cached, never more than its pool.
    cached = engine.manager.block_pool.num_cached_blocks()
    assert index.cached_blocks("a") == cached <= 29
    assert index.stats.block_ops > 10 * cached  # many stores and removals went through


def test_an_engines_keys_expire_with_it(redis_session, namespace, redis_index):
    import redis

    # The expiry each key gets is checked on a long TTL (nothing can expire
    # while the test looks, however loaded the machine); that they vanish, on
    # a short one, by polling up to a deadline.
    client = redis.Redis.from_url(redis_session.url)
    for ttl_s in (30.0, 0.3):
        index = redis_index(redis_session.url, f"{namespace}-{ttl_s:g}", ttl_s=ttl_s)
        engine = Engine("a", SPECS)
        admit(engine.manager, kvcore.Request("r", list(range(16))))
        index.submit("a", *engine.publish())
        index.flush()
        keys = list(client.scan_iter(match=f"{index.backend.namespace}:e:a:*"))
        assert len(keys) == 3  # meta and both groups' sets (no copies: none is cached twice)
        if ttl_s == 30.0:
            assert index.backend.engines() == ["a"]
            assert index.cached_blocks("a") == 8
            assert all(0 < client.pttl(key) <= 30_000 for key in keys)
            continue
        deadline = time.monotonic() + 10
        while index.backend.engines() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert index.backend.engines() == []
        assert index.backend.cached_blocks("a") == 0
        assert index.backend.last_seq("a") is None
    client.close()


def test_two_routers_feeding_one_redis_apply_each_batch_once(redis_session, namespace, redis_index):
    first, second = (redis_index(redis_session.url, namespace) for _ in range(2))
    engine = Engine("a", SPECS)
    for n in range(3):
        admit(engine.manager, kvcore.Request(f"r{n}", list(range(100 * n, 100 * n + 12))))
        batch = engine.publish()
        first.submit("a", *batch)
        second.submit("a", *batch)
    first.flush()
    second.flush()
    assert first.stats.batches == 3
    assert (second.stats.batches, second.stats.duplicates) == (0, 3)
    assert first.cached_blocks("a") == engine.manager.block_pool.num_cached_blocks() == 18


def test_the_router_routes_by_load_while_redis_is_down_and_recovers(
    redis_server, namespace, redis_index, caplog
):
    index = redis_index(redis_server.url, namespace, socket_timeout_s=0.5)
    router = Router("prefix", index)
    engines = {name: Engine(name, SPECS, num_blocks=200) for name in ("a", "b")}
    for name in engines:
        index.heartbeat(name)
    admitted = []

    def serve(conversation: int, turn: int):
        tokens = [conversation * 1000 + t for t in range(8 * (turn + 1))]
        request = kvcore.Request(f"c{conversation}-{turn}", tokens)
        kvcore.hashing.BlockHasher(index.hash_block_size, "fast").update(request)
        fleet = [EngineLoad(engine=n, running=len(e.live)) for n, e in engines.items()]
        route = router.route(request.block_hashes, request.num_tokens, fleet)
        engine = engines[route.engine]
        blocks, hit = admit(engine.manager, request)
        assert blocks is not None
        engine.manager.free(request)
        admitted.append(request.request_id)
        batch = engine.publish()
        if batch is not None:
            index.submit(engine.name, *batch)
        return route, hit

    caplog.set_level(logging.WARNING, logger="kvcore.cluster")
    routes = [serve(1, turn) for turn in range(4)]
    assert len({route.engine for route, _ in routes}) == 1  # the conversation sticks
    assert [route.expected_hit_tokens for route, _ in routes] == [0, 8, 16, 24]
    assert [hit for _, hit in routes] == [0, 8, 16, 24]

    redis_server.stop()
    down = [serve(2, turn) for turn in range(4)]
    assert all(route.degraded for route, _ in down)
    assert router.degraded_routes == 4
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "routing by load only until the index is back" in warnings[0]
    assert "redis backend is unreachable" in warnings[0]

    redis_server.start()  # same port, empty: what it held is lost
    back = [serve(3, turn) for turn in range(3)]
    assert not any(route.degraded for route, _ in back)
    assert "reachable again" in caplog.records[-1].getMessage()
    # Batches queued during the outage were applied once Redis was back, and
    # the index follows new conversations exactly again.
    assert [route.expected_hit_tokens for route, _ in back] == [0, 8, 16]
    holder = engines[back[-1][0].engine]
    assert engine_hit(holder, [3000 + t for t in range(25)]) == 24
    assert len(admitted) == 11  # no request lost
    for name, engine in engines.items():
        assert index.cached_blocks(name) <= engine.manager.block_pool.num_cached_blocks()
