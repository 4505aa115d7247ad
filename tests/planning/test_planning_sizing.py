"""Sizing and tensors: the reference notes' §9.7 scenarios 72-89 and 101-105."""

from __future__ import annotations

import attrs
import pytest
from planning_helpers import GIB, P, full, layers, mamba, sw

import kvcore
from kvcore._planning.sizing import (
    check_fits,
    fit_max_model_len,
    max_concurrency,
    memory_needed,
)
from kvcore.errors import InvalidConfigError
from kvcore.specs import TokenLimits
from kvcore_plugins.sink_full_attention import SinkFullAttentionSpec


def config_for(specs, memory, **kwargs):
    groups = kvcore.planning.get_kv_cache_groups(specs, hybrid=kwargs.pop("hybrid", True))
    return kvcore.planning.get_kv_cache_config(groups, memory, **kwargs)


def tensor(size, layers_, layer_stride, block_stride, offset=0):
    return kvcore.KVCacheTensor(
        size=size,
        layers=layers_,
        layer_stride=layer_stride,
        block_stride=block_stride,
        offset=offset,
    )


@pytest.mark.parametrize("kind", ["full", "sw"])
def test_72_73_one_group_one_tensor(kind):
    config = config_for(layers(**{kind: 2}), 64 * P)
    assert config.num_blocks == 32
    assert config.kv_cache_tensors == (tensor(64 * P, ["l1", "l2"], 32 * P, P),)


def test_74_hybrid_disabled_one_group_32_blocks():
    config = config_for(layers(full=1, sw=1), 64 * P, hybrid=False)
    assert config.num_blocks == 32
    assert len(config.kv_cache_groups) == 1


def test_75_two_groups_alias_the_same_bytes():
    config = config_for(layers(full=1, sw=1), 64 * P)
    assert config.num_blocks == 64
    assert config.kv_cache_tensors == (
        tensor(64 * P, ["l1"], 64 * P, P),
        tensor(64 * P, ["l2"], 64 * P, P),
    )


def test_76_three_groups_three_tensors():
    config = config_for(layers(full=2, sw=4), 64 * P)
    assert config.num_blocks == 32
    assert [t.layers for t in config.kv_cache_tensors] == [
        ("l1", "l2"),
        ("l3", "l5"),
        ("l4", "l6"),
    ]
    assert {t.size for t in config.kv_cache_tensors} == {64 * P}


def test_77_78_blocks_follow_the_widest_group():
    assert config_for(layers(full=3, sw=7), 96 * P).num_blocks == 32
    assert config_for(layers(full=6, sw=5), 192 * P).num_blocks == 32


def test_79_one_type_two_heads_tensor_offsets():
    config = config_for({"l1": full(head_size=128), "l2": full(head_size=64)}, 96 * P)
    assert config.num_blocks == 32
    assert config.kv_cache_tensors == (
        tensor(96 * P, ["l1"], 2 * P * 32, 2 * P, 0),
        tensor(96 * P, ["l2"], 32 * P, P, 64 * P),
    )


def test_80_81_unified_pages():
    assert config_for({"l1": full(), "l2": sw(head_size=32)}, 32 * P).num_blocks == 32
    config = config_for({"l1": full(), "l2": sw(head_size=96)}, 64 * P)
    assert config.num_blocks == 1_048_576 // 24_576 == 42


def test_82_block_override():
    config = config_for(layers(full=2), 64 * P, num_blocks=16)
    assert config.num_blocks == 16
    assert config.kv_cache_tensors[0].size == 32 * P


def test_83_no_layers_only_the_null_block():
    config = kvcore.planning.get_kv_cache_config([], 64 * P)
    assert (config.num_blocks, config.kv_cache_tensors, config.kv_cache_groups) == (1, (), ())


LIMITS = TokenLimits(max_model_len=16)


def test_84_tensor_parallel_workers_get_the_smallest_block_count():
    specs = layers(full=2)
    a, b = kvcore.planning.get_kv_cache_configs([specs, specs], [20 * P, 40 * P], LIMITS)
    assert a == b
    assert a.num_blocks == 10


