"""Randomized admit/allocate/decode/free/preempt runs, invariants checked after every op."""

from __future__ import annotations

import pytest

import kvcore
from kvcore.errors import InvalidConfigError
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


def test_the_random_workload_loads_external_tokens_at_admission_only(registry):
    """As a KV connector's: on a request holding no blocks, past its hit, one token left."""
    manager = make(registry, 40, 4)
    calls = []
    allocate_slots = manager.allocate_slots

    def spy(request, num_new_tokens, num_new_computed_tokens=0, *args, **kwargs):
        external = kwargs.get("num_external_computed_tokens", 0)
        holds = manager.get_block_ids(request.request_id) != ([],)
        calls.append((external, holds, num_new_computed_tokens, num_new_tokens, request.num_tokens))
        return allocate_slots(request, num_new_tokens, num_new_computed_tokens, *args, **kwargs)

    manager.allocate_slots = spy
    stats = RandomWorkload(manager, seed=8).run(1500)
    loads = [call for call in calls if call[0]]
    assert len(loads) > 20
    assert stats.external_tokens > 0
    for external, holds, num_hit, num_new, num_tokens in loads:
        assert not holds
        assert num_new >= 1
        assert num_hit + external + num_new <= num_tokens


def test_the_random_workload_is_reproducible_with_external_tokens(registry):
    def run(seed, **options):
        manager = make(registry, 40, 4)
        stats = RandomWorkload(manager, seed=seed, **options).run(1000)
        return stats, manager.block_pool.free_block_ids()

    assert run(3) == run(3)
    assert run(3) != run(4)
    assert run(3)[0].external_tokens > 0
    assert run(3, external_rate=0)[0].external_tokens == 0


@pytest.mark.parametrize("rate", [-0.1, 1.5])
def test_the_random_workload_refuses_an_external_rate_outside_0_to_1(registry, rate):
    with pytest.raises(InvalidConfigError, match="external_rate must be between 0 and 1"):
        RandomWorkload(make(registry, 10, 4), external_rate=rate)


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


# -- what the checker must catch (each corruption made by hand) ---------------------------


def make_hybrid(registry_all, num_blocks=30):
    from kvcore_plugins.sliding_window import SlidingWindowSpec

    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=4, dtype="float16")
    window = SlidingWindowSpec(
        block_size=4, num_kv_heads=1, head_size=4, dtype="float16", sliding_window=8
    )
    config = kvcore.KVCacheConfig.from_specs(num_blocks, [full, window])
    return kvcore.KVCacheManager(config, 512, registry=registry_all)


@pytest.fixture(scope="module")
def registry_all():
    return kvcore.load_registry(only=["full_attention", "sliding_window"])


def test_the_checker_catches_a_block_in_two_groups(registry_all):
    """The shape of the shared-block defect: reference counts agree, the groups collide."""
    manager = make_hybrid(registry_all)
    admit(manager, kvcore.Request("r", list(range(10))))
    full_table, window_table = (g.req_to_blocks["r"] for g in manager.coordinator.managers)
    assert (full_table, window_table) == ([1, 2, 3], [4, 5, 6])
    check_manager_invariants(manager)
    stolen = full_table[0]
    window_table.append(stolen)
    manager.block_pool._ref[stolen] += 1  # counted: only the groups disagree
    with pytest.raises(AssertionError, match=r"block 1 is in the tables of groups 0 and 1"):
        check_manager_invariants(manager)


def test_the_checker_catches_a_table_entry_its_reference_count_does_not_count(registry):
    manager = make(registry, 20, 4)
    admit(manager, kvcore.Request("a", list(range(12))))
    admit(manager, kvcore.Request("b", list(range(100, 112))))
    group = manager.coordinator.managers[0]
    group.req_to_blocks["b"][0] = group.req_to_blocks["a"][0]  # a shared block counted once
    manager.block_pool.free_blocks([4])  # b's old block goes back, as it would
    with pytest.raises(AssertionError, match=r"block 1: ref count 1 but held by 2 tables"):
        check_manager_invariants(manager)


def test_the_checker_catches_a_block_cached_under_another_positions_hash(registry):
    manager = make(registry, 20, 4)
    admit(manager, kvcore.Request("a", list(range(12))))
    pool = manager.block_pool
    table = manager.coordinator.managers[0].req_to_blocks["a"]
    first, second = table[0], table[1]
    # Swap the two blocks' hashes everywhere: the pool alone stays consistent.
    h1, h2 = pool._hash[first], pool._hash[second]
    pool._hash[first], pool._hash[second] = h2, h1
    pool._cached[0][h1], pool._cached[0][h2] = second, first
    pool.check_invariants()
    with pytest.raises(
        AssertionError,
        match=r"group 0: block 1 at position 0 of request 'a' is cached under the hash of "
        r"another position",
    ):
        check_manager_invariants(manager)


def test_the_checker_catches_a_free_count_out_of_step_with_the_queue(registry):
    manager = make(registry, 20, 4)
    admit(manager, kvcore.Request("a", list(range(12))))
    manager.block_pool._num_free += 1
    with pytest.raises(AssertionError, match=r"free count 17 but 16 blocks in the free queue"):
        check_manager_invariants(manager)


def test_the_checker_catches_a_block_listed_twice_in_the_free_queue(registry):
    """A lost stale count makes an old entry of a free block count as live (the Python queue)."""
    manager = make(registry, 8, 4, backend="python")
    request = kvcore.Request("a", list(range(28)))
    admit(manager, request)
    manager.free(request)  # the queue is now 7, 6, 5, 4, 3, 2, 1 (none fresh)
    queue = manager.block_pool._queue
    queue._queue.append(5)  # a second entry of 5, not counted as stale
    with pytest.raises(AssertionError, match=r"the free queue lists block 5 twice"):
        check_manager_invariants(manager)
