"""The chunked_local plugin: skipped tokens, removals, hit patterns, refused configs.

Expected values are worked out by hand from vLLM 0.14's
ChunkedLocalAttentionManager (the seed). The seed's assertions (EAGLE, block
size different from the hit alignment) are kvcore configuration errors
raised when the KV cache manager is built.
"""

from __future__ import annotations

import random

import pytest
from kvplugin_helpers import NULL, cached_pattern, chunked, full, make_manager, tokens

import kvcore
from kvcore.errors import InvalidConfigError, InvalidSpecError
from kvcore.managers import HitQuery
from kvcore.testing import admit
from kvcore_plugins.chunked_local import ChunkedLocalAttentionManager

T, F = True, False


def test_skipped_tokens_are_those_before_the_current_chunk():
    """Seed examples, chunk 8: 13 computed skip 8, 8 skip 8, 7 skip 0."""
    manager = ChunkedLocalAttentionManager(chunked(8, block_size=4), kvcore.managers.BlockPool(4))
    assert [manager.get_num_skipped_tokens(n) for n in (13, 8, 7, 0, 24)] == [8, 8, 0, 0, 24]


def test_chunk_size_must_be_a_multiple_of_the_block_size():
    with pytest.raises(
        InvalidSpecError,
        match=r"attention_chunk_size \(24\) must be a multiple of block_size \(16\)",
    ):
        chunked(24, block_size=16)


@pytest.mark.parametrize("chunk", [0, -8])
def test_chunk_size_must_be_positive(chunk):
    with pytest.raises(InvalidSpecError, match=r"attention_chunk_size must be a positive"):
        chunked(chunk, block_size=4)


_RANDOM = [random.Random(3).random() < 0.5 for _ in range(8)]


