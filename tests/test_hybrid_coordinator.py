"""The hybrid coordinator: one prefix-cache hit that every KV cache group can serve.

Semantics (kvcore/_coordinator.py, the newer fixed-point loop of the grouping
seed over the 0.14 managers): groups with equal specs are looked up together;
downward-closed groups (full attention and kin) go first and are looked up
once; every other group may only shrink the candidate length, until a whole
pass leaves it unchanged; hit lengths are multiples of the lcm of the block
sizes, hashes are computed at their gcd and viewed per group. With EAGLE a
group looks one block past the candidate and drops it, at most once per
candidate length.

Expected values are derived by hand (docstrings). Scenarios of vllm-notes
§9.6 that depend on newer-only behaviour are left out: sliding-window
caching masks and retention intervals (#57-#64), EAGLE with masks (#65-#67:
replaced by an EAGLE/different-block-size case derived here), the admission
gate (#68) and two-phase external allocation (#69).
"""

from __future__ import annotations

from typing import Any

import pytest

import kvcore
from kvcore.errors import InvalidConfigError
from kvcore.testing import admit, check_manager_invariants
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.cross_attention import CrossAttentionSpec
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec

NULL = kvcore.managers.NULL_BLOCK
T, F = True, False
PLUGINS = ["full_attention", "sliding_window", "chunked_local", "mamba", "cross_attention"]


@pytest.fixture(scope="module")
def registry():
    return kvcore.load_registry(only=PLUGINS)


def full(block_size=16, dtype="float16"):
    return FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=dtype)


def sw(window, block_size=16, dtype="float16"):
    return SlidingWindowSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype=dtype, sliding_window=window
    )


def mamba(block_size=16, mode="align"):
    return MambaSpec(
        block_size=block_size, shapes=((4, 8),), dtypes=("float32",), mamba_cache_mode=mode
    )


def chunked(chunk, block_size=16):
    return ChunkedLocalAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=8,
        dtype="float16",
        attention_chunk_size=chunk,
    )


def cross(block_size=16):
    return CrossAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16")


def make(registry, specs, num_blocks, **kwargs: Any) -> kvcore.KVCacheManager:
    config = kvcore.KVCacheConfig.from_specs(num_blocks, specs)
    return kvcore.KVCacheManager(config, 4096, registry=registry, **kwargs)


def block_tokens(*values):
    """One 16-token block of each value: ``block_tokens(1, 2)`` = 16 ones, 16 twos."""
    return [v for v in values for _ in range(16)]


def lookup(manager, prompt):
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("probe", prompt))
    return num_hit, [list(group) for group in hit.blocks]


@pytest.fixture
def call_log(monkeypatch):
    """Record every (class, window, max_length, use_eagle) hit search of full and SW groups."""
    log = []
    for cls in (FullAttentionManager, SlidingWindowManager):
        original = cls.find_longest_cache_hit

        def wrapper(kls, query, _original=original, _name=cls.__name__):
            window = getattr(query.spec, "sliding_window", None)
            log.append((_name, window, query.max_length, query.use_eagle))
            return _original(query)

        monkeypatch.setattr(cls, "find_longest_cache_hit", classmethod(wrapper))
    return log


# -- full + SW + SW (notes §9.6 #53) -------------------------------------------------------------

PROMPT_53 = [*block_tokens(0, 1, 2), *[3] * 7]  # 55 tokens


