"""The mamba plugin: state blocks, right-to-left hits, speculative blocks, cache modes.

Expected values are worked out by hand from vLLM 0.14's MambaManager (the
seed): the base allocation (one block per ``block_size`` tokens, earlier
blocks freed as the request advances, skipped tokens = n - 1) plus
``num_speculative_blocks``, and a right-to-left single-state hit. The newer
release's "align" bookkeeping (position-indexed tables with only the live
blocks real, the same-step rule of notes §9.5 #52, prefill checkpoints) is
not in the seed and not reproduced; #51 is adapted to the seed below.
"""

from __future__ import annotations

import pytest
from kvplugin_helpers import NULL, cached_pattern, full, make_manager, mamba, tokens

import kvcore
from kvcore.errors import InvalidConfigError, InvalidSpecError
from kvcore.managers import HitQuery
from kvcore.testing import admit
from kvcore_plugins.mamba import MambaManager, MambaSpec

T, F = True, False


def test_only_the_last_state_is_needed():
    manager = MambaManager(mamba(16), kvcore.managers.BlockPool(4))
    assert [manager.get_num_skipped_tokens(n) for n in (0, 1, 16, 17, 48)] == [-1, 0, 15, 16, 47]


@pytest.mark.parametrize(
    ("pattern", "max_length", "expected"),
    [
        ([F, F, F, F], 16, 0),
        ([T, F, F, F], 16, 1),
        ([T, T, F, T], 16, 4),
        ([T, T, F, T], 15, 2),  # 15 // 4 = 3 blocks may hit: block 3 is out of reach
        ([F, F, T, F], 16, 3),
    ],
)
def test_the_latest_cached_state_is_the_hit(pattern, max_length, expected):
    """Block size 4, unitary: the rightmost cached block within reach; nulls before it."""
    pool, hashes, (table,) = cached_pattern(pattern, 4)
    (hit,) = MambaManager.find_longest_cache_hit(
        HitQuery(hashes, max_length, [0], pool, mamba(4), False, 4)
    )
    assert hit == ([NULL] * (expected - 1) + [table[expected - 1]] if expected else [])


def test_states_are_hit_only_at_aligned_positions():
    """Block size 4 with hits aligned to 8 tokens (a full-attention group of block 8).

    Block i holds the state after 4(i + 1) tokens, so only odd i qualify.
    Cached {2, 4} (12 and 20 tokens): no hit. Cached {1, 2, 4}: block 1, 8
    tokens. EAGLE changes nothing: the state is not the draft model's.
    """
    pool, hashes, (table,) = cached_pattern([F, F, T, F, T, F], 4)
    assert MambaManager.find_longest_cache_hit(
        HitQuery(hashes, 24, [0], pool, mamba(4), False, 8)
    ) == ([],)
    pool, hashes, (table,) = cached_pattern([F, T, T, F, T, F], 4)
    for use_eagle in (False, True):
        (hit,) = MambaManager.find_longest_cache_hit(
            HitQuery(hashes, 24, [0], pool, mamba(4), use_eagle, 8)
        )
        assert hit == [NULL, table[1]]


def test_two_step_prefill_then_a_shared_prefix_hit():
    """Full attention + Mamba (align), block 16, a 55-token prompt in chunks of 48 and 7.

    Adapted from notes §9.5 #51 to the seed's manager, which allocates a
    block per 16 tokens and frees the older ones on the next allocation:

    * chunk 1 (48 tokens): full [1, 2, 3], Mamba [4, 5, 6]; both cache 3
      blocks (Mamba block i = state after 16(i + 1) tokens).
    * chunk 2 (7 tokens, 48 computed): skipped(48) = 47 tokens = 2 blocks,
      so Mamba frees 5 then 4 (they stay cached); then full gets 7 and Mamba
      8: full [1, 2, 3, 7], Mamba [null, null, 6, 8].
    * first decode step (55 computed): skipped 54 = 3 blocks frees 6.
    * A new 60-token request sharing the 48-token prefix: full hits 3
      blocks (48); Mamba at 48 finds block 2 (id 6): [null, null, 6], 48.
      One sharing 40 tokens: full 2 blocks; Mamba block 1 (id 5): 32.
    """
    manager = make_manager([full(16), mamba(16)], 30)
    prompt = tokens((1, 20), (2, 28), (3, 7))
    a = kvcore.Request("a", prompt)
    assert manager.allocate_slots(a, 48) is not None
    a.num_computed_tokens = 48
    assert manager.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])
    assert manager.allocate_slots(a, 7) is not None
    a.num_computed_tokens = 55
    assert manager.get_block_ids("a") == ([1, 2, 3, 7], [NULL, NULL, 6, 8])
    a.append_output_token_ids(9)
    assert manager.allocate_slots(a, 1) is not None
    assert manager.get_block_ids("a") == ([1, 2, 3, 7], [NULL, NULL, NULL, 8])
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("b", prompt[:48] + [7] * 12))
    assert (num_hit, hit.blocks) == (48, ([1, 2, 3], [NULL, NULL, 6]))
    hit, num_hit = manager.get_computed_blocks(kvcore.Request("c", prompt[:40] + [7] * 12))
    assert (num_hit, hit.blocks) == (32, ([1, 2], [NULL, 5]))


