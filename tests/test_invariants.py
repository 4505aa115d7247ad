"""Randomized admit/allocate/decode/free/preempt runs, invariants checked after every op."""

from __future__ import annotations

import pytest

import kvcore
from kvcore.testing import RandomWorkload, admit, check_manager_invariants
from kvcore_plugins.full_attention import FullAttentionSpec


def make(registry, num_blocks, block_size, **kwargs):
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=4, dtype="float16")
    config = kvcore.KVCacheConfig.from_specs(num_blocks, [spec])
    return kvcore.KVCacheManager(config, 512, registry=registry, **kwargs)


@pytest.mark.parametrize(
    ("num_blocks", "block_size", "options", "seed"),
    [
        (40, 4, {}, 1),
        (25, 8, {}, 2),
        (30, 16, {}, 3),
        (40, 4, {"use_eagle": True}, 4),
        (40, 4, {"enable_caching": False}, 5),
        (80, 2, {"hash_algorithm": "fast"}, 6),
    ],
)
def test_random_workload_keeps_every_invariant(registry, num_blocks, block_size, options, seed):
    manager = make(registry, num_blocks, block_size, **options)
    workload = RandomWorkload(manager, seed=seed, max_running=6)
    stats = workload.run(3000)
    # The run must have exercised every path it is meant to check.
    assert stats.admitted > 100
    assert stats.decodes > 600
    assert stats.refused_admissions + stats.refused_decodes > 10
    assert stats.preemptions > 10
    assert stats.finished > 20
    assert stats.resets > 0
    if options.get("enable_caching", True):
        assert stats.hit_tokens > 0
    else:
        assert stats.hit_tokens == 0


def test_the_invariant_checker_catches_a_leak(registry):
    manager = make(registry, 20, 4)
    admit(manager, kvcore.Request("r", list(range(10))))
    check_manager_invariants(manager)
    table = manager.coordinator.managers[0].req_to_blocks["r"]
    manager.block_pool._ref[table[0]] += 1
    with pytest.raises(AssertionError, match="ref count 2 but held by 1 tables"):
        check_manager_invariants(manager)
    manager.block_pool._ref[table[0]] -= 1
    table.append(manager.block_pool.get_new_blocks(1)[0])
    check_manager_invariants(manager)  # the table holds the reference it took
    manager.block_pool.get_new_blocks(1)  # taken, but no table holds it
    with pytest.raises(AssertionError, match="ref count 1 but held by 0 tables"):
        check_manager_invariants(manager)