def test_full_and_two_sliding_windows(registry):
    """Block 16, 21 blocks; full, SW(32), SW(32): the two SW groups form one spec group.

    req0 (55 tokens) takes 4 blocks per group, in group order: [1-4], [5-8],
    [9-12]; the first 3 of each are cached under the same hashes. req1 = the
    48 common tokens + 5: max 52, full hits 3 blocks (48); the SW spec group
    (2 blocks needed) finds blocks 1-2 cached in both groups: [null, 6, 7]
    and [null, 10, 11]. It then needs cdiv(53, 16) = 4 blocks per group: one
    new block each (13, 14, 15), and the adopted hits are held twice.
    """
    manager = make(registry, [full(), sw(32), sw(32)], 21)
    req0 = kvcore.Request("req0", PROMPT_53)
    admit(manager, req0)
    assert manager.get_block_ids("req0") == ([1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12])
    pool = manager.block_pool
    for blocks in ((1, 5, 9), (2, 6, 10), (3, 7, 11)):
        assert len({pool.block_hash(b) for b in blocks}) == 1
    assert pool.block_hash(4) is None

    req1 = kvcore.Request("req1", [*PROMPT_53[:48], 9, 9, 9, 9, 9])
    hit, num_hit = manager.get_computed_blocks(req1)
    assert num_hit == 48
    assert hit.blocks == ([1, 2, 3], [NULL, 6, 7], [NULL, 10, 11])
    new = manager.allocate_slots(req1, 5, 48, hit)
    assert new.blocks == ([13], [14], [15])
    assert [pool.ref_count(b) for b in (1, 2, 3, 6, 7, 10, 11)] == [2] * 7
    assert pool.ref_count(5) == 1


@pytest.mark.parametrize(
    ("evicted", "expected_blocks"),
    [
        ([5, 9], 3),  # SW hash 0: SW only needs blocks 1-2
        ([1], 0),  # full hash 0: full attention hits nothing
        ([3, 7, 11], 2),  # hash 2 everywhere
        ([3], 2),  # full hash 2: full hits 2, SW at 32 finds blocks 0-1
        ([7], 2),  # SW group 1 hash 2: the SW spec group needs both groups
        ([11], 2),  # SW group 2 hash 2
        ([3, 5, 9], 0),  # full hash 2 + SW hash 0: full 2 blocks, SW needs 0-1
    ],
)
def test_full_and_two_sliding_windows_after_removals(registry, evicted, expected_blocks):
    """Same config; req0 and req1 freed; blocks evicted from the cache; req1 looked up.

    Block ids per (group, hash i): full i + 1, SW g1 5 + i, SW g2 9 + i.
    With full hash 2 and SW hash 0 gone, full gives 32 tokens, and SW at 32
    (2 blocks) finds block 1 but not block 0: no run, no leading run: 0.
    Every group's list has exactly the hit's number of blocks.
    """
    manager = make(registry, [full(), sw(32), sw(32)], 21)
    req0 = kvcore.Request("req0", PROMPT_53)
    admit(manager, req0)
    req1 = kvcore.Request("req1", [*PROMPT_53[:48], 9, 9, 9, 9, 9])
    admit(manager, req1)
    manager.free(req0)
    manager.free(req1)
    manager.evict_blocks(evicted)
    num_hit, blocks = lookup(manager, req1.all_token_ids)
    assert num_hit == expected_blocks * 16
    assert [len(group) for group in blocks] == [expected_blocks] * 3


# -- EAGLE in a hybrid model (notes §9.6 #54) ---------------------------------------------------

PROMPT_54 = [*block_tokens(0, 1, 2, 3, 4, 5), *[6] * 7]  # 103 tokens


