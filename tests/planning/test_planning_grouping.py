"""Grouping: the reference notes' §9.7 scenarios (numbers in the test names) and the gcd rule."""

from __future__ import annotations

import itertools
import math
import random

import attrs
import pytest
from planning_helpers import P, chunked, full, layers, mamba, names, sw

import kvcore
from kvcore._planning.group_size import (
    approximate_gcd,
    gcd_group_size,
    padding_slots,
    reference_group_size,
)
from kvcore._planning.unify import (
    PageUnificationError,
    is_uniform_spec,
    is_uniform_type,
    promote_local_layers,
    unify_page_sizes,
)
from kvcore.errors import InvalidConfigError, InvalidSpecError
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.hidden_state import HiddenStateCacheSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.mla import MLAAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

groups_of = kvcore.planning.get_kv_cache_groups


# -- 72-78: one type, or full + sliding window with equal pages ---------------------------


def test_72_73_one_spec_is_one_group():
    for specs in (layers(full=2), layers(sw=2)):
        (group,) = groups_of(specs)
        assert group.layer_names == ("l1", "l2")
        assert group.kv_cache_spec == specs["l1"]
        assert group.layer_specs is None


def test_74_hybrid_disabled_allocates_the_window_as_full_attention():
    (group,) = groups_of(layers(full=1, sw=1), hybrid=False)
    assert group.layer_names == ("l1", "l2")
    assert group.kv_cache_spec == full(compute_spec=sw(1))


def test_75_full_and_sliding_window_are_two_groups():
    assert names(groups_of(layers(full=1, sw=1))) == [("l1",), ("l2",)]


def test_76_two_full_four_sliding_window_strided():
    assert names(groups_of(layers(full=2, sw=4))) == [("l1", "l2"), ("l3", "l5"), ("l4", "l6")]


def test_77_three_full_seven_sliding_window():
    assert names(groups_of(layers(full=3, sw=7))) == [
        ("l1", "l2", "l3"),
        ("l4", "l7", "l10"),
        ("l5", "l8"),
        ("l6", "l9"),
    ]


def test_78_draft_layer_below_one_and_a_half_pads_one_slot():
    groups = groups_of(layers(full=6, sw=5))
    assert [len(g.layer_names) for g in groups] == [6, 5]
    assert kvcore.planning.get_kv_cache_config(groups, 192 * P).num_blocks == 32


# -- 79-81, 90-93: different pages of one type, merging, uniformity -----------------------


def test_79_93_one_type_different_heads_is_one_group_with_each_layers_spec():
    specs = {"l1": full(head_size=128), "l2": full(head_size=64)}
    (group,) = groups_of(specs)
    assert group.layer_names == ("l1", "l2")
    assert group.layer_specs == (specs["l1"], specs["l2"])
    # The manager follows the first layer's spec (the scheduler's view).
    assert group.kv_cache_spec == specs["l1"]
    assert group.bytes_per_block == 3 * P


def test_80_smaller_divisible_page_doubles_the_block_size():
    groups = groups_of({"l1": full(), "l2": sw(head_size=32)})
    assert [g.kv_cache_spec.block_size for g in groups] == [16, 32]
    assert {g.kv_cache_spec.page_size_bytes for g in groups} == {P}


def test_81_page_that_does_not_divide_is_padded():
    specs = {"l1": full(), "l2": sw(head_size=96)}
    groups = groups_of(specs)
    assert groups[0].kv_cache_spec == full(page_size_padded=24576)
    assert groups[1].kv_cache_spec == specs["l2"]


def test_83_no_layers_no_groups():
    assert groups_of({}) == []


