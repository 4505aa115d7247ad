"""KV cache events (vllm-notes §9.4)."""

from __future__ import annotations

import pytest

import kvcore
from kvcore import Request
from kvcore.events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcore.managers import BlockPool
from kvcore.testing import admit


@pytest.mark.parametrize("num_full_blocks", [2, 3, 10])
def test_store_remove_and_clear(make_manager, num_full_blocks):
    manager = make_manager(num_blocks=num_full_blocks + 1, enable_kv_cache_events=True)
    tokens = list(range(16 * num_full_blocks))
    first = Request("0", tokens)
    admit(manager, first)
    events = manager.take_events()
    stored = events[-1]
    assert isinstance(stored, BlockStored)
    assert list(stored.block_hashes) == first.block_hashes
    assert stored.parent_block_hash is None
    assert list(stored.token_ids) == tokens
    assert (stored.block_size, stored.group_idx, stored.kind) == (16, 0, "full_attention")
    assert manager.take_events() == []

    manager.free(first)
    # The same tokens allocated without a lookup: every cached block is evicted
    # (one BlockRemoved each), then the new blocks are stored.
    second = Request("1", tokens)
    manager.allocate_slots(second, len(tokens))
    events = manager.take_events()
    assert len(events) == num_full_blocks + 1
    removed, last = events[:-1], events[-1]
    assert all(isinstance(e, BlockRemoved) for e in removed)
    assert {e.block_hashes[0] for e in removed} == set(first.block_hashes)
    assert isinstance(last, BlockStored)
    assert len(last.block_hashes) == num_full_blocks

    manager.free(second)
    assert manager.reset_prefix_cache()
    assert manager.take_events()[-1] == AllBlocksCleared()
    assert manager.block_pool.num_cached_blocks() == 0


def test_stored_event_names_the_logical_parent_even_after_a_null_block():
    # Scenario 35: block size 1, tokens [10, 11, 12, 13], table [b, NULL, b', b''].
    pool = BlockPool(5, enable_kv_cache_events=True)
    request = Request("r", [10, 11, 12, 13])
    kvcore.hashing.BlockHasher(1).update(request)
    b, b2, b3 = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, [b, 0, b2, b3], 2, 4, 1, 0)
    (event,) = pool.take_events()
    assert list(event.block_hashes) == request.block_hashes[2:4]
    assert event.parent_block_hash == request.block_hashes[1]
    assert list(event.token_ids) == [12, 13]
    assert (event.group_idx, event.kind) == (0, None)
    assert pool.block_hash(0) is None


def test_stored_event_reports_the_lora_adapter(make_manager):
    manager = make_manager(num_blocks=10, enable_kv_cache_events=True)
    admit(manager, Request("0", list(range(40)), lora_name="test_lora", lora_id=42))
    event = manager.take_events()[-1]
    assert (event.lora_id, event.lora_name, event.block_size) == (42, "test_lora", 16)
    admit(manager, Request("1", list(range(100, 140))))
    event = manager.take_events()[-1]
    assert (event.lora_id, event.lora_name) == (None, None)


@pytest.mark.parametrize("group", [0, 1, 2])
def test_removed_events_carry_the_group(group):
    # Scenario 38: 5 blocks; take 4; cache 2 in group g; free all; take 4 again.
    pool = BlockPool(
        5,
        num_groups=3,
        enable_kv_cache_events=True,
        group_kinds=["full_attention", "sliding_window", "mamba"],
    )
    request = Request("r", list(range(8)))
    kvcore.hashing.BlockHasher(4).update(request)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, group)
    stored = pool.take_events()[-1]
    assert (stored.group_idx, stored.kind) == (
        group,
        ["full_attention", "sliding_window", "mamba"][group],
    )
    pool.free_blocks(blocks[::-1])
    pool.get_new_blocks(4)
    removed = pool.take_events()
    assert len(removed) == 2
    assert all(isinstance(e, BlockRemoved) and e.group_idx == group for e in removed)


def test_events_are_off_by_default(make_manager):
    manager = make_manager(num_blocks=10)
    admit(manager, Request("0", list(range(40))))
    assert manager.take_events() == []