def test_85_pipeline_stages_share_the_block_count():
    specs = layers(full=3)
    a, b = kvcore.planning.get_kv_cache_configs(
        [{"l1": specs["l1"]}, {"l2": specs["l2"], "l3": specs["l3"]}], [20 * P, 20 * P], LIMITS
    )
    assert (a.num_blocks, b.num_blocks) == (10, 10)
    assert a.kv_cache_tensors == (tensor(10 * P, ["l1"], 10 * P, P),)
    assert b.kv_cache_tensors == (tensor(20 * P, ["l2", "l3"], 10 * P, P),)


def test_86_hybrid_pipeline_stages_keep_empty_groups():
    specs = layers(full=2, sw=2)
    a, b = kvcore.planning.get_kv_cache_configs(
        [{k: specs[k] for k in ("l1", "l2")}, {k: specs[k] for k in ("l3", "l4")}],
        [20 * P, 20 * P],
        LIMITS,
    )
    assert [g.layer_names for g in a.kv_cache_groups] == [("l1", "l2"), ()]
    assert [g.layer_names for g in b.kv_cache_groups] == [(), ("l3", "l4")]
    assert (a.num_blocks, b.num_blocks) == (10, 10)


def test_87_strided_groups_give_every_stage_one_layer_per_group():
    full_l, sw_l = full(), sw()
    a = {"l1": full_l, "l2": sw_l, "l3": sw_l}
    b = {"l4": full_l, "l5": sw_l, "l6": sw_l}
    ca, cb = kvcore.planning.get_kv_cache_configs([a, b], [10 * P, 10 * P], LIMITS)
    assert [g.layer_names for g in ca.kv_cache_groups] == [("l1",), ("l2",), ("l3",)]
    assert [g.layer_names for g in cb.kv_cache_groups] == [("l4",), ("l5",), ("l6",)]
    assert (ca.num_blocks, cb.num_blocks) == (10, 10)


def test_88_conflicting_specs_of_one_layer():
    with pytest.raises(InvalidConfigError, match="layer 'l1' has different specs on two workers"):
        kvcore.planning.get_kv_cache_configs([{"l1": full()}, {"l1": sw()}], [P, P], LIMITS)


@pytest.mark.parametrize("memory", [(33 * P, 33 * P), (33 * P, 66 * P)])
def test_89_each_worker_checks_its_own_layers(memory):
    limits = TokenLimits(max_model_len=512)
    a, b = kvcore.planning.get_kv_cache_configs(
        [{"l1": full()}, {"l2": full()}], list(memory), limits
    )
    assert (a.num_blocks, b.num_blocks) == (33, 33)


def test_101_the_null_block_is_reserved_and_auto_fit():
    groups = kvcore.planning.get_kv_cache_groups(layers(full=1))
    limits = TokenLimits(max_model_len=512)  # 32 blocks of 16 tokens
    with pytest.raises(kvcore.errors.InsufficientMemoryError, match="needs 540672 bytes"):
        check_fits(groups, 32 * P, limits)
    check_fits(groups, 33 * P, limits)
    assert fit_max_model_len(groups, 64 * P, TokenLimits(max_model_len=4096)) == 63 * 16 == 1008


def test_102_auto_fit_keeps_a_length_that_fits():
    specs = {"f": full(), "m": mamba(P, block_size=1024, num_speculative_blocks=2)}
    groups = kvcore.planning.get_kv_cache_groups(specs)
    limits = TokenLimits(max_model_len=1024)
    assert fit_max_model_len(groups, P * (64 + 1 + 2 + 1), limits) == 1024
    assert fit_max_model_len(groups, P * (64 + 1 + 2), limits) < 1024


def test_103_override_too_small_for_the_length():
    limits = TokenLimits(max_model_len=16384)
    with pytest.raises(kvcore.errors.InsufficientMemoryError, match="max_model_len=16384"):
        kvcore.planning.get_kv_cache_configs([{"l1": full()}], [100 * GIB], limits, num_blocks=32)
    groups = kvcore.planning.get_kv_cache_groups({"l1": full()})
    assert 0 < fit_max_model_len(groups, 32 * P, limits) == 496 <= 512


def test_104_legacy_estimate_ignores_grouping():
    qwen = full(num_kv_heads=32, head_size=128, dtype="float16")
    specs = {f"l{i}": qwen for i in range(32)}
    estimate = kvcore.planning.estimate_max_model_len
    assert estimate(specs, 8 * GIB, TokenLimits(max_model_len=32768)) == 16384
    assert estimate(specs, 8 * GIB, TokenLimits(max_model_len=16383)) == 16383