def test_90_merge():
    with pytest.raises(InvalidSpecError, match="need the same shape"):
        FullAttentionSpec.merge([full(num_kv_heads=32), full(num_kv_heads=16)])
    with pytest.raises(InvalidSpecError, match="SlidingWindowSpec layer cannot share a group"):
        FullAttentionSpec.merge([full(), sw()])
    with pytest.raises(InvalidSpecError, match="identical specs"):
        SlidingWindowSpec.merge([sw(), full()])
    with pytest.raises(InvalidSpecError, match=r"compute different local attentions \(.*window=1"):
        FullAttentionSpec.merge([full(), full(compute_spec=sw(1)), full(compute_spec=sw(2))])
    assert FullAttentionSpec.merge([full(compute_spec=sw(1))] * 2).compute_spec == sw(1)
    assert FullAttentionSpec.merge([full(compute_spec=sw(1)), full()]).compute_spec == sw(1)
    with pytest.raises(InvalidSpecError, match="compute different local attentions"):
        FullAttentionSpec.merge([full(compute_spec=sw(1)), full(compute_spec=chunked(64))])


def test_91_uniform_spec():
    assert is_uniform_spec([full(), full()])
    assert is_uniform_spec([full(), full(compute_spec=sw(1))])
    assert not is_uniform_spec([full(), sw(1)])
    assert is_uniform_spec([sw(1), sw(1)])
    assert not is_uniform_spec([sw(1), sw(2)])


def test_92_uniform_type():
    assert is_uniform_type([full(head_size=64), full(head_size=128)])
    assert not is_uniform_type([full(), sw()])
    assert not is_uniform_type([sw(), full()])
    assert is_uniform_type([sw(1, head_size=64), sw(1, head_size=128)])
    assert not is_uniform_type([full(block_size=16), full(block_size=32)])


def test_two_recorded_windows_are_one_type_not_an_escaping_error():
    # The reference lets merge's ValueError escape here (its notes, §10.2).
    specs = {"l1": full(compute_spec=sw(1)), "l2": full(compute_spec=sw(2))}
    (group,) = groups_of(specs)
    assert group.layer_specs == (specs["l1"], specs["l2"])


# -- 94-99: packed groups, hidden states, MLA, padding, Mamba ------------------------------


def _mla(head_size: int = 576, dtype: str = "bfloat16", block_size: int = 64) -> MLAAttentionSpec:
    return MLAAttentionSpec(block_size=block_size, head_size=head_size, dtype=dtype)


def test_94_block_outer_packs_mla_with_its_indexer_and_splits_the_windows():
    specs = {}
    for i in range(3):
        specs[f"mla.{i}"] = _mla()
        specs[f"indexer.{i}"] = _mla(head_size=132, dtype="uint8")
    for i in range(5):
        specs[f"swa.{i}"] = SlidingWindowSpec(
            block_size=64, num_kv_heads=1, head_size=1024, dtype="bfloat16", sliding_window=128
        )
    groups = groups_of(specs, layout="block_outer")
    assert names(groups) == [
        ("mla.0", "indexer.0", "mla.1", "indexer.1", "mla.2", "indexer.2"),
        ("swa.0", "swa.2", "swa.4"),
        ("swa.1", "swa.3"),
    ]
    assert groups[0].layer_specs is not None
    assert groups[0].kv_cache_spec == specs["mla.0"]
    config = kvcore.planning.get_kv_cache_config(
        groups, 100 * groups[0].bytes_per_block, layout="block_outer"
    )
    widest = max(g.bytes_per_block for g in groups)
    assert config.num_blocks == 100 * groups[0].bytes_per_block // widest


