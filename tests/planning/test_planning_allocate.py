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


# -- two-level pools: views by small-page id -----------------------------------------------


def _three_page_config(layout: str, num_large_pages: int = 4) -> kvcore.KVCacheConfig:
    """Three page sizes, two layers each, one class each (see the test below)."""
    from kvcore._planning.grouping import natural_page_groups
    from kvcore._planning.page_classes import page_classes
    from kvcore._planning.two_level import two_level_config

    specs = {
        "a0": full(block_size=4, head_size=8, num_kv_heads=1),  # 4 × 16 × 4 = 256 bytes
        "a1": full(block_size=4, head_size=8, num_kv_heads=1),
        "s0": sw(block_size=4, head_size=8, num_kv_heads=1, dtype="float16"),  # 128 bytes
        "s1": sw(block_size=4, head_size=8, num_kv_heads=1, dtype="float16"),
        "m0": mamba(384),  # 96 float32
        "m1": mamba(384),
    }
    groups = natural_page_groups(specs)
    classes = page_classes(groups, layout)
    memory = num_large_pages * classes.bytes_per_large_page
    return two_level_config(groups, classes, memory)


def _offset(buffers: kvcore.KVCacheBuffers, layer: str, block: int) -> int:
    return buffers.views[layer][0][block].data_ptr() - buffers.buffer.data_ptr()


def test_two_level_layer_outer_views_by_hand():
    """Pages 256 (a), 128 (s), 384 (m): classes 128, 256, 384, large page lcm 768.

    Groups (a0, a1), (s0, s1), (m0, m1): 2 runs of 4 large pages, 3,072 bytes
    each. Class 0 (s) has 6 small pages per large page, class 1 (a) 3, class
    2 (m) 2. Layer j of a group lies in run j, small page s at s × page:
    a1's page 5 at 3,072 + 5 × 256 = 4,352 (large page 5 // 3 = 1, third 2),
    m0's page 3 at 3 × 384 = 1,152 (large page 1, second half), s1's page 7
    at 3,072 + 7 × 128 = 3,968 (large page 1, page 1).
    """
    config = _three_page_config("layer_outer")
    pool = config.page_pool
    assert (pool.large_page_bytes, pool.num_large_pages) == (768, 4)
    assert pool.class_page_bytes == (128, 256, 384)
    assert pool.group_classes == (1, 0, 2)
    assert config.size_bytes == 2 * 4 * 768
    buffers = kvcore.allocate_kv_cache(config)
    assert buffers.buffer.numel() == 6144
    assert buffers["a0"].shape == (12, 4, 1, 16)
    assert buffers["s0"].shape == (24, 4, 1, 16)
    assert buffers.views["m0"][0].shape == (8, 96)
    assert [t.num_blocks for t in config.kv_cache_tensors] == [12, 24, 8]
    assert _offset(buffers, "a1", 5) == 4352 == 3072 + 1 * 768 + 2 * 256
    assert _offset(buffers, "m0", 3) == 1152 == 1 * 768 + 384
    assert _offset(buffers, "s1", 7) == 3968 == 3072 + 768 + 128
    assert buffers["a0"].stride()[0] == 256 // 4
    assert buffers.views["m1"][0].stride()[0] == 384 // 4


def test_two_level_block_outer_views_by_hand():
    """Block-outer: a small page holds the group's two layers, 512, 256 and 768 bytes.

    Classes 256 (s), 512 (a), 768 (m), large page lcm 1,536, one run of 4:
    6,144 bytes. a1's page 5 at 5 × 512 + 256 = 2,816 (large page 5 // 3 = 1),
    m1's page 3 at 3 × 768 + 384 = 2,688 (large page 3 // 2 = 1).
    """
    config = _three_page_config("block_outer")
    pool = config.page_pool
    assert (pool.large_page_bytes, pool.class_page_bytes) == (1536, (256, 512, 768))
    buffers = kvcore.allocate_kv_cache(config)
    assert buffers.buffer.numel() == 6144
    assert _offset(buffers, "a1", 5) == 2816
    assert _offset(buffers, "m1", 3) == 2688
    assert _offset(buffers, "s1", 23) == 23 * 256 + 128


