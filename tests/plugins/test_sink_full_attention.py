"""The sink_full_attention plugin: full attention plus sink blocks reserved once.

The seed (vLLM 0.14) pops ``sink_len // block_size`` blocks off the free
queue when the manager is built; kvcore reserves them through the pool so
they are never freed, cached or evicted, and counts them in sizing.
"""

from __future__ import annotations

import pytest
from kvplugin_helpers import full, make_manager, sink, tokens

import kvcore
from kvcore.errors import InvalidConfigError, InvalidSpecError
from kvcore.testing import admit, check_manager_invariants


def test_sink_blocks_are_reserved_when_the_manager_is_built():
    """sink_len 32, block 16: blocks 1 and 2 (head of a fresh queue) are reserved.

    Of the 9 usable blocks of a 10-block pool 7 remain; the first request
    gets blocks 3-5 and behaves as full attention (an identical prompt hits
    its two full blocks).
    """
    manager = make_manager([sink(32, 16)], 10)
    assert manager.coordinator.managers[0].sink_blocks == [1, 2]
    assert manager.block_pool.num_reserved_blocks == 2
    assert manager.num_free_blocks == 7
    prompt = tokens((4, 16), (5, 16), (6, 3))
    admit(manager, kvcore.Request("a", prompt))
    assert manager.get_block_ids("a") == ([3, 4, 5],)
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("b", prompt))
    assert (num_hit, hit.blocks) == (32, ([3, 4],))
    check_manager_invariants(manager)


def test_sink_blocks_survive_frees_and_resets():
    manager = make_manager([sink(16, 16)], 6)
    a = kvcore.Request("a", list(range(40)))
    admit(manager, a)
    manager.free(a)
    assert manager.reset_prefix_cache()
    assert manager.num_free_blocks == 4
    assert 1 not in manager.block_pool.free_block_ids()
    check_manager_invariants(manager)


def test_the_sink_is_counted_in_the_pool_reservation():
    assert sink(64, 16).pool_reserved_blocks == 4
    assert full(16).pool_reserved_blocks == 0


def test_two_sink_groups_reserve_their_own_blocks():
    manager = make_manager([full(16), sink(32, 16)], 10)
    assert manager.coordinator.managers[1].sink_blocks == [1, 2]
    assert manager.num_free_blocks == 7


def test_a_pool_too_small_for_the_sinks_is_refused():
    with pytest.raises(
        InvalidConfigError,
        match=r"sink_len=64 needs 4 reserved blocks of 16 tokens, but the pool has only 3 "
        r"free; raise KVCacheConfig\.num_blocks",
    ):
        make_manager([sink(64, 16)], 4)


@pytest.mark.parametrize(
    ("sink_len", "match"),
    [
        (24, r"sink_len \(24\) must be a multiple of block_size \(16\)"),
        (0, r"SinkFullAttentionSpec\.sink_len must be a positive integer"),
    ],
)
def test_sink_len_must_fill_whole_blocks(sink_len, match):
    with pytest.raises(InvalidSpecError, match=match):
        sink(sink_len, 16)