def test_eagle_with_full_and_two_sliding_windows(registry, call_log):
    """Block 16, 31 blocks, full + 2 × SW(48), EAGLE (no spiral to 0).

    req0 (103 tokens) takes 7 blocks per group; EAGLE groups cache one block
    past the aligned 96 tokens, capped at the request: 6 blocks each. req1 =
    96 common + 5 (6 hashes, max 100). Full looks at min(100 + 16, 96) = 96:
    6 blocks, drops one: 80. SW (3 blocks + 1 for EAGLE) looks at
    min(80 + 16, 96): blocks 2-5 cached, drop one: [null, null, b2, b3, b4]
    = 80. Two spec groups with full first: one pass. New blocks: 7 - 5 = 2
    per group. (vLLM 0.14's loop re-drops on every pass and ends at 0.)
    """
    manager = make(registry, [full(), sw(48), sw(48)], 31, use_eagle=True)
    req0 = kvcore.Request("req0", PROMPT_54)
    admit(manager, req0)
    assert manager.get_block_ids("req0") == (
        list(range(1, 8)),
        list(range(8, 15)),
        list(range(15, 22)),
    )
    pool = manager.block_pool
    assert [pool.block_hash(b) is not None for b in (6, 7, 13, 14, 20, 21)] == [T, F] * 3
    req1 = kvcore.Request("req1", [*PROMPT_54[:96], 9, 9, 9, 9, 9])
    call_log.clear()
    hit, num_hit = manager.get_computed_blocks(req1)
    assert num_hit == 80
    assert hit.blocks == ([1, 2, 3, 4, 5], [NULL, NULL, 10, 11, 12], [NULL, NULL, 17, 18, 19])
    assert call_log == [
        ("FullAttentionManager", None, 96, True),
        ("SlidingWindowManager", 48, 96, True),
    ]
    new = manager.allocate_slots(req1, 21, 80, hit)
    assert new.blocks == ([22, 23], [24, 25], [26, 27])


@pytest.mark.parametrize(
    ("evicted", "expected_blocks"),
    [
        ([8, 15], 5),  # SW hash 0: the run 2-5 is enough
        ([1], 0),  # full hash 0
        ([6, 13, 20], 4),  # hash 5 everywhere: full 5 blocks - 1 = 4; SW run 1-4
        ([6], 4),  # full hash 5
        ([12], 3),  # SW g1 hash 4: SW's run must be 0-3, minus the drop: 3
        ([19], 3),  # SW g2 hash 4
        ([6, 8, 15], 4),  # full hash 5 + SW hash 0: SW run 1-4 at 64 (+16)
    ],
)
def test_eagle_hybrid_after_removals(registry, evicted, expected_blocks):
    """As above, req0 only; blocks evicted; req1's tokens looked up (max 100, 6 hashes).

    Ids per (group, hash i): full 1 + i, SW g1 8 + i, SW g2 15 + i. E.g. SW
    g1 hash 4 gone: full 80; SW at 80 looks at 96 (6 blocks), block 5 alone,
    block 4 missing, run 0-3 (4 = 3 + 1 blocks), drop: 3 blocks = 48; full
    is cut to 3 blocks.
    """
    manager = make(registry, [full(), sw(48), sw(48)], 31, use_eagle=True)
    admit(manager, kvcore.Request("req0", PROMPT_54))
    manager.evict_blocks(evicted)
    num_hit, blocks = lookup(manager, [*PROMPT_54[:96], 9, 9, 9, 9, 9])
    assert num_hit == expected_blocks * 16
    assert [len(group) for group in blocks] == [expected_blocks] * 3


# -- two sliding windows, no full attention (notes §9.6 #55) ------------------------------------


def test_two_sliding_windows_without_full_attention(registry, call_log):
    """SW(32) + SW(64), block 16; req0 55 tokens, req1 = 48 common + 5 (max 52).

    Pass 1: SW32 at 52 (3 blocks): run 1-2 -> 48 (ids [null, 2, 3]); SW64 at
    48 needs 4 blocks but has 3: the run from block 0 is still a hit: 48.
    Pass 2 confirms 48 in both: 4 lookups in all.
    """
    manager = make(registry, [sw(32), sw(64)], 30)
    admit(manager, kvcore.Request("req0", PROMPT_53))
    assert manager.get_block_ids("req0") == ([1, 2, 3, 4], [5, 6, 7, 8])
    call_log.clear()
    assert lookup(manager, [*PROMPT_53[:48], 9, 9, 9, 9, 9]) == (48, [[NULL, 2, 3], [5, 6, 7]])
    assert [(w, m) for _, w, m, _ in call_log] == [(32, 52), (64, 48), (32, 48), (64, 48)]


# -- different block sizes (notes §9.6 #56) -------------------------------------------------------