@pytest.mark.parametrize(
    ("pattern", "tail", "expected_blocks"),
    [
        ([T], 0, 1),
        ([T], 1, 1),
        ([T, F], 0, 2),
        ([T, F], 1, 2),
        ([T, T], 0, 2),
        ([T, T], 1, 2),
        ([T, T, F], 0, 2),
        ([T, T, F], 1, 2),
        ([T, T, T], 0, 3),
        ([T, T, T], 1, 3),
        ([T, T, T, F], 0, 4),
        ([T, T, T, F], 1, 4),
        ([*_RANDOM, T], 1, 9),
        ([*_RANDOM, F], 1, 8),
        ([*_RANDOM, T, T], 1, 10),
        ([*_RANDOM, T, F], 0, 10),
        ([*_RANDOM, T, F], 1, 10),
        ([*_RANDOM, F, T], 0, 10),
        ([*_RANDOM, F, T], 1, 10),
        ([*_RANDOM, F, F], 0, 10),
        ([*_RANDOM, F, F], 1, 10),
    ],
)
def test_hit_patterns(pattern, tail, expected_blocks):
    """Block size 2, chunk 4 (notes §9.5 #41); max length = blocks × 2 + tail.

    The chunk of the hit's end starts at S = (max // 4) × 4; blocks before S
    are null without lookup, then cached blocks are taken left to right up
    to max // 2 blocks. E.g. ``[T, F]`` with max 4: S = 4, two nulls, no
    block to probe: 2. 9 blocks + 1 (max 19): S = 16, eight nulls, block 8
    probed: 9 if cached, else 8. 10 blocks (max 20 or 21): S = 20, ten
    nulls, nothing probed: 10 whatever is cached.
    """
    spec = chunked(4, block_size=2)
    pool, hashes, (table,) = cached_pattern(pattern, 2)
    max_length = len(pattern) * 2 + tail
    (hit,) = ChunkedLocalAttentionManager.find_longest_cache_hit(
        HitQuery(hashes, max_length, [0], pool, spec, False, 2)
    )
    assert len(hit) == expected_blocks
    start = (max_length // 4) * 4 // 2
    assert hit[:start] == [NULL] * min(start, expected_blocks)
    assert hit[start:] == table[start:expected_blocks]


def test_remove_skipped_blocks():
    """Block size 2, chunk 4, 11 blocks (ids 1-11); notes §9.5 #43.

    n = 0 frees nothing; 4 skips 4 tokens = blocks 0-1; 6 still 4 (rest
    intact); 12 skips 12 tokens = blocks 0-5.
    """
    pool = kvcore.managers.BlockPool(20)
    manager = ChunkedLocalAttentionManager(chunked(4, block_size=2), pool)
    manager.allocate_new_blocks("r", 22)

    def after(n):
        manager.remove_skipped_blocks("r", n)
        return manager.req_to_blocks["r"]

    assert after(0) == list(range(1, 12))
    assert after(4) == [NULL, NULL, *range(3, 12)]
    assert after(6) == [NULL, NULL, *range(3, 12)]
    assert after(12) == [NULL] * 6 + list(range(7, 12))
    assert pool.free_block_ids()[-6:] == [2, 1, 6, 5, 4, 3]


def test_predictor_counts_revived_hits():
    """Block size 2, chunk 4, 40 tokens (notes §9.5 #45, with total computed 0).

    10 real free cached hits: 10 new + 10 revived = 20; 5 null + 5 real:
    10 new + 5 revived = 15.
    """
    pool, _, (table,) = cached_pattern([T] * 10, 2, free=True)
    manager = ChunkedLocalAttentionManager(chunked(4, block_size=2), pool)
    assert manager.get_num_blocks_to_allocate("a", 40, table, 0) == 20
    assert manager.get_num_blocks_to_allocate("b", 40, [NULL] * 5 + table[5:], 0) == 15


def test_a_prompt_past_a_chunk_boundary_hits_its_earlier_chunks_without_a_lookup():
    """Unitary, block 4, chunk 8, empty cache: a 17-token prompt hits 16 tokens.

    The last token (16) starts chunk 2 and sees nothing before it, so the
    first 16 tokens count as computed: four null blocks, nothing cached is
    needed and no block is taken for them; the request gets one block.
    """
    manager = make_manager([chunked(8, block_size=4)], 10)
    request = kvcore.Request("a", list(range(17)))
    hit, num_hit = manager.get_computed_blocks(request)
    assert num_hit == 16
    assert hit.blocks == ([NULL] * 4,)
    new = manager.allocate_slots(request, 1, 16, hit)
    assert new is not None
    assert manager.get_block_ids("a") == ([NULL, NULL, NULL, NULL, 1],)
    assert manager.num_free_blocks == 8


def test_llama4_like_hybrid_hit():
    """Full attention + chunked local (chunk 8), block 4, pool 30.

    A 20-token prompt is cached in both groups (5 blocks each: full 1-5,
    chunked 6-10). The same 20 tokens + 3: max 22; full hits 5 blocks (20);
    chunked at 20: S = 16, four nulls, block 4 (id 10) cached: 20. After
    evicting the chunked group's block 4, chunked gives 16 and full is cut
    to 4 blocks.
    """
    manager = make_manager([full(4), chunked(8, block_size=4)], 30)
    prompt = tokens((5, 12), (6, 8))
    admit(manager, kvcore.Request("a", prompt))
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    b = kvcore.Request("b", [*prompt, 1, 2, 3])
    hit, num_hit = manager.get_computed_blocks(b)
    assert (num_hit, hit.blocks) == (20, ([1, 2, 3, 4, 5], [NULL] * 4 + [10]))
    manager.evict_blocks([10])
    hit, num_hit = manager.get_computed_blocks(b)
    assert (num_hit, hit.blocks) == (16, ([1, 2, 3, 4], [NULL] * 4))


# -- refused configurations ------------------------------------------------------------------


def test_eagle_with_prefix_caching_is_refused_when_the_manager_is_built():
    with pytest.raises(
        InvalidConfigError,
        match=r"ChunkedLocalAttentionManager does not support EAGLE with prefix caching.*"
        r"use_eagle=False or enable_caching=False",
    ):
        make_manager([full(16), chunked(64)], 20, use_eagle=True)


def test_eagle_without_prefix_caching_is_accepted():
    """Without caching there is no hit search, so EAGLE's drop never applies."""
    manager = make_manager([full(16), chunked(64)], 20, use_eagle=True, enable_caching=False)
    admit(manager, kvcore.Request("a", list(range(40))))
    assert manager.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])


@pytest.mark.parametrize(
    ("other", "chunk_block", "accepted"),
    [
        (full(16), 16, True),
        (full(16), 32, True),  # lcm(16, 32) = 32: hits land on its own blocks
        (full(16), 8, False),  # lcm 16: a chunked hit of 8 tokens could not align
        (full(32), 16, False),
    ],
)
def test_a_hit_alignment_other_than_the_block_size_is_refused(other, chunk_block, accepted):
    """The chunked hit search does not align: groups whose lcm differs are refused."""
    specs = [other, chunked(64, block_size=chunk_block)]
    if accepted:
        make_manager(specs, 20)
        return
    with pytest.raises(
        InvalidConfigError,
        match=rf"aligned to its own block size \({chunk_block} tokens\).*align hits to "
        rf"{max(other.block_size, chunk_block)} tokens",
    ):
        make_manager(specs, 20)
    make_manager(specs, 20, enable_caching=False)  # no hit search, no alignment needed
