"""Full-attention prefix caching through KVCacheManager (vllm-notes §9.3).

Expected values follow vLLM 0.14 (the seeds): every block whose reference count
drops to 0 is appended to the free queue's tail, a request's blocks last first.
Where the notes give the newer order (unhashed blocks prepended), the 0.14
order is derived here instead.
"""

from __future__ import annotations

import kvcore
from kvcore import Request
from kvcore.testing import admit

PREFIX = [0] * 16 + [1] * 16 + [2] * 16  # three full blocks of 16


def test_prefill_sharing_free_order_and_revival(make_manager):
    manager = make_manager(num_blocks=11)
    pool = manager.block_pool
    req0 = Request("0", PREFIX + [3] * 7)
    blocks, num_hit = admit(manager, req0)
    assert num_hit == 0
    assert blocks.get_block_ids() == ([1, 2, 3, 4],)
    hashes = req0.block_hashes
    assert [pool.block_hash(b) for b in (1, 2, 3)] == hashes[:3]
    assert pool.block_hash(4) is None
    assert [pool.ref_count(b) for b in (1, 2, 3, 4)] == [1, 1, 1, 1]

    req1 = Request("1", PREFIX + [3] * 5)
    hit, num_hit = manager.get_computed_blocks(req1)
    assert (hit.get_block_ids(), num_hit) == (([1, 2, 3],), 48)
    new = manager.allocate_slots(req1, 5, num_hit, hit)
    assert new.get_block_ids() == ([5],)
    assert [pool.ref_count(b) for b in (1, 2, 3)] == [2, 2, 2]
    assert manager.num_free_blocks == 5

    manager.free(req0)
    manager.free(req1)
    assert manager.num_free_blocks == 10
    # req0 frees 4 (the only block reaching 0), req1 frees 5, 3, 2, 1.
    assert pool.free_block_ids() == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]

    req2 = Request("2", PREFIX + [3] * 6)
    blocks, num_hit = admit(manager, req2)
    assert num_hit == 48
    assert blocks.get_block_ids() == ([6],)
    assert manager.get_block_ids("2") == ([1, 2, 3, 6],)
    assert manager.num_free_blocks == 6

    manager.free(req2)
    req3 = Request("3", [99] * 160)
    blocks, num_hit = admit(manager, req3)
    assert num_hit == 0
    assert blocks.get_block_ids() == ([7, 8, 9, 10, 4, 5, 6, 3, 2, 1],)
    assert manager.num_free_blocks == 0
    pool.check_invariants()


def test_decode_caches_a_block_when_it_fills(make_manager):
    manager = make_manager(num_blocks=11)
    pool = manager.block_pool
    req = Request("0", PREFIX + [3] * 7)
    admit(manager, req)
    req.append_output_token_ids([8] * 4)
    assert manager.allocate_slots(req, 4).get_block_ids() == ([],)
    req.num_computed_tokens += 4
    assert pool.block_hash(4) is None
    req.append_output_token_ids([8] * 19)
    assert req.num_tokens == 78
    new = manager.allocate_slots(req, 19)
    assert new.get_block_ids() == ([5],)
    assert pool.block_hash(4) == req.block_hashes[3]
    assert pool.block_hash(5) is None


def test_eviction_order_and_hit_on_the_oldest_prefix(make_manager):
    manager = make_manager(num_blocks=11)
    pool = manager.block_pool
    req0 = Request("0", list(range(87)))
    req1 = Request("1", list(range(87, 87 + 48)))
    assert admit(manager, req0)[0].get_block_ids() == ([1, 2, 3, 4, 5, 6],)
    assert admit(manager, req1)[0].get_block_ids() == ([7, 8, 9],)
    assert manager.num_free_blocks == 1
    manager.free(req0)
    assert pool.free_block_ids() == [10, 6, 5, 4, 3, 2, 1]
    manager.free(req1)
    assert pool.free_block_ids() == [10, 6, 5, 4, 3, 2, 1, 9, 8, 7]

    req2 = Request("2", list(range(35)))
    blocks, num_hit = admit(manager, req2)
    assert num_hit == 32
    assert manager.get_block_ids("2") == ([1, 2, 10],)
    assert blocks.get_block_ids() == ([10],)
    assert manager.num_free_blocks == 7