def test_different_block_sizes(registry):
    """Full block 32 (fp16) + SW block 16 (fp32, window 32): hashes per 16 tokens, hits per 32.

    req0 (160 tokens) first gets 112: full cdiv(112, 32) = 4 blocks [1-4],
    SW 7 blocks [5-11]. Caching stops at the last multiple of the lcm (32):
    96 tokens = 3 full blocks, 6 SW blocks (block 4 and 11 stay uncached;
    the newer release's rule, vLLM 0.14 would cache all full blocks).
    req1 = first 113 tokens, req2 = first 97: full 3 blocks (96), SW 6
    entries ending with the run 4-5 (ids 9, 10): 96. With SW block 10 (hash
    5) evicted: SW block 4 would give 80 but 80 is not a multiple of 32, so
    the run must end at block 3: [null, null, 7, 8] = 64; full cut to 2.
    """
    manager = make(registry, [full(32), sw(32, dtype="float32")], 100)
    assert manager.hash_block_size == 16
    assert manager.coordinator.alignment_tokens == 32
    prompt = list(range(1000, 1160))
    req0 = kvcore.Request("req0", prompt)
    assert manager.allocate_slots(req0, 112) is not None
    assert manager.get_block_ids("req0") == ([1, 2, 3, 4], list(range(5, 12)))
    pool = manager.block_pool
    assert [pool.block_hash(b) is not None for b in range(1, 12)] == [T, T, T, F] + [T] * 6 + [F]
    expected = (96, [[1, 2, 3], [NULL, NULL, NULL, NULL, 9, 10]])
    assert lookup(manager, prompt[:113]) == expected
    assert lookup(manager, prompt[:97]) == expected
    manager.evict_blocks([10, 11])
    assert lookup(manager, prompt[:113]) == (64, [[1, 2], [NULL, NULL, 7, 8]])


def test_full_attention_with_a_larger_mamba_block(registry):
    """Full block 16 + Mamba block 32 (align): hits are multiples of 32.

    A 100-token prompt: full 7 blocks [1-7], Mamba 4 [8-11]; cached up to 96
    tokens: 6 full blocks, 3 Mamba states (after 32, 64, 96 tokens: ids
    8-10). The same 96 tokens + 10 (max 105): full 96; Mamba at 96: state 2
    (id 10): [null, null, 10]. Without state 2: state 1, 64; full cut to 4.
    """
    manager = make(registry, [full(16), mamba(32)], 40)
    prompt = list(range(2000, 2100))
    admit(manager, kvcore.Request("a", prompt))
    assert manager.get_block_ids("a") == (list(range(1, 8)), [8, 9, 10, 11])
    assert lookup(manager, prompt[:96] + [5] * 10) == (96, [list(range(1, 7)), [NULL, NULL, 10]])
    manager.evict_blocks([10])
    assert lookup(manager, prompt[:96] + [5] * 10) == (64, [[1, 2, 3, 4], [NULL, 9]])


def test_eagle_with_different_block_sizes(registry):
    """Full block 32 + SW block 16 (window 17: 1 block, 2 with EAGLE), EAGLE on.

    vLLM 0.14's sliding-window manager asserts here; kvcore checks the run's
    right edge for alignment *after* the drop. A 128-token prompt is cached
    (EAGLE: one block past the aligned 128, capped: 4 full, 8 SW blocks).
    An identical request (max 127, 8 hashes): full looks at 128, drops one:
    96. SW looks at 112 (7 blocks); the run may end at an even block only
    (the drop leaves a multiple of 32): blocks 5-6 -> [null × 5, id 10], 96.
    With SW block 6 (id 11) evicted: blocks 3-4 -> 64; full cut to 2.
    """
    manager = make(registry, [full(32), sw(17)], 40, use_eagle=True)
    prompt = list(range(3000, 3128))
    admit(manager, kvcore.Request("a", prompt))
    assert manager.get_block_ids("a") == ([1, 2, 3, 4], list(range(5, 13)))
    assert lookup(manager, prompt) == (96, [[1, 2, 3], [NULL] * 5 + [10]])
    manager.evict_blocks([11])
    assert lookup(manager, prompt) == (64, [[1, 2], [NULL] * 3 + [8]])