def test_speculative_blocks_are_allocated_with_every_request():
    """Block size 16, 2 speculative blocks, caching off.

    A 10-token prompt needs cdiv(10 + 32, 16) = 3 blocks (predicted = taken).
    At 17 tokens: cdiv(17 + 32, 16) = 4 (one more); skipped(16) = 15 tokens,
    no whole block, so nothing is freed yet.
    """
    manager = make_manager([mamba(16, mode="none", spec_blocks=2)], 10, enable_caching=False)
    a = kvcore.Request("a", list(range(10)))
    coordinator = manager.coordinator
    assert coordinator.get_num_blocks_to_allocate("a", 10, ((),), 0, 0) == 3
    admit(manager, a)
    assert manager.get_block_ids("a") == ([1, 2, 3],)
    for token in range(7):
        a.append_output_token_ids(token)
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    assert manager.get_block_ids("a") == ([1, 2, 3, 4],)


def test_none_mode_holds_one_state_per_request():
    """``"none"`` mode with block size = max_model_len: one block (+ speculative) per request."""
    manager = make_manager([mamba(512, mode="none", spec_blocks=1)], 8, 512, enable_caching=False)
    a = kvcore.Request("a", list(range(100)))
    admit(manager, a)
    for token in range(50):
        a.append_output_token_ids(token)
        assert manager.allocate_slots(a, 1) is not None
        a.num_computed_tokens += 1
    assert manager.get_block_ids("a") == ([1, 2],)


# -- cache modes and validation ----------------------------------------------------------------


def test_cacheability_depends_on_the_cache_mode():
    assert MambaManager.is_prefix_cacheable(mamba(16, mode="align"))
    assert not MambaManager.is_prefix_cacheable(mamba(16, mode="none"))


def test_none_mode_with_prefix_caching_is_refused():
    with pytest.raises(
        InvalidConfigError,
        match=r"MambaSpec\.mamba_cache_mode is 'none'.*set mamba_cache_mode='align'.*"
        r"enable_caching=False",
    ):
        make_manager([full(16), mamba(16, mode="none")], 20)
    with pytest.raises(InvalidConfigError, match=r"mamba_cache_mode is 'none'"):
        make_manager([mamba(16, mode="none")], 20)
    make_manager([full(16), mamba(16, mode="none")], 20, enable_caching=False)


def test_a_none_mode_group_does_not_shape_the_hash_unit():
    """Only cacheable groups set the hash unit: with caching off it is the gcd of all."""
    manager = make_manager([full(16), mamba(512, mode="none")], 20, 512, enable_caching=False)
    assert manager.hash_block_size == 16


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ((), r"MambaSpec\.shapes is empty"),
        (((),), r"every state shape needs at least one dimension"),
        (((4, 0),), r"all positive integers"),
    ],
)
def test_empty_state_shapes_are_refused(shapes, match):
    with pytest.raises(InvalidSpecError, match=match):
        MambaSpec(block_size=16, shapes=shapes, dtypes=("float32",) * len(shapes))


def test_one_dtype_per_state_tensor():
    with pytest.raises(InvalidSpecError, match=r"MambaSpec\.dtypes has 1 entries for 2 shapes"):
        MambaSpec(block_size=16, shapes=((2, 3), (4,)), dtypes=("float32",))