def test_a_hit_is_not_evicted_by_its_own_allocation(make_manager):
    manager = make_manager(num_blocks=3)
    pool = manager.block_pool
    a, b = [1] * 16, [2] * 16
    req0, req1 = Request("0", a), Request("1", b)
    admit(manager, req0)
    admit(manager, req1)
    manager.free(req0)
    manager.free(req1)
    req2 = Request("2", a + b)
    blocks, num_hit = admit(manager, req2)
    assert num_hit == 16
    assert manager.get_block_ids("2") == ([1, 2],)
    # Block 2 was req1's cached block; it is evicted to make room.
    assert blocks.get_block_ids() == ([2],)
    assert pool.get_cached_block(req1.block_hashes[0], [0]) is None
    assert pool.block_hash(2) == req2.block_hashes[1]


def test_caching_disabled_never_hits(make_manager):
    manager = make_manager(num_blocks=5, block_size=4, enable_caching=False)
    req1 = Request("1", list(range(10)))
    assert admit(manager, req1)[1] == 0
    assert manager.get_block_ids("1") == ([1, 2, 3],)
    manager.free(req1)
    req2 = Request("2", list(range(16)))
    blocks, num_hit = admit(manager, req2)
    assert num_hit == 0
    assert len(blocks.blocks[0]) == 4
    assert manager.block_pool.num_cached_blocks() == 0
    req3 = Request("3", list(range(4)))
    hit, num_hit = manager.get_computed_blocks(req3)
    assert num_hit == 0
    assert manager.allocate_slots(req3, 4) is None


def test_refused_allocation_changes_nothing(make_manager):
    manager = make_manager(num_blocks=11)
    pool = manager.block_pool
    req0 = Request("0", PREFIX)
    admit(manager, req0)
    req1 = Request("1", PREFIX * 2)
    blocks, num_hit = admit(manager, req1)
    assert num_hit == 48
    assert blocks.get_block_ids() == ([4, 5, 6],)
    manager.free(req1)
    req2 = Request("2", [7] * 32)
    assert admit(manager, req2)[0].get_block_ids() == ([7, 8],)
    assert manager.num_free_blocks == 5

    req3 = Request("3", PREFIX * 3)
    hit, num_hit = manager.get_computed_blocks(req3)
    assert (hit.get_block_ids(), num_hit) == (([1, 2, 3, 4, 5, 6],), 96)
    refs = [pool.ref_count(b) for b in range(11)]
    order = pool.free_block_ids()
    # 3 new blocks + 3 free cached hit blocks to revive = 6 > 5 free.
    assert manager.allocate_slots(req3, 48, num_hit, hit) is None
    assert [pool.ref_count(b) for b in range(11)] == refs
    assert [pool.ref_count(b) for b in (1, 2, 3, 4, 5, 6)] == [1, 1, 1, 0, 0, 0]
    assert pool.free_block_ids() == order
    assert manager.get_block_ids("3") == ([],)
    pool.check_invariants()


def test_skip_reading_prefix_cache_still_writes(make_manager):
    manager = make_manager(num_blocks=11)
    pool = manager.block_pool
    req0 = Request("0", PREFIX + [3] * 7, skip_reading_prefix_cache=True)
    assert admit(manager, req0)[0].get_block_ids() == ([1, 2, 3, 4],)
    req1 = Request("1", PREFIX + [3] * 5)
    blocks, num_hit = admit(manager, req1)
    assert num_hit == 48
    manager.free(req0)
    manager.free(req1)
    req2 = Request("2", PREFIX + [3] * 6, skip_reading_prefix_cache=True)
    blocks, num_hit = admit(manager, req2)
    assert num_hit == 0
    assert blocks.get_block_ids() == ([6, 7, 8, 9],)
    assert [pool.ref_count(b) for b in (6, 7, 8, 9)] == [1, 1, 1, 1]
    # Its full blocks are cached again, as duplicates: the first copy still wins.
    assert pool.block_hash(6) == pool.block_hash(1) == req0.block_hashes[0]
    assert pool.get_cached_block(req2.block_hashes[0], [0]) == [1]


