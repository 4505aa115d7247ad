"""The sliding_window plugin: skipped tokens, removals, hit search (jump vs plain), predictor.

Expected values are worked out by hand from vLLM 0.14's SlidingWindowManager
(the seed); scenarios of vllm-notes §9.5 that depend on newer behaviour
(caching masks, retention intervals, admission caps, fine-grained hash units)
are left out because the seed caches every full block and has none of them.
"""

from __future__ import annotations

import random

import pytest
from kvplugin_helpers import NULL, cached_pattern, make_manager, sw, tokens

import kvcore
from kvcore.errors import InvalidSpecError
from kvcore.managers import BlockHashView, HitQuery
from kvcore.testing import admit
from kvcore_plugins.sliding_window import SlidingWindowManager, contiguous_blocks_needed
from kvcore_plugins.sliding_window.spec import SlidingWindowSpec

T, F = True, False


def plain_scan(hashes, max_length, group_ids, pool, spec, use_eagle, alignment):
    """Reference: the seed's right-to-left scan, probing every block (no jumps).

    With EAGLE the run's right edge is checked for alignment after the drop
    (the seed asserts block size == alignment under EAGLE; this is the
    generalisation kvcore implements, identical whenever the seed applies).
    The run it looks for is the seed's: the blocks holding the window's
    ``sliding_window - 1`` earlier tokens, ``cdiv(sliding_window - 1,
    block_size)``, one more with EAGLE (its last block is dropped). A run of 0
    (window 1) still ends at a cached block, as a run of 1 does.
    Returns the per-group lists and the number of cache probes.
    """
    bs = spec.block_size
    needed = -(-(spec.sliding_window - 1) // bs) + (1 if use_eagle else 0)
    max_blocks = max_length // bs
    out = [[NULL] * max_blocks for _ in group_ids]
    count = 0
    probes = 0
    found = False
    for i in range(max_blocks - 1, -1, -1):
        probes += 1
        blocks = pool.get_cached_block(hashes[i], group_ids)
        if blocks is None:
            count = 0
            continue
        edge = i if use_eagle else i + 1
        if count == 0 and bs != alignment and (edge * bs) % alignment:
            continue
        for lst, block in zip(out, blocks, strict=True):
            lst[i] = block
        count += 1
        if count >= needed:
            keep = i + count
            found = True
            break
    if not found:
        keep = count
    if use_eagle and keep:
        keep -= 1
    while keep and (keep * bs) % alignment:
        keep -= 1
    return tuple(lst[:keep] for lst in out), probes


class CountingPool:
    """Forwards lookups to a pool and counts them."""

    def __init__(self, pool):
        self.pool = pool
        self.probes = 0

    def get_cached_block(self, block_hash, group_ids):
        self.probes += 1
        return self.pool.get_cached_block(block_hash, group_ids)


def jump(hashes, max_length, group_ids, pool, spec, use_eagle, alignment):
    counting = CountingPool(pool)
    result = SlidingWindowManager.find_longest_cache_hit(
        HitQuery(hashes, max_length, group_ids, counting, spec, use_eagle, alignment)
    )
    return result, counting.probes


# -- validation --------------------------------------------------------------------------


@pytest.mark.parametrize("window", [0, -4, 2.5, None])
def test_window_below_one_is_refused_naming_the_field(window):
    with pytest.raises(InvalidSpecError, match=r"SlidingWindowSpec\.sliding_window must be"):
        SlidingWindowSpec(
            block_size=16, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=window
        )


def test_skipped_tokens_are_those_before_the_next_tokens_window():
    """Seed example: window 4 after 7 computed tokens skips 4 (tokens 0-3)."""
    manager = SlidingWindowManager(sw(4, block_size=2), kvcore.managers.BlockPool(4))
    assert [manager.get_num_skipped_tokens(n) for n in (0, 3, 4, 7, 11)] == [0, 0, 1, 4, 8]


@pytest.mark.parametrize(
    ("window", "block_size", "use_eagle", "needed"),
    [
        # The window - 1 tokens before the current one, in blocks, rounded up.
        (4, 2, False, 2),  # 3 tokens: 2 blocks
        (4, 2, True, 3),  # and one more for EAGLE to drop
        (33, 16, False, 2),  # 32 tokens: exactly 2 blocks
        (32, 16, False, 2),  # 31 tokens
        (17, 16, False, 1),  # 16 tokens: exactly 1 block
        (18, 16, False, 2),  # 17 tokens
        (5, 4, False, 1),  # 4 tokens: exactly 1 block
        (6, 4, False, 2),  # 5 tokens
        (24, 4, False, 6),  # 23 tokens
        (24, 4, True, 7),
        (2, 1, False, 1),  # block size 1: window - 1 blocks
        (1000, 1, False, 999),
        (1, 16, False, 0),  # a window of one token needs no earlier token
        (1, 16, True, 1),
    ],
)
def test_contiguous_blocks_needed(window, block_size, use_eagle, needed):
    spec = sw(window, block_size=block_size)
    assert contiguous_blocks_needed(spec, use_eagle) == needed


# -- hit patterns (notes §9.5 #40) -----------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "expected_blocks"),
    [
        ([F] * 10, 0),
        ([T], 1),
        ([T, F], 1),
        ([T, T], 2),
        ([T, T, F], 2),
        ([T, T, T], 3),
        ([T, T, T, F], 3),
        ([T, T, F, T, F, F, T, T, F, T, T, T], 12),
        ([T, T, F, T, F, F, T, T, F, F, F], 8),
        ([T, T, F, T, F, F, T, T, F, F, F, T], 8),
    ],
)
def test_hit_patterns(pattern, expected_blocks):
    """Block size 2, window 4: a hit needs cdiv(3, 2) = 2 contiguous cached blocks.

    The search runs right to left and stops at the first run of 2 (e.g. the
    8-block hit ends with the run at blocks 6-7 once 8-10 miss); with no such
    run, the cached run from block 0 counts (``[T]`` and ``[T, F]`` give 1).
    Everything before the last two returned entries is a null block.
    """
    spec = sw(4, block_size=2)
    pool, hashes, (table,) = cached_pattern(pattern, 2)
    (hit,), _ = jump(hashes, len(pattern) * 2, [0], pool, spec, False, 2)
    assert len(hit) == expected_blocks
    tail = min(expected_blocks, 2)
    assert (
        hit == [NULL] * (expected_blocks - tail) + table[expected_blocks - tail : expected_blocks]
    )