@pytest.mark.parametrize(("state_page", "states_per_group"), [(40_000, 2), (100_000, 1)])
def test_94_packing_never_lets_a_state_bucket_widen_the_block(state_page, states_per_group):
    specs = {}
    for i in range(2):
        specs[f"mla.{i}"] = _mla()
        specs[f"indexer.{i}"] = _mla(head_size=132, dtype="uint8")
    specs.update({f"m.{i}": mamba(state_page, block_size=64) for i in range(6)})
    groups = groups_of(specs, layout="block_outer")
    attention_block = 2 * (73_728 + 8_448)
    assert groups[0].bytes_per_block == attention_block
    assert [len(g.layer_names) for g in groups[1:]] == [states_per_group] * (6 // states_per_group)
    assert max(g.bytes_per_block for g in groups) == attention_block


def test_95_hidden_state_layer_gets_its_own_group_fitted_to_the_common_page():
    attention = FullAttentionSpec(block_size=544, num_kv_heads=1, head_size=512, dtype="bfloat16")
    state = MambaSpec(
        block_size=544, shapes=((557_056,),), dtypes=("bfloat16",), mamba_cache_mode="align"
    )
    hidden = HiddenStateCacheSpec(block_size=16, num_kv_heads=3, head_size=1024, dtype="bfloat16")
    assert attention.page_size_bytes == state.page_size_bytes == 1_114_112
    groups = groups_of({"attn": attention, "mamba": state, "hidden": hidden})
    assert names(groups) == [("attn",), ("mamba",), ("hidden",)]
    fitted = groups[2].kv_cache_spec
    assert fitted.block_size == 136
    assert fitted.page_size_bytes == 1_114_112
    sizes = [g.kv_cache_spec.block_size for g in groups]
    assert (math.lcm(*sizes), math.gcd(*sizes)) == (544, 136)


def test_hidden_state_wider_than_the_page_scales_every_group():
    attention = full()  # 16 tokens, page P
    hidden = HiddenStateCacheSpec(block_size=16, num_kv_heads=4, head_size=4096, dtype="float32")
    groups = groups_of({"a": attention, "s": sw(), "h": hidden})
    # One hidden token is 64 KiB = 4 pages: every page grows 4 times.
    assert [g.kv_cache_spec.block_size for g in groups] == [64, 64, 1]
    assert {g.kv_cache_spec.page_size_bytes for g in groups} == {4 * P}


def test_96_equal_pages_of_mla_and_a_window_are_two_plain_groups():
    mla = _mla(dtype="float32", block_size=16)
    draft = SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=288, dtype="float32", sliding_window=64
    )
    assert mla.page_size_bytes == draft.page_size_bytes == 36_864
    groups = groups_of({"mla": mla, "draft": draft})
    assert names(groups) == [("mla",), ("draft",)]
    assert [g.layer_specs for g in groups] == [None, None]


def test_97_mla_that_cannot_be_padded_falls_back_to_full_allocation_of_the_window():
    draft = SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=64, dtype="bfloat16", sliding_window=128
    )
    specs = {"mla": _mla(), "indexer": _mla(head_size=132, dtype="uint8"), "draft": draft}
    with pytest.raises(PageUnificationError, match="layer 'indexer'"):
        unify_page_sizes(specs)
    (group,) = groups_of(specs)
    assert group.layer_names == ("mla", "indexer", "draft")
    assert group.kv_cache_spec == specs["mla"]
    assert group.layer_specs is not None
    assert group.layer_specs[2] == FullAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=64, dtype="bfloat16", compute_spec=draft
    )


def test_97_no_fallback_with_chunked_layers():
    specs = {
        "mla": _mla(),
        "indexer": _mla(head_size=132, dtype="uint8"),
        "local": chunked(chunk=64, block_size=16, num_kv_heads=1, dtype="bfloat16"),
    }
    with pytest.raises(InvalidConfigError, match=r"layer 'indexer' \(MLAAttentionSpec"):
        groups_of(specs)


def test_98_non_divisible_draft_window_is_padded_keeping_its_block_size():
    target = full(head_size=192, dtype="bfloat16")
    draft = sw(head_size=128, dtype="bfloat16")
    unified = unify_page_sizes({"t": target, "d": draft})
    assert unified["d"] == attrs.evolve(draft, page_size_padded=target.page_size_bytes)
    assert unified["d"].block_size == 16


