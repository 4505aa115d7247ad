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
    manager = MambaManager(mamba(16), kvcore.BlockPool(4))
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