def test_a_hit_needs_the_blocks_in_every_group_of_the_spec_group():
    """Two groups with one spec: a position counts only if cached in both."""
    spec = sw(4, block_size=2)
    pool, hashes, tables = cached_pattern([T, T, T, T], 2, num_groups=2)
    pool.evict_blocks([tables[1][3]])  # position 3 only in group 0 now
    hits, _ = jump(hashes, 8, [0, 1], pool, spec, False, 2)
    assert hits == ([NULL, tables[0][1], tables[0][2]], [NULL, tables[1][1], tables[1][2]])


def test_blocks_larger_than_the_hash_unit_use_the_hash_of_their_last_unit():
    """Block 4, window 8, hashes every 2 tokens (notes §9.5 #48, alignment 4 here).

    Unit hashes h0-h3 seen per block are (h1, h3); blocks cached under h1 and
    h3 make a run of 2 blocks: a hit of 8 tokens with both blocks.
    """
    pool, hashes, (table,) = cached_pattern([T, T], 4)
    units = ["u0", hashes[0], "u2", hashes[1]]
    view = BlockHashView(units, 2)
    (hit,), _ = jump(view, 8, [0], pool, sw(8, block_size=4), False, 4)
    assert hit == table


# -- the jump search against the plain scan ----------------------------------------------------


def random_case(rng):
    block_size = rng.choice([1, 2, 4, 16])
    window = rng.choice([1, 2, 3, 5, 8, 17, 33, 64, 129])
    use_eagle = rng.random() < 0.3
    stride = rng.choice([1, 1, 2, 3, 4])
    alignment = block_size * stride
    num_blocks = rng.randrange(0, 70)
    density = rng.choice([0.05, 0.3, 0.7, 0.95, 1.0])
    pattern = [rng.random() < density for _ in range(num_blocks)]
    max_length = rng.randint(0, num_blocks * block_size + block_size - 1)
    return sw(window, block_size), pattern, use_eagle, alignment, max_length