def test_99_mamba_pages_are_padded():
    kib = 1024
    # Mamba 16 KiB + attention 16 KiB + draft attention 32 KiB.
    out = unify_page_sizes({"m": mamba(16 * kib), "a": full(), "d": full(head_size=128)})
    assert out["m"] == mamba(16 * kib, page_size_padded=32 * kib)
    assert out["a"].block_size == 32
    assert out["d"] == full(head_size=128)
    # Already padded Mamba, padded further.
    out = unify_page_sizes(
        {"m": mamba(16 * kib, page_size_padded=24 * kib), "d": full(head_size=128)}
    )
    assert out["m"].page_size_bytes == 32 * kib
    # Mamba of 24 KiB next to a 32 KiB page.
    out = unify_page_sizes({"m": mamba(24 * kib), "d": full(head_size=128)})
    assert out["m"].page_size_bytes == 32 * kib
    # Attention with block 24 (24 KiB) next to 32 KiB: padded, block kept.
    out = unify_page_sizes({"a": full(block_size=24), "d": full(head_size=128)})
    assert (out["a"].block_size, out["a"].page_size_bytes) == (24, 32 * kib)
    # Equal pages: unchanged.
    specs = {"a": full(), "m": mamba(P)}
    assert unify_page_sizes(specs) == specs


def test_100_unified_mode_promotions():
    kib = 1024
    wide = FullAttentionSpec(block_size=64, num_kv_heads=1, head_size=256, dtype="bfloat16")
    window = SlidingWindowSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=256,
        dtype="bfloat16",
        sliding_window=1024,
        page_size_padded=32 * kib,
    )
    out = promote_local_layers({"f": wide, "s": window})
    assert out["s"] == FullAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=256,
        dtype="bfloat16",
        compute_spec=window,
        page_size_padded=64 * kib,
    )
    narrow = attrs.evolve(wide, block_size=16)
    local = chunked(
        chunk=512, num_kv_heads=1, head_size=256, dtype="bfloat16", page_size_padded=32 * kib
    )
    out = promote_local_layers({"f": narrow, "c": local})
    assert out["c"] == FullAttentionSpec(
        block_size=16,
        num_kv_heads=1,
        head_size=256,
        dtype="bfloat16",
        compute_spec=local,
        page_size_padded=32 * kib,
    )
    out = promote_local_layers({"f": full(), "s": sw(), "c": chunked()})
    assert {type(s) for s in out.values()} == {FullAttentionSpec}
    with pytest.raises(InvalidConfigError, match="hybrid KV cache manager is disabled"):
        promote_local_layers({"s": sw(), "c": chunked()})


# -- 106-110: layer patterns of real models --------------------------------------------------


def _pattern(full_layers: int, other: int, maker=sw) -> dict:
    specs = {f"full.{i}": full() for i in range(full_layers)}
    specs.update({f"other.{i}": maker() for i in range(other)})
    return specs


@pytest.mark.parametrize(
    ("full_layers", "sw_layers", "sizes", "padding"),
    [
        (13, 12, [13, 12], 1),  # 106: gpt-oss-20b + EAGLE drafter
        (10, 52, [10, 9, 9, 9, 9, 8, 8], 8),  # 107: Gemma-3-27B
        (4, 22, [4, 4, 4, 4, 4, 3, 3], 2),  # 108: Gemma-3-1B
        (20, 30, [20, 15, 15], 10),  # 110
    ],
)
def test_106_to_110_reference_group_sizes(full_layers, sw_layers, sizes, padding):
    groups = groups_of(_pattern(full_layers, sw_layers))
    assert [len(g.layer_names) for g in groups] == sizes
    widest = max(sizes)
    assert sum(widest - size for size in sizes) == padding
    assert max(g.bytes_per_block for g in groups) == widest * P