# -- the worked lifecycle of notes Appendix A -------------------------------------------------


def test_full_and_sliding_window_lifecycle(registry):
    """Full + SW(8), block 4, pool 20 (ids 1-19); a 20-token prompt in chunks 8 + 8 + 4.

    1. 8 tokens: full [1, 2], SW [3, 4]. 2. 8 more: SW skips 8 - 7 = 1 token
    (no block): full [1, 2, 5, 6], SW [3, 4, 7, 8]. 3. 4 more: first
    skipped(16) = 9 tokens = 2 blocks frees SW 4 then 3 (to the queue's
    tail, still cached); then 9 and 10 from the head. 4. One decode token:
    skipped(20) = 13 = 3 blocks frees 7 only (the walk stops at the null);
    then 11, 12. Freeing appends full's blocks last-first, then SW's.
    A new request with the same 20 tokens + 4 (max 23) hits 20: SW blocks
    3-4 (ids 8, 10) are cached even after evicting 3, 4 and 7.
    """
    manager = make(registry, [full(4), sw(8, block_size=4)], 20)
    prompt = list(range(100, 120))
    req = kvcore.Request("req", prompt)
    steps = [
        (8, ([1, 2], [3, 4])),
        (8, ([1, 2, 5, 6], [3, 4, 7, 8])),
        (4, ([1, 2, 5, 6, 9], [NULL, NULL, 7, 8, 10])),
    ]
    for num_new, tables in steps:
        assert manager.allocate_slots(req, num_new) is not None
        req.num_computed_tokens += num_new
        assert manager.get_block_ids("req") == tables
    pool = manager.block_pool
    req.append_output_token_ids(7)
    assert manager.allocate_slots(req, 1) is not None
    assert manager.get_block_ids("req") == ([1, 2, 5, 6, 9, 11], [NULL, NULL, NULL, 8, 10, 12])
    assert pool.free_block_ids() == [*range(13, 20), 4, 3, 7]
    manager.free(req)
    assert pool.free_block_ids() == [*range(13, 20), 4, 3, 7, 11, 9, 6, 5, 2, 1, 12, 10, 8]
    expected = (20, [[1, 2, 5, 6, 9], [NULL, NULL, NULL, 8, 10]])
    assert lookup(manager, [*prompt, 1, 2, 3, 4]) == expected
    manager.evict_blocks([3, 4, 7])
    assert lookup(manager, [*prompt, 1, 2, 3, 4]) == expected


# -- three spec groups: the fixed point (notes §9.6 #70, #71) -----------------------------------


def _three_groups(registry):
    """Full, SW(32) (2 blocks), SW(64) (4 blocks), block 16; a 100-token prompt cached.

    Ids per (group, hash i): full 1 + i, SW32 8 + i, SW64 15 + i (i < 6).
    """
    manager = make(registry, [full(), sw(32), sw(64)], 30)
    prompt = list(range(500, 600))
    admit(manager, kvcore.Request("a", prompt))
    return manager, prompt


def test_three_types_fixed_point(registry, call_log):
    """SW64 lacks hash 4 (id 19); the same 100 tokens looked up (max 99).

    Pass 1: full 96; SW32 at 96: run 4-5, 96; SW64 at 96: block 5, miss at
    4, run 0-3: 64. Pass 2: full cut to 64 (no lookup); SW32 at 64: run
    2-3; SW64 at 64: run 0-3. No reduction: 64. Full looked up once.
    """
    manager, prompt = _three_groups(registry)
    manager.evict_blocks([19])
    call_log.clear()
    assert lookup(manager, prompt) == (64, [[1, 2, 3, 4], [NULL, NULL, 10, 11], [15, 16, 17, 18]])
    assert [(w, m) for _, w, m, _ in call_log] == [
        (None, 99),
        (32, 96),
        (64, 96),
        (32, 64),
        (64, 64),
    ]


