"""The third-party example plugin, installed as its own distribution, end to end."""

from __future__ import annotations

import pytest

import kvcore
from kvcore.errors import InvalidSpecError, UnknownSpecError
from kvcore.testing import RandomWorkload, admit


def spec(**overrides):
    from kvcore_compressed import CompressedAttentionSpec

    fields = {"block_size": 16, "ratio": 4, "num_kv_heads": 2, "head_size": 64, "dtype": "bf16"}
    fields.update(overrides)
    return CompressedAttentionSpec(**fields)


def test_it_is_discovered_through_its_entry_point():
    registry = kvcore.load_registry(only=["compressed"])
    (plugin,) = registry.plugins
    assert (plugin.name, plugin.distribution, plugin.module) == (
        "compressed",
        "kvcore-compressed",
        "kvcore_compressed",
    )
    from kvcore_compressed import CompressedAttentionManager

    assert registry.manager_class(spec()) is CompressedAttentionManager


def test_its_page_holds_one_vector_per_ratio_tokens():
    # 16 / 4 = 4 vectors x 2 heads x (64 + 64) x 2 bytes.
    assert spec().page_size_bytes == 2048
    with pytest.raises(InvalidSpecError, match=r"block_size \(10\) must be a multiple of ratio"):
        spec(block_size=10)


def test_it_serves_an_engine_end_to_end():
    registry = kvcore.load_registry(only=["compressed"])
    config = kvcore.KVCacheConfig.from_specs(9, [spec()])
    manager = kvcore.KVCacheManager(config, max_model_len=1024, registry=registry)
    first = kvcore.Request("a", list(range(40)))
    assert admit(manager, first)[0].get_block_ids() == ([1, 2, 3],)
    second = kvcore.Request("b", list(range(33)))
    assert admit(manager, second)[1] == 32
    manager.free(first)
    manager.free(second)
    stats = RandomWorkload(manager, seed=3).run(500)
    assert stats.hit_tokens > 0


def test_disabled_it_is_named_as_the_plugin_to_enable():
    registry = kvcore.load_registry(disable=["compressed"])
    config = kvcore.KVCacheConfig.from_specs(9, [spec()])
    with pytest.raises(UnknownSpecError, match="belongs to plugin 'compressed'"):
        kvcore.KVCacheManager(config, max_model_len=1024, registry=registry)


def test_its_page_is_what_torch_allocates():
    """Formerly a 512-byte page part for a 128-byte page: a storage out-of-bounds error."""
    layer_specs = {"a": spec(), "b": spec()}
    groups = kvcore.planning.get_kv_cache_groups(layer_specs)
    config = kvcore.planning.get_kv_cache_config(groups, 0, num_blocks=8)
    buffers = kvcore.allocate_kv_cache(config)
    view = buffers["a"]
    # 16 / 4 = 4 vectors per block, 2 heads, 64 + 64 elements.
    assert tuple(view.shape) == (8, 4, 2, 128)
    assert buffers.buffer.numel() == 8 * 2 * 2048