def test_lookahead_slots(make_manager):
    manager = make_manager(num_blocks=11, block_size=4)
    req = Request("0", [1, 2, 3])
    assert len(manager.allocate_slots(req, 3, num_lookahead_tokens=2).blocks[0]) == 2
    other = Request("1", [4, 5, 6])
    assert len(manager.allocate_slots(other, 3, num_lookahead_tokens=4).blocks[0]) == 2
    # Lookahead past max_model_len is capped: 3 + 9 slots, but the model ends at 8.
    capped = make_manager(num_blocks=11, block_size=4, max_model_len=8)
    assert (
        len(capped.allocate_slots(Request("2", [1, 2, 3]), 3, num_lookahead_tokens=9).blocks[0])
        == 2
    )


def test_eagle_drops_the_last_hit_block(make_manager):
    manager = make_manager(num_blocks=11, use_eagle=True)
    admit(manager, Request("0", PREFIX))
    # Max hit 47 tokens; EAGLE looks one block past (48: the request's 3 full
    # blocks), all cached, and drops the last -> 2 blocks, 32 tokens.
    hit, num_hit = manager.get_computed_blocks(Request("1", PREFIX))
    assert (hit.get_block_ids(), num_hit) == (([1, 2],), 32)
    hit, num_hit = manager.get_computed_blocks(Request("2", PREFIX[:37]))
    assert (hit.get_block_ids(), num_hit) == (([1],), 16)
    assert manager.get_computed_blocks(Request("3", PREFIX[:20]))[1] == 0


def test_salt_and_lora_isolate_cached_blocks(make_manager):
    manager = make_manager(num_blocks=20)
    tail = [5] * 11
    admit(manager, Request("0", PREFIX + tail, cache_salt="salt1"))
    assert manager.get_computed_blocks(Request("1", PREFIX + [6] * 3, cache_salt="salt1"))[1] == 48
    assert manager.get_computed_blocks(Request("2", PREFIX + [6] * 3, cache_salt="salt2"))[1] == 0
    assert manager.get_computed_blocks(Request("3", PREFIX + [6] * 3))[1] == 0
    admit(manager, Request("4", PREFIX + tail, lora_name="adapter-a"))
    assert manager.get_computed_blocks(Request("5", PREFIX + [6], lora_name="adapter-a"))[1] == 48
    assert manager.get_computed_blocks(Request("6", PREFIX + [6], lora_name="adapter-b"))[1] == 0


def test_multimodal_inputs_are_part_of_the_hit(make_manager):
    manager = make_manager(num_blocks=20)
    image = [kvcore.MultiModalFeature(identifier="img-1", offset=20, length=8)]
    other_image = [kvcore.MultiModalFeature(identifier="img-2", offset=20, length=8)]
    admit(manager, Request("0", PREFIX + [4] * 10, mm_features=image))
    assert manager.get_computed_blocks(Request("1", PREFIX + [5], mm_features=image))[1] == 48
    # Block 0 has no image, so it still hits; block 1 carries another image.
    assert manager.get_computed_blocks(Request("2", PREFIX + [5], mm_features=other_image))[1] == 16


def test_common_prefix_blocks_count_blocks_held_by_every_request(make_manager):
    manager = make_manager(num_blocks=20)
    admit(manager, Request("0", PREFIX + [3] * 7))
    admit(manager, Request("1", PREFIX[:32] + [4] * 20))
    assert manager.get_num_common_prefix_blocks("0") == [2]
    admit(manager, Request("2", [9] * 20))
    assert manager.get_num_common_prefix_blocks("0") == [0]


def test_reset_prefix_cache_needs_every_block_free(make_manager):
    manager = make_manager(num_blocks=11)
    req0 = Request("0", PREFIX + [3] * 7)
    admit(manager, req0)
    req1 = Request("1", PREFIX + [3] * 2)
    admit(manager, req1)
    assert manager.reset_prefix_cache() is False
    assert manager.block_pool.num_cached_blocks() == 3
    manager.free(req0)
    manager.free(req1)
    assert manager.reset_prefix_cache() is True
    assert manager.block_pool.num_cached_blocks() == 0
    assert manager.get_computed_blocks(Request("2", PREFIX + [1]))[1] == 0
    assert manager.make_prefix_cache_stats().reset is True