@pytest.mark.parametrize("layout", ["layer_outer", "block_outer"])
def test_small_pages_lie_in_their_large_page(layout):
    """Small page s of class c is in large page s // k, and only large pages share bytes.

    Two small pages overlap only when they are of different classes carving
    the same large page (a large page belongs to one class at a time) or are
    the same block of one group; within a class, a large page's small pages
    tile it.
    """
    config = _three_page_config(layout)
    pool = config.page_pool
    buffers = kvcore.allocate_kv_cache(config)
    run_bytes = pool.large_page_bytes * pool.num_large_pages
    pages = {}  # (layer, block) -> (class, large page, byte range)
    for group_id, group in enumerate(config.kv_cache_groups):
        klass = pool.group_classes[group_id]
        k = pool.pages_per_large_page(klass)
        for layer in group.layer_names:
            view = buffers.views[layer][0]
            assert view.shape[0] == pool.num_blocks(klass)
            for block in range(view.shape[0]):
                start = _offset(buffers, layer, block)
                nbytes = config.layer_spec(layer).page_size_bytes
                large = (start % run_bytes) // pool.large_page_bytes
                assert large == block // k
                assert start % run_bytes + nbytes <= (large + 1) * pool.large_page_bytes
                pages[layer, block] = (group_id, klass, large, range(start, start + nbytes))
    for (layer_a, block_a), (layer_b, block_b) in itertools.combinations(pages, 2):
        group_a, class_a, large_a, bytes_a = pages[layer_a, block_a]
        group_b, class_b, large_b, bytes_b = pages[layer_b, block_b]
        if not _overlap(bytes_a, bytes_b):
            continue
        assert large_a == large_b, (layer_a, block_a, layer_b, block_b)
        same_block = group_a == group_b and block_a == block_b
        assert class_a != class_b or same_block, (layer_a, block_a, layer_b, block_b)


@pytest.mark.parametrize("layout", ["layer_outer", "block_outer"])
def test_two_level_writes_land_where_planned(layout):
    config = _three_page_config(layout)
    buffers = kvcore.allocate_kv_cache(config)
    raw_bytes = buffers.buffer.numpy()
    for group in config.kv_cache_groups:
        buffers.buffer.zero_()
        for layer in group.layer_names:
            tensor, index = config.tensor_of(layer)
            spec = config.layer_spec(layer)
            for view in buffers.views[layer]:
                view.reshape(view.shape[0], -1).view(torch.uint8).fill_(7)
            for block in range(tensor.num_blocks):
                start = tensor.page_offset(index, block)
                for part in spec.page_parts():
                    chunk = raw_bytes[start + part.offset : start + part.offset + part.nbytes]
                    assert (chunk == 7).all(), (layer, block, part.name)
        # Exactly the group's pages were written; with no padding and as many layers
        # as runs, a group's small pages cover the whole buffer (any class may come
        # to own every large page).
        expected = sum(
            config.tensor_of(layer)[0].num_blocks * config.layer_spec(layer).page_size_bytes
            for layer in group.layer_names
        )
        assert int((raw_bytes != 0).sum()) == expected == config.size_bytes


def test_planned_two_level_model_allocates():
    """jamba-v0.1 at 80 tokens in 24 MiB: 24 MiB // 4,980,736 = 5 large pages.

    Attention views count 5 × 19 = 95 small pages, state views 5 × 4 = 20.
    """
    p = kvcore.plan("jamba-v0.1", memory="24MiB", max_model_len=80, registry=registry())
    assert p.num_blocks == 5
    buffers = kvcore.allocate_kv_cache(p.kv_cache_config)
    conv, ssm = buffers.views["model.layers.0.mamba"]
    assert conv.shape == (20, 3, 8192)
    assert ssm.shape == (20, 8192, 16)
    assert buffers["model.layers.4.self_attn"].shape == (95, 16, 8, 256)
    assert buffers.buffer.numel() == 5 * 4 * 1_245_184
