from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
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


# -- the shared data folder ------------------------------------------------------------------

#: Third-party traces, read in place (never copied into the repository):
#: ``KVCORE_DATA``, else ``../shared/data`` next to the repository.
DATA = Path(
    os.environ.get("KVCORE_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


def require_shared_data(path: Path) -> Path:
    """Return ``path``; if it is missing, skip the test, or fail it under CI.

    A clone outside this workspace has no shared data: its tests skip with
    the reason. ``KVCORE_REQUIRE_DATA=1`` (set by ``.ci/run``) turns that skip
    into a failure, so CI cannot pass without reading the data.
    """
    if path.is_file():
        return path
    reason = (
        f"shared data missing: {path} is not there; set KVCORE_DATA to the folder holding mooncake/"
    )
    if os.environ.get("KVCORE_REQUIRE_DATA") == "1":
        pytest.fail(f"{reason} (KVCORE_REQUIRE_DATA=1: the shared data must be present)")
    pytest.skip(reason)


@pytest.fixture
def conversation_trace() -> Path:
    """The Mooncake conversation trace (skips, or fails under CI, when it is missing)."""
    return require_shared_data(DATA / "mooncake" / "mooncake_conversation_trace.jsonl")
