from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import kvcore
from kvcore_plugins.full_attention import FullAttentionSpec


def full_spec(block_size: int = 16, **overrides: Any) -> FullAttentionSpec:
    fields: dict[str, Any] = {"num_kv_heads": 1, "head_size": 1, "dtype": "float32"}
    fields.update(overrides)
    return FullAttentionSpec(block_size=block_size, **fields)


@pytest.fixture(scope="session")
def registry() -> kvcore.Registry:
    """Only the built-in full-attention plugin: tests do not depend on what else is installed."""
    return kvcore.load_registry(only=["full_attention"])


@pytest.fixture
def make_manager(registry: kvcore.Registry) -> Callable[..., kvcore.KVCacheManager]:
    def make(
        num_blocks: int = 11,
        block_size: int = 16,
        max_model_len: int = 8192,
        **kwargs: Any,
    ) -> kvcore.KVCacheManager:
        config = kvcore.KVCacheConfig.from_specs(num_blocks, [full_spec(block_size)])
        return kvcore.KVCacheManager(config, max_model_len, registry=registry, **kwargs)

    return make