def test_jump_search_equals_the_plain_scan_on_random_cache_states():
    """Property: same blocks as probing every block, on 3000 random cache states.

    Random block size, window, EAGLE, alignment (1-4 blocks), length limit
    and cached pattern (from almost empty to full).
    """
    rng = random.Random(20260301)
    total_jump = total_plain = num_hits = 0
    for _ in range(3000):
        spec, pattern, use_eagle, alignment, max_length = random_case(rng)
        pool, hashes, _ = cached_pattern(pattern, spec.block_size)
        expected, plain_probes = plain_scan(
            hashes, max_length, [0], pool, spec, use_eagle, alignment
        )
        got, jump_probes = jump(hashes, max_length, [0], pool, spec, use_eagle, alignment)
        assert got == expected, (pattern, spec.sliding_window, use_eagle, alignment, max_length)
        total_jump += jump_probes
        total_plain += plain_probes
        num_hits += bool(got[0])
    assert num_hits > 1000  # the states are not mostly trivial misses
    assert total_jump < total_plain


@pytest.mark.parametrize("use_eagle", [False, True])
@pytest.mark.parametrize(("num_tokens", "window", "block_size"), [(8192, 128, 16), (32768, 64, 16)])
def test_jump_search_probes_about_n_over_k_plus_k_with_few_hits(
    num_tokens, window, block_size, use_eagle
):
    """Long prompt, ~2 % of blocks cached (never a full window): O(n/k + k) probes.

    n = num_tokens / block_size blocks, k = contiguous blocks needed; the
    plain scan probes all n blocks. The jump search probes one block per
    window when it misses; a cached left end costs one more probe and a
    shorter jump, so with 2 % of blocks cached it stays under 1.1 n/k + 2k.
    """
    rng = random.Random(7)
    n = num_tokens // block_size
    pattern = [rng.random() < 0.02 for _ in range(n)]
    spec = sw(window, block_size)
    k = -(-(window - 1) // block_size) + use_eagle  # 8 or 4 blocks (+ 1 with EAGLE)
    pool, hashes, _ = cached_pattern(pattern, block_size)
    expected, plain_probes = plain_scan(hashes, num_tokens, [0], pool, spec, use_eagle, block_size)
    got, jump_probes = jump(hashes, num_tokens, [0], pool, spec, use_eagle, block_size)
    assert got == expected
    assert plain_probes == n
    assert jump_probes <= 1.1 * n / k + 2 * k


def test_jump_search_with_no_block_cached_probes_one_block_per_window():
    """8 blocks needed, 64 blocks, nothing cached: probes 7, 15, ..., 63 then 0."""
    spec = sw(128, 16)
    pool, hashes, _ = cached_pattern([F] * 64, 16)
    (hit,), probes = jump(hashes, 64 * 16, [0], pool, spec, False, 16)
    assert hit == []
    assert probes == 64 // 8 + 1  # one per window, then block 0 for the leading run


# -- removal (notes §9.5 #42) ----------------------------------------------------------------------


def test_remove_skipped_blocks():
    """Block size 2, window 4, an 11-block table (ids 1-11).

    skipped(n) = n - 3 tokens: n = 0, 4 free nothing; 5 frees block 0 (1
    skipped block); 6 nothing more; 7 frees block 1; 11 frees blocks 3 then 2
    (tail first: 8 skipped tokens = 4 blocks, the walk stops at the null at
    index 1).
    """
    pool = kvcore.managers.BlockPool(20)
    manager = SlidingWindowManager(sw(4, block_size=2), pool)
    manager.allocate_new_blocks("r", 22)
    assert manager.req_to_blocks["r"] == list(range(1, 12))

    def after(n):
        manager.remove_skipped_blocks("r", n)
        return manager.req_to_blocks["r"]

    assert after(0) == list(range(1, 12))
    assert after(4) == list(range(1, 12))
    assert after(5) == [NULL, *range(2, 12)]
    assert after(6) == [NULL, *range(2, 12)]
    assert after(7) == [NULL, NULL, *range(3, 12)]
    assert after(11) == [NULL] * 4 + list(range(5, 12))
    # Freed in the order 1, 2, then 4, 3: appended to the free queue's tail.
    assert pool.free_block_ids()[-4:] == [1, 2, 4, 3]


# -- the allocation predictor (notes §9.5 #45, #46) ------------------------------------------------


def test_predictor_counts_revived_hits():
    """Block size 2, window 4, a 40-token request (20 blocks).

    As in the reference test, with ``total_computed_tokens=0`` nothing is
    skipped: 10 real free cached hits give 10 new + 10 revived = 20; 5 null +
    5 real hits give 10 new + 5 revived = 15. With the realistic count (20
    computed tokens), 17 tokens = 8 blocks are skipped: the hits before them
    are not adopted, so 10 new + 2 revived = 12.
    """
    pool, hashes, (table,) = cached_pattern([T] * 10, 2, free=True)
    manager = SlidingWindowManager(sw(4, block_size=2), pool)
    nulls_then_real = [NULL] * 5 + table[5:]
    assert manager.get_num_blocks_to_allocate("a", 40, table, 0) == 20
    assert manager.get_num_blocks_to_allocate("b", 40, nulls_then_real, 0) == 15
    assert manager.get_num_blocks_to_allocate("c", 40, table, 20) == 12
    assert manager.get_num_blocks_to_allocate("d", 40, [NULL] * 8 + table[8:], 20) == 12


def test_adopting_a_hit_takes_exactly_what_was_predicted():
    """Block size 2, window 4: a 2-token hit on one free cached block, 4 tokens needed.

    Predicted 2 (1 new + 1 revived); the pool loses 2 free blocks, the table
    has 2 entries (the revived hit, then the new block), and 1 block is new.
    """
    pool = kvcore.managers.BlockPool(6)
    request = kvcore.Request("x", [1, 2, 3, 4])
    request.block_hashes.extend(["h0"])
    (hit_block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(request, [hit_block], 0, 1, 2, 0)
    pool.free_blocks([hit_block])
    manager = SlidingWindowManager(sw(4, block_size=2), pool)
    free_before = pool.get_num_free_blocks()
    assert manager.get_num_blocks_to_allocate("r", 4, [hit_block], 2) == 2
    manager.allocate_new_computed_blocks("r", [hit_block], 2, 0)
    new = manager.allocate_new_blocks("r", 4)
    assert len(new) == 1
    assert manager.req_to_blocks["r"] == [hit_block, *new]
    assert free_before - pool.get_num_free_blocks() == 2


# -- end to end, through the KV cache manager ----------------------------------------------------


def test_window_blocks_are_freed_as_a_request_decodes_and_still_hit():
    """Block size 4, window 8 (2 blocks needed), pool of 12 (ids 1-11).

    A 12-token prompt gets [1, 2, 3]. Decoding frees the blocks whose tokens
    left the window before each allocation: at 12 computed tokens
    skipped(12) = 5 tokens = 1 block (id 1 freed), at 15 skipped(15) = 8 =
    2 blocks (id 2 freed). A request with the same 16 tokens + 1 then hits 16
    tokens: blocks 2-3 of its table are [3, 4] (still cached), 0-1 are null.
    """
    manager = make_manager([sw(8, block_size=4)], 12)
    a = kvcore.Request("a", list(range(12)))
    admit(manager, a)
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    for token in range(12, 17):
        a.append_output_token_ids(token)
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    assert manager.get_block_ids("a") == ([NULL, NULL, 3, 4, 5],)
    assert manager.block_pool.free_block_ids()[-2:] == [1, 2]
    b = kvcore.Request("b", list(range(16)) + [99])
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 16
    assert hit.blocks == ([NULL, NULL, 3, 4],)
    manager.evict_blocks([1, 2])  # the window's earlier blocks are not needed
    assert manager.get_computed_blocks(b) == (hit, 16)


def test_eagle_needs_one_more_block_then_drops_it():
    """Block size 16, window 33 (2 blocks, 3 with EAGLE), unitary.

    A 96-token prompt is cached (6 blocks, ids 1-6). An identical request may
    hit at most 95 tokens = 5 blocks. Without EAGLE the run 3-4 suffices: 80.
    With EAGLE the group looks one block past (96 tokens: the request's six
    full blocks), the run 3-5 has 3 cached blocks, the last is dropped: 80.
    Once block 5 (id 6) is evicted, EAGLE's run must end at block 4: run
    2-4, dropped to 4 blocks = 64; without EAGLE it is still 80.
    """
    for use_eagle, expected, after_eviction in ((True, 80, 64), (False, 80, 80)):
        manager = make_manager([sw(33)], 20, use_eagle=use_eagle)
        prompt = tokens((1, 40), (2, 56))
        admit(manager, kvcore.Request("a", prompt))
        _, num_hit = manager.get_computed_blocks(kvcore.Request("b", prompt))
        assert num_hit == expected
        manager.evict_blocks([6])
        _, num_hit = manager.get_computed_blocks(kvcore.Request("c", prompt))
        assert num_hit == after_eviction