def test_three_types_fixed_point_needs_a_third_pass(registry, call_log):
    """As above, and SW32 also lacks hash 2 (id 10).

    Pass 2: SW32 at 64: block 3, miss at 2, run 0-1: 32; SW64 at 32: 2
    blocks, fewer than 4 but from block 0: 32. Pass 3 confirms 32.
    """
    manager, prompt = _three_groups(registry)
    manager.evict_blocks([19, 10])
    call_log.clear()
    assert lookup(manager, prompt) == (32, [[1, 2], [8, 9], [15, 16]])
    assert [(w, m) for _, w, m, _ in call_log] == [
        (None, 99),
        (32, 96),
        (64, 96),
        (32, 64),
        (64, 32),
        (32, 32),
        (64, 32),
    ]


def test_eagle_extra_block_is_checked_again_at_every_shorter_candidate(registry, call_log):
    """Full, A = SW(33) (2 blocks, 3 with EAGLE), B = SW(49) (3, 4 with EAGLE), EAGLE.

    A 177-token prompt is cached (11 blocks per group: ids full 1 + i, A
    13 + i, B 25 + i). A lacks hash 4 (id 17); B has only hashes 1-4.
    The identical request (max 176, 11 hashes):

    * pass 1: full 176 -> 11 blocks - 1 = 160. A looks at 176: run 8-10,
      drop: 160. B looks at 176: run 1-4 -> 64 (B is now checked at 64).
    * pass 2: A must check its extra block again at 64: looks at 80, block
      4 misses, run 1-3, drop: 48. B looks at 64: block 0 misses: 0.
    * pass 3: A looks at 16: 0. B was checked at 0 already: plain lookup.

    The hit is 0. The seed's loop only re-checks after a reduction by a
    group that did *not* drop, so it would keep A's pass-1 check and stop at
    64 -- a hit whose next block (hash 4) is not cached in A.
    """
    manager = make(registry, [full(), sw(33), sw(49)], 40, use_eagle=True)
    prompt = list(range(700, 877))
    admit(manager, kvcore.Request("a", prompt))
    assert manager.get_block_ids("a") == (
        list(range(1, 13)),
        list(range(13, 25)),
        list(range(25, 37)),
    )
    manager.evict_blocks([17, 25, *range(30, 36)])
    call_log.clear()
    assert lookup(manager, prompt) == (0, [[], [], []])
    assert [(w, m, e) for _, w, m, e in call_log] == [
        (None, 176, True),
        (33, 176, True),
        (49, 176, True),
        (33, 80, True),
        (49, 64, True),
        (33, 16, True),
        (49, 0, False),
    ]


# -- configurations the coordinator cannot reconcile ------------------------------------------


@pytest.mark.parametrize(
    ("specs", "options", "match"),
    [
        # Cross-attention KV is per request: nothing else may be cached around it.
        ([full(), cross()], {}, r"group 1 \(CrossAttentionSpec.*is never cached"),
        # A Mamba state kept once per request cannot be hit.
        ([full(), mamba(mode="none")], {}, r"mamba_cache_mode is 'none'"),
        # Chunked-local hits are not aligned: all hits must land on its blocks.
        ([full(16), chunked(64, block_size=8)], {}, r"aligned to its own block size \(8"),
        # Chunked-local hits cannot drop EAGLE's block.
        ([full(), chunked(64)], {"use_eagle": True}, r"does not support EAGLE"),
    ],
)
def test_irreconcilable_configs_are_refused_before_anything_is_built(
    registry, specs, options, match
):
    with pytest.raises(InvalidConfigError, match=match):
        make(registry, specs, 20, **options)
    make(registry, specs, 20, enable_caching=False, **options)