def test_unknown_cache_mode_is_refused():
    with pytest.raises(
        InvalidSpecError, match=r"MambaSpec\.mamba_cache_mode must be .none. .*got .all."
    ):
        MambaSpec(block_size=16, shapes=((2,),), dtypes=("float32",), mamba_cache_mode="all")


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"page_size_padded": 10}, r"MambaSpec\.page_size_padded \(10 bytes\) is smaller than "),
        (
            {"num_speculative_blocks": -1},
            r"MambaSpec\.num_speculative_blocks must be an integer >= 0",
        ),
        ({"dtypes": ("float31",)}, r"MambaSpec\.dtypes: unknown dtype 'float31'"),
        ({"block_size": 0}, r"MambaSpec\.block_size must be a positive integer"),
    ],
)
def test_other_spec_fields_are_validated(fields, match):
    values = {"block_size": 16, "shapes": ((2, 8),), "dtypes": ("float32",), **fields}
    with pytest.raises(InvalidSpecError, match=match):
        MambaSpec(**values)


def test_a_state_cached_in_this_step_is_not_adopted_until_the_next():
    """Notes §9.6 #52, the same-step rule, on full attention + Mamba (align), block 16.

    Step 1: "a" (a 40-token prompt) is scheduled whole; its allocation caches
    full blocks [1, 2] and Mamba blocks [4, 5] (the state after 16 and 32
    tokens; block 6 holds the partial third block). In the same step "b",
    the same 40 tokens, hits 32 tokens ending on Mamba block 5, whose state
    is only written while step 1 runs: its allocation is refused (``None``)
    and changes nothing. After ``new_step_starts`` the same call succeeds and
    adopts the hit.
    """
    manager = make_manager([full(16), mamba(16)], 30)
    prompt = tokens((1, 16), (2, 16), (3, 8))
    manager.new_step_starts()
    a = kvcore.Request("a", prompt)
    assert manager.allocate_slots(a, 40) is not None
    assert manager.get_block_ids("a") == ([1, 2, 3], [4, 5, 6])
    b = kvcore.Request("b", prompt)
    hit, num_hit = manager.get_computed_blocks(b)
    assert (num_hit, hit.blocks) == (32, ([1, 2], [NULL, 5]))
    free_before = manager.num_free_blocks
    assert manager.allocate_slots(b, 8, num_hit, hit) is None
    assert manager.num_free_blocks == free_before
    assert manager.get_block_ids("b") == ([], [])
    a.num_computed_tokens = 40
    manager.new_step_starts()
    assert manager.allocate_slots(b, 8, num_hit, hit) is not None
    assert manager.get_block_ids("b") == ([1, 2, 7], [NULL, 5, 8])


def test_a_state_cached_in_an_earlier_step_is_adopted_at_once():
    """Same prompts, but "b" arrives one step after "a": no wait."""
    manager = make_manager([full(16), mamba(16)], 30)
    prompt = tokens((1, 16), (2, 16), (3, 8))
    manager.new_step_starts()
    admit(manager, kvcore.Request("a", prompt))
    manager.new_step_starts()
    b = kvcore.Request("b", prompt)
    hit, num_hit = manager.get_computed_blocks(b)
    assert num_hit == 32
    assert manager.allocate_slots(b, 8, num_hit, hit) is not None


def test_a_rolled_back_allocation_forgets_the_states_it_cached():
    """An operation that raises after caching leaves no state marked as cached this step."""
    manager = make_manager([full(16), mamba(16)], 30)
    (group_manager,) = [m for m in manager.coordinator.managers if isinstance(m, MambaManager)]
    manager.new_step_starts()
    a = kvcore.Request("a", tokens((1, 40)))
    original = group_manager.cache_blocks

    def cache_then_raise(request: kvcore.Request, num_tokens: int) -> None:
        original(request, num_tokens)
        assert group_manager.cached_blocks_this_step == {4, 5}
        raise RuntimeError("injected after caching")

    group_manager.cache_blocks = cache_then_raise  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        manager.allocate_slots(a, 40)
    assert group_manager.cached_blocks_this_step == set()
    assert manager.get_block_ids("a") == ([], [])


def test_an_engine_that_never_announces_steps_gets_the_reference_behaviour(caplog):
    """Without ``new_step_starts`` the same-step hit is adopted (vLLM 0.14), with a warning."""
    manager = make_manager([full(16), mamba(16)], 30)
    prompt = tokens((1, 16), (2, 16), (3, 8))
    assert manager.allocate_slots(kvcore.Request("a", prompt), 40) is not None
    b = kvcore.Request("b", prompt)
    hit, num_hit = manager.get_computed_blocks(b)
    with caplog.at_level("WARNING", logger="kvcore.mamba"):
        assert manager.allocate_slots(b, 8, num_hit, hit) is not None
    assert manager.get_block_ids("b") == ([1, 2, 7], [NULL, 5, 8])
    (record,) = caplog.records
    assert "never called KVCacheManager.new_step_starts()" in record.getMessage()