def test_107_sliding_window_groups_are_strided():
    groups = groups_of(_pattern(10, 52))
    assert groups[1].layer_names == tuple(f"other.{i}" for i in range(0, 52, 6))


def test_109_llama4_like_is_four_groups_of_twelve():
    groups = groups_of(_pattern(12, 36, maker=chunked))
    assert [len(g.layer_names) for g in groups] == [12, 12, 12, 12]


# -- the gcd rule ------------------------------------------------------------------------------


def test_gcd_rule_pads_none_of_twenty_full_thirty_sliding():
    groups = groups_of(_pattern(20, 30), group_size_rule="gcd")
    assert [len(g.layer_names) for g in groups] == [10, 10, 10, 10, 10]
    assert reference_group_size([20, 30]) == 20
    assert padding_slots([20, 30], 20) == [0, 10]
    assert padding_slots([20, 30], 10) == [0, 0]


def test_gcd_rule_weighs_padding_by_the_blocks_each_bucket_holds():
    # Gemma-3-27B at 128k: a padded full-attention slot costs 8192 blocks per
    # request, a padded sliding-window slot 577. Size 13 pads only the full
    # bucket (3 slots): unweighted it ties with size 5, weighted it loses.
    assert gcd_group_size([10, 52]) == 13
    assert gcd_group_size([10, 52], weights=[8192, 577]) == 5
    assert gcd_group_size([13, 12]) == 13  # within the 2x group budget nothing beats it


def test_gcd_rule_never_wastes_more_than_the_reference():
    rng = random.Random(7)
    for _ in range(400):
        sizes = [rng.randint(1, 60) for _ in range(rng.randint(2, 4))]
        weights = [rng.randint(1, 9000) for _ in sizes]
        ours = gcd_group_size(sizes, weights)
        ref = reference_group_size(sizes)

        def waste(size, sizes=sizes, weights=weights):
            return sum(p * w for p, w in zip(padding_slots(sizes, size), weights, strict=True))

        assert waste(ours) <= waste(ref)
        if math.gcd(*sizes) >= ref / 2:
            assert waste(ours) == 0


def test_approximate_gcd():
    assert approximate_gcd([3, 5], lower_bound=3) == 3
    assert approximate_gcd([6, 9, 12]) == 3
    assert approximate_gcd([4], lower_bound=9) == 9


# -- invariants ------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", ["reference", "gcd"])
def test_grouping_is_an_exact_partition_with_one_page_size(rule):
    rng = random.Random(3)
    makers = [full, lambda: sw(8), lambda: sw(32), chunked, lambda: mamba(P)]
    for full_layers, others in itertools.product(range(1, 6), range(0, 14, 3)):
        specs = {f"f{i}": full() for i in range(full_layers)}
        specs.update({f"o{i}": rng.choice(makers)() for i in range(others)})
        groups = groups_of(specs, group_size_rule=rule)
        seen = [name for g in groups for name in g.layer_names]
        assert sorted(seen) == sorted(specs)
        assert len({s.page_size_bytes for g in groups for _, s in g.items()}) == 1


def test_no_hybrid_suggests_the_shared_key_to_a_type_that_keeps_every_token():
    from kvcore_compressed import CompressedAttentionSpec

    from kvcore._planning.unify import promote_local_layers
    from kvcore.errors import InvalidConfigError
    from kvcore_plugins.full_attention import FullAttentionSpec

    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    other = CompressedAttentionSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype="float16", ratio=4
    )
    with pytest.raises(InvalidConfigError) as info:
        promote_local_layers({"a": full, "b": other})
    message = str(info.value)
    assert "Enable the hybrid manager (hybrid=True)" in message
    assert "If CompressedAttentionSpec keeps a slot for every token" in message
    assert "uniform_type_key returning kvcore.specs.ALL_TOKENS_KEY" in message
    # Full attention alone has nothing to be told.
    assert promote_local_layers({"a": full, "b": full}) == {"a": full, "b": full}