def test_105_concurrency():
    def concurrency(specs, num_blocks, limits):
        config = config_for(specs, 0, num_blocks=num_blocks)
        return max_concurrency(config, limits)

    full_limits = TokenLimits(max_model_len=16384)
    assert concurrency({f"l{i}": full() for i in range(32)}, 1536, full_limits) == 1.5
    window = TokenLimits(max_model_len=16384, max_num_batched_tokens=1024)
    assert concurrency({"s": sw(1024)}, 387, window) == 3
    assert concurrency({"f": full(), "s": sw(1024)}, (1024 + 129) * 3, window) == 3
    unequal = [
        kvcore.KVCacheGroupSpec(layer_names=["f1", "f2"], kv_cache_spec=full()),
        kvcore.KVCacheGroupSpec(layer_names=["s"], kv_cache_spec=sw(1024)),
    ]
    config = kvcore.planning.get_kv_cache_config(unequal, 0, num_blocks=(1024 + 129) * 3)
    assert max_concurrency(config, window) == 3
    wide = {"f": full(head_size=128), "s": full(head_size=64)}
    assert concurrency(wide, 1024 * 3, window) == 3


def test_sink_blocks_count_in_sizing():
    sink = SinkFullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype="float32", sink_len=64
    )
    groups = kvcore.planning.get_kv_cache_groups({"l1": sink})
    limits = TokenLimits(max_model_len=512)
    # 32 blocks per request, 4 sink blocks once per pool, the null block.
    assert memory_needed(groups, limits) == (32 + 4 + 1) * P
    config = kvcore.planning.get_kv_cache_config(groups, 0, num_blocks=36 + 32)
    assert max_concurrency(config, limits) == 2.0


def test_tensors_of_groups_alias_exactly_block_by_block():
    config = config_for(layers(full=2, sw=4), 64 * P)
    starts: dict[int, set[str]] = {}
    for t in config.kv_cache_tensors:
        for j, layer in enumerate(t.layers):
            for block in range(config.num_blocks):
                starts.setdefault(t.page_offset(j, block), set()).add(layer)
    # Every page start is shared by one layer of each group (the i-th ones).
    assert {frozenset(v) for v in starts.values()} == {
        frozenset({"l1", "l3", "l4"}),
        frozenset({"l2", "l5", "l6"}),
    }


def test_block_outer_layout_strides():
    config = config_for(layers(full=2), 64 * P, layout="block_outer")
    assert config.kv_cache_tensors == (tensor(64 * P, ["l1", "l2"], P, 2 * P),)


def test_layer_outer_refuses_mixed_pages_across_groups():
    groups = [
        kvcore.KVCacheGroupSpec(layer_names=["a"], kv_cache_spec=full()),
        kvcore.KVCacheGroupSpec(layer_names=["b"], kv_cache_spec=full(head_size=128)),
    ]
    with pytest.raises(InvalidConfigError, match="use layout='block_outer'"):
        kvcore.planning.get_kv_cache_config(groups, 64 * P)
    assert (
        kvcore.planning.get_kv_cache_config(groups, 64 * P, layout="block_outer").num_blocks == 32
    )


def test_memory_too_small_for_one_block():
    with pytest.raises(kvcore.errors.InsufficientMemoryError, match="give at least 65536 bytes"):
        config_for(layers(full=2), 2 * P)


def test_memory_strings():
    parse = kvcore.planning.parse_memory
    assert parse("80GiB") == 80 * GIB
    assert parse("24GB") == 24 * 10**9
    assert parse("1.5 TiB") == 3 * 2**39
    assert parse(4096) == 4096
    assert parse("512") == 512
    with pytest.raises(InvalidConfigError, match="'G' alone is ambiguous"):
        parse("80G")
    with pytest.raises(InvalidConfigError, match="cannot read memory amount 'lots'"):
        parse("lots")
    with pytest.raises(InvalidConfigError, match="must not be negative"):
        parse(-1)
    assert kvcore.planning.format_bytes(80 * GIB) == "80.00 GiB"
    assert kvcore.planning.format_bytes(512) == "512 B"


def test_limits_are_checked_per_evolved_length():
    groups = kvcore.planning.get_kv_cache_groups({"l1": full()})
    limits = TokenLimits(max_model_len=4096)
    assert memory_needed(groups, attrs.evolve(limits, max_model_len=16)) == 2 * P
