"""torch allocation: every layer's view sits exactly where the plan says, aliasing included."""

from __future__ import annotations

import itertools

import pytest
import torch
from planning_helpers import P, full, mamba, registry, sw

import kvcore
from kvcore.errors import InvalidConfigError


def _page_ranges(buffers: kvcore.KVCacheBuffers) -> dict[tuple[str, int], range]:
    """(layer, block) → the bytes of the buffer its views cover."""
    base = buffers.buffer.data_ptr()
    ranges = {}
    for layer, views in buffers.views.items():
        for block in range(buffers.config.num_blocks):
            starts = [v[block].data_ptr() - base for v in views]
            ends = [v[block].data_ptr() - base + v[block].nbytes for v in views]
            ranges[layer, block] = range(min(starts), max(ends))
    return ranges


def _check_writes_land_where_planned(buffers: kvcore.KVCacheBuffers) -> None:
    """Write through every view, one group at a time, and read the bytes back raw."""
    config = buffers.config
    raw_bytes = buffers.buffer.numpy()  # same memory; numpy compares faster here
    for group in config.kv_cache_groups:
        buffers.buffer.zero_()
        for layer in group.layer_names:
            tensor, index = config.tensor_of(layer)
            spec = config.layer_spec(layer)
            marker = (hash(layer) % 200) + 1
            for view, part in zip(buffers.views[layer], spec.page_parts(), strict=True):
                assert view.shape == (config.num_blocks, *part.shape)
                assert view.dtype == getattr(torch, part.dtype)
                raw = view.reshape(config.num_blocks, -1).view(torch.uint8)
                raw.fill_(marker)
            for block in range(config.num_blocks):
                start = tensor.page_offset(index, block)
                for part in spec.page_parts():
                    chunk = raw_bytes[start + part.offset : start + part.offset + part.nbytes]
                    assert (chunk == marker).all(), (layer, block, part.name)
        # Nothing of this group was written outside its pages.
        written = int((raw_bytes != 0).sum())
        expected = sum(
            part.nbytes * config.num_blocks
            for layer in group.layer_names
            for part in config.layer_spec(layer).page_parts()
        )
        assert written == expected


def _check_aliasing(buffers: kvcore.KVCacheBuffers, shared: set[frozenset[str]]) -> None:
    """Two layers' pages overlap exactly when they are in ``shared`` and at the same block."""
    ranges = _page_ranges(buffers)
    for (a, block_a), (b, block_b) in itertools.combinations(ranges, 2):
        if a == b:
            assert block_a == block_b or not _overlap(ranges[a, block_a], ranges[b, block_b])
            continue
        overlaps = _overlap(ranges[a, block_a], ranges[b, block_b])
        assert overlaps == (block_a == block_b and frozenset({a, b}) in shared), (a, b)


def _overlap(x: range, y: range) -> bool:
    return x.start < y.stop and y.start < x.stop


def test_hybrid_layer_outer_views_alias_the_ith_layers_of_groups():
    specs = {"f0": full(), "f1": full(), "s0": sw(), "s1": sw(), "s2": sw(), "s3": sw()}
    groups = kvcore.planning.get_kv_cache_groups(specs)
    config = kvcore.planning.get_kv_cache_config(groups, 6 * 2 * P)
    assert config.num_blocks == 6
    buffers = kvcore.allocate_kv_cache(config)
    assert buffers.buffer.numel() == 12 * P
    assert buffers["f0"].shape == (6, 16, 2, 128)
    _check_writes_land_where_planned(buffers)
    # Groups (f0, f1), (s0, s2), (s1, s3): slot 0 and slot 1 of each share bytes.
    _check_aliasing(
        buffers,
        {
            frozenset(pair)
            for pair in (
                ("f0", "s0"),
                ("f0", "s1"),
                ("s0", "s1"),
                ("f1", "s2"),
                ("f1", "s3"),
                ("s2", "s3"),
            )
        },
    )


def test_block_outer_views():
    specs = {"f0": full(), "f1": full(), "s0": sw(), "s1": sw()}
    groups = kvcore.planning.get_kv_cache_groups(specs, layout="block_outer")
    config = kvcore.planning.get_kv_cache_config(groups, 5 * 2 * P, layout="block_outer")
    buffers = kvcore.allocate_kv_cache(config)
    assert buffers["f1"].stride()[0] == 2 * P // 4  # elements of float32
    _check_writes_land_where_planned(buffers)
    _check_aliasing(buffers, {frozenset(("f0", "s0")), frozenset(("f1", "s1"))})


def test_uniform_type_layers_of_different_heads_never_alias():
    specs = {"wide": full(head_size=128), "narrow": full(head_size=64), "w2": full(head_size=128)}
    config = kvcore.planning.get_kv_cache_config(
        kvcore.planning.get_kv_cache_groups(specs), 4 * 5 * P
    )
    buffers = kvcore.allocate_kv_cache(config)
    assert buffers["narrow"].shape == (4, 16, 2, 128)
    assert buffers["wide"].shape == (4, 16, 2, 256)
    _check_writes_land_where_planned(buffers)
    _check_aliasing(buffers, set())


def test_padded_mamba_states_next_to_attention():
    specs = {"a": full(), "m0": mamba(P // 2), "m1": mamba(P // 2)}
    groups = kvcore.planning.get_kv_cache_groups(specs)
    config = kvcore.planning.get_kv_cache_config(groups, 3 * P)
    buffers = kvcore.allocate_kv_cache(config)
    (state,) = buffers.views["m0"]
    assert state.shape == (3, P // 8)
    assert state.stride() == (P // 4, 1)  # padded page: a full attention page apart
    _check_writes_land_where_planned(buffers)
    _check_aliasing(buffers, {frozenset(p) for p in (("a", "m0"), ("a", "m1"), ("m0", "m1"))})


def test_planned_hybrid_model_with_states_allocates():
    # 80 tokens: one block per group, 8 groups and the null block: 9 blocks of 1.25 MiB.
    p = kvcore.plan(
        "jamba-v0.1", memory="12MiB", max_model_len=80, registry=registry(), pool="shared"
    )
    assert p.num_blocks == 9
    buffers = kvcore.allocate_kv_cache(p.kv_cache_config)
    conv, ssm = buffers.views["model.layers.0.mamba"]
    assert conv.shape == (p.num_blocks, 3, 8192)
    assert ssm.shape == (p.num_blocks, 8192, 16)
    assert conv.dtype == ssm.dtype == torch.bfloat16
    assert buffers["model.layers.4.self_attn"].shape == (p.num_blocks, 80, 8, 256)
    with pytest.raises(InvalidConfigError, match="has 2 page parts"):
        buffers["model.layers.0.mamba"]
    _check_writes_land_where_planned(buffers)


def test_allocation_needs_a_planned_config():
    config = kvcore.KVCacheConfig.from_specs(4, [full()])
    with pytest.raises(InvalidConfigError, match="has no tensors"):
        kvcore.allocate_kv_cache(config)
    empty = kvcore.allocate_kv_cache(kvcore.planning.get_kv_cache_config([], 0))
    assert empty.buffer.numel() == 0
