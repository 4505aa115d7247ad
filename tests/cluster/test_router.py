"""The router's policies, by hand-worked choices."""

from __future__ import annotations

import pytest
from clusterhelpers import Engine, full, layout, window

import kvcore
from kvcore.cluster import ClusterIndex, EngineLoad, Router
from kvcore.testing import admit


def loads(*specs):
    return [
        EngineLoad(engine=f"e{i}", running=r, waiting=w, pending_tokens=p, free_blocks=f)
        for i, (r, w, p, f) in enumerate(specs)
    ]


def test_round_robin_takes_engines_in_turn():
    router = Router("round_robin")
    fleet = loads((5, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0))
    assert [router.route([], 10, fleet).engine for _ in range(4)] == ["e0", "e1", "e2", "e0"]


def test_least_loaded_counts_requests_then_pending_tokens_then_free_blocks():
    router = Router("least_loaded")
    assert router.route([], 10, loads((3, 0, 0, 9), (1, 1, 0, 9), (1, 0, 50, 9))).engine == "e2"
    assert router.route([], 10, loads((1, 0, 50, 9), (1, 0, 40, 1), (2, 0, 0, 9))).engine == "e1"
    assert router.route([], 10, loads((1, 0, 5, 1), (1, 0, 5, 7))).engine == "e1"


def test_random_is_seeded_and_reaches_every_engine():
    fleet = loads(*[(0, 0, 0, 0)] * 4)
    first = [Router("random", seed=3).route([], 10, fleet).engine for _ in range(1)]
    picks = [r.engine for r in (Router("random", seed=3).route([], 10, fleet),)]
    assert first == picks
    router = Router("random", seed=3)
    assert {router.route([], 10, fleet).engine for _ in range(100)} == {"e0", "e1", "e2", "e3"}


@pytest.fixture
def holder():
    """An index where engine e1 holds a 40-token prompt (full + window 4, block 4)."""
    specs = [full(), window()]
    engine = Engine("e1", specs)
    prompt = list(range(40))
    admit(engine.manager, kvcore.Request("r", prompt))
    index = ClusterIndex(layout(specs))
    index.heartbeat("e0")
    index.submit("e1", *engine.publish())
    request = kvcore.Request("next", [*prompt, 99])
    kvcore.hashing.BlockHasher(index.hash_block_size, "fast").update(request)
    return index, request


def test_prefix_weighs_the_hit_against_the_queue_token_for_token(holder):
    index, request = holder  # 41 tokens; e1 would hit 40, e0 nothing
    router = Router("prefix", index)
    # Work ahead of the first token: e0 = 0 + 41; e1 = pending + 1.
    route = router.route(request.block_hashes, 41, loads((0, 0, 0, 9), (0, 0, 39, 9)))
    assert (route.engine, route.expected_hit_tokens) == ("e1", 40)
    route = router.route(request.block_hashes, 41, loads((0, 0, 0, 9), (0, 0, 41, 9)))
    assert (route.engine, route.expected_hit_tokens) == ("e0", 0)


def test_prefix_passes_over_an_engine_far_above_the_mean(holder):
    index, request = holder
    router = Router("prefix", index, balance_slack=1.25)
    # Mean 5 requests: the limit is 1.25 x 5 + 2 = 8.25; e1 runs 9.
    route = router.route(request.block_hashes, 41, loads((1, 0, 0, 9), (9, 0, 0, 9)))
    assert route.engine == "e0"
    # Mean 4: the limit is 7, which e1 does not exceed.
    route = router.route(request.block_hashes, 41, loads((1, 0, 0, 9), (7, 0, 0, 9)))
    assert route.engine == "e1"


def test_bad_router_options_name_the_choices():
    with pytest.raises(
        kvcore.errors.InvalidConfigError, match="router policy must be one of prefix"
    ):
        Router("sticky")
    with pytest.raises(
        kvcore.errors.InvalidConfigError, match="'prefix' router needs a cluster index"
    ):
        Router("prefix")
    with pytest.raises(kvcore.errors.InvalidConfigError, match="no engine to route to"):
        Router("round_robin").route([], 1, [])