def test_prefix_cache_stats(make_manager):
    manager = make_manager(num_blocks=20)
    admit(manager, Request("0", PREFIX + [3] * 7))  # 55 tokens, a miss
    fresh = Request("2", PREFIX + [1])  # 49 tokens: 3 blocks of 16 hit
    assert manager.get_computed_blocks(fresh)[1] == 48
    preempted = Request("1", PREFIX + [1, 2])
    preempted.num_preemptions = 1
    manager.get_computed_blocks(preempted)
    stats = manager.make_prefix_cache_stats()
    # As vLLM 0.14's PrefixCacheStats.record: a resumed request's lookup is
    # counted only in the preempted_* fields, never in the hit rate.
    assert (stats.requests, stats.queries, stats.hits) == (2, 55 + 49, 48)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 50, 48)
    assert stats.hit_rate == 48 / 104
    assert manager.make_prefix_cache_stats().requests == 0


def test_block_table_array_pads_with_the_null_block(make_manager):
    manager = make_manager(num_blocks=20)
    admit(manager, Request("0", PREFIX + [3] * 7))
    admit(manager, Request("1", [5] * 20))
    table = manager.block_table(["0", "1"])
    assert table.dtype.name == "int32"
    assert table.tolist() == [[1, 2, 3, 4], [5, 6, 0, 0]]
    assert manager.block_table(["1"], width=3).tolist() == [[5, 6, 0]]


def test_kv_cache_blocks_helpers():
    blocks = kvcore.KVCacheBlocks(([1, 2], [3]))
    assert (blocks + kvcore.KVCacheBlocks(([4], []))).get_block_ids() == ([1, 2, 4], [3])
    assert blocks.new_empty().get_block_ids(allow_none=True) is None
    assert blocks.get_block_ids(allow_none=True) == ([1, 2], [3])
    assert len(blocks) == 2
    assert blocks == kvcore.KVCacheBlocks(((1, 2), (3,)))


def test_three_copies_of_a_prefix_the_oldest_waiting_copy_is_hit_next(make_manager):
    """Three requests that never read the cache compute the same two blocks.

    Worked by hand (block size 4, 9 blocks and the null block): a, b, c get
    blocks 1-3, 4-6, 7-9; blocks 1, 4, 7 carry the first block's hash and 2,
    5, 8 the second's, cached in that order. A reader hits a's copies. Freeing
    a queues 3, 2, 1 (last first); a 12-token request takes them, evicting 2
    and 1: b's copies, the oldest waiting ones, are hit next (not c's). Then
    freeing b queues 6, 5, 4 and an 8-token request takes 6 and 5: the second
    block's last copy, c's 8, is hit, next to b's 4.
    """
    manager = make_manager(num_blocks=10, block_size=4)
    prompt = [5] * 4 + [6] * 4 + [7]
    writers = [Request(name, prompt, skip_reading_prefix_cache=True) for name in "abc"]
    tables = [admit(manager, request)[0].get_block_ids() for request in writers]
    assert tables == [([1, 2, 3],), ([4, 5, 6],), ([7, 8, 9],)]
    h0, h1 = writers[0].block_hashes[:2]
    pool = manager.block_pool
    assert (pool.cached_blocks(h0, 0), pool.cached_blocks(h1, 0)) == ([1, 4, 7], [2, 5, 8])

    def reader_hit() -> tuple[object, int]:
        hit, num_hit = manager.get_computed_blocks(Request("reader", prompt))
        return hit.get_block_ids(), num_hit

    assert reader_hit() == (([1, 2],), 8)
    manager.free(writers[0])
    assert pool.free_block_ids() == [3, 2, 1]
    assert admit(manager, Request("d", [99] * 12))[0].get_block_ids() == ([3, 2, 1],)
    assert reader_hit() == (([4, 5],), 8)
    manager.free(writers[1])
    assert pool.free_block_ids() == [6, 5, 4]
    assert admit(manager, Request("e", [98] * 8))[0].get_block_ids() == ([6, 5],)
    assert reader_hit() == (([4, 8],), 8)
    assert (pool.cached_blocks(h0, 0), pool.cached_blocks(h1, 0)) == ([4, 7], [8])
    pool.check_invariants()