def test_events_name_each_groups_kind(registry):
    """Full, SW(32) and Mamba (align), block 16 (notes §9.4 #37): a 40-token prompt.

    Each group caches 2 blocks and reports one ``BlockStored`` with its group
    index and its attention kind.
    """
    manager = make(registry, [full(), sw(32), mamba()], 20, enable_kv_cache_events=True)
    admit(manager, kvcore.Request("a", list(range(40))))
    stored = [e for e in manager.take_events() if isinstance(e, kvcore.events.BlockStored)]
    assert [(e.group_idx, e.kind, len(e.block_hashes)) for e in stored] == [
        (0, "full_attention", 2),
        (1, "sliding_window", 2),
        (2, "mamba", 2),
    ]


# -- hits and external tokens: every group's hits are taken before any group allocates -----


def test_external_tokens_never_hand_one_groups_hit_to_another(registry):
    """Full (block 4) + sliding window 4 (block 4), pool of 7 (ids 1-6), max_model_len 48.

    P (12 tokens) is admitted and freed: full [1, 2, 3], SW [4, 5, 6]; the
    queue is then 3, 2, 1, 6, 5, 4 (each group's blocks last first). P + four
    5s hits 12 tokens: full [1, 2, 3], SW [null, null, 6]. Three new tokens
    and one external: 16 slots, 13 computed. The reference adopts group by
    group, so full attention's external block came off the queue head, which
    was SW's hit block 6: ([1, 2, 3, 6], [0, 0, 6, 5]), one block in two
    groups. kvcore touches every group's kept hits first (queue: 5, 4), then
    allocates the external blocks: full takes 5, SW (13 computed: blocks 0-1
    skipped) takes 4.
    """
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(7, [full(4), sw(4, 4)]), 48, registry=registry
    )
    prompt = list(range(100, 112))
    first = kvcore.Request("p", prompt)
    admit(manager, first)
    assert manager.get_block_ids("p") == ([1, 2, 3], [4, 5, 6])
    manager.free(first)
    assert manager.block_pool.free_block_ids() == [3, 2, 1, 6, 5, 4]
    request = kvcore.Request("q", [*prompt, 5, 5, 5, 5])
    hit, num_hit = manager.get_computed_blocks(request)
    assert (hit.get_block_ids(), num_hit) == (([1, 2, 3], [NULL, NULL, 6]), 12)
    assert manager.allocate_slots(request, 3, 12, hit, num_external_computed_tokens=1) is not None
    assert manager.get_block_ids("q") == ([1, 2, 3, 5], [NULL, NULL, 6, 4])
    check_manager_invariants(manager)


# -- one EAGLE rule for one group and for several ----------------------------------------


def test_eagle_hit_is_the_same_with_one_group_and_with_several(registry):
    """A block-aligned 96-token prompt (6 blocks of 16) cached, then sent again (max 95).

    The rule (both paths): with EAGLE the block after the hit must be cached
    too, so a group looks one block past the limit (as far as the request's
    full blocks go) and drops the last matched block. Full attention matches
    6 blocks (96 tokens, the request's sixth block being cached) and drops
    one: 80. The single-group path used to stop at 95 tokens (5 blocks) and
    drop one more: 64; the hybrid path (full + a 32-token window) gave 80.
    """
    prompt = list(range(7000, 7096))
    alone = make(registry, [full()], 20, use_eagle=True)
    hybrid = make(registry, [full(), sw(32)], 40, use_eagle=True)
    for manager in (alone, hybrid):
        admit(manager, kvcore.Request("a", prompt))
    assert lookup(alone, prompt) == (80, [[1, 2, 3, 4, 5]])
    assert lookup(hybrid, prompt) == (80, [[1, 2, 3, 4, 5], [NULL, NULL, NULL, 10, 11]])
    # The hit still leaves the last prompt token to compute: a 32-token
    # prompt (2 blocks, max 31) hits one block, never two.
    short = list(range(8000, 8032))
    admit(alone, kvcore.Request("s", short))
    assert lookup(alone, short)[0] == 16
