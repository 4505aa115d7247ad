"""Shared helpers of the attention-type plugin tests (imported, not a conftest)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import kvcore
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.cross_attention import CrossAttentionSpec
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.hidden_state import HiddenStateCacheSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.mla import MLAAttentionSpec
from kvcore_plugins.nvfp4_attention import NVFP4AttentionSpec
from kvcore_plugins.sink_full_attention import SinkFullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

#: The nine built-in plugins, by entry-point name.
BUILTIN_PLUGINS = (
    "full_attention",
    "sliding_window",
    "chunked_local",
    "mamba",
    "cross_attention",
    "sink_full_attention",
    "mla",
    "hidden_state",
    "nvfp4_attention",
)

NULL = kvcore.managers.NULL_BLOCK


@functools.cache
def registry() -> kvcore.Registry:
    """Every built-in plugin, and nothing else that happens to be installed."""
    return kvcore.load_registry(only=list(BUILTIN_PLUGINS))


def full(block_size: int = 16, **kw: Any) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16", **kw
    )


def sw(window: int, block_size: int = 16, **kw: Any) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=8,
        dtype="float16",
        sliding_window=window,
        **kw,
    )


def chunked(chunk: int, block_size: int = 16) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=8,
        dtype="float16",
        attention_chunk_size=chunk,
    )


def mamba(
    block_size: int = 16, mode: str = "align", spec_blocks: int = 0, prefill_states: str = "every"
) -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=((2, 8), (4, 8)),
        dtypes=("float32", "float32"),
        mamba_cache_mode=mode,
        num_speculative_blocks=spec_blocks,
        prefill_states=prefill_states,
    )


def cross(block_size: int = 16) -> CrossAttentionSpec:
    return CrossAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16")


def sink(sink_len: int, block_size: int = 16) -> SinkFullAttentionSpec:
    return SinkFullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16", sink_len=sink_len
    )


def mla(block_size: int = 16, cache_dtype_str: str | None = None) -> MLAAttentionSpec:
    return MLAAttentionSpec(
        block_size=block_size, head_size=576, dtype="bfloat16", cache_dtype_str=cache_dtype_str
    )


def nvfp4(block_size: int = 16) -> NVFP4AttentionSpec:
    return NVFP4AttentionSpec(block_size=block_size, num_kv_heads=1, head_size=16, dtype="nvfp4")


def hidden(block_size: int = 16) -> HiddenStateCacheSpec:
    return HiddenStateCacheSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype="float16")


def make_manager(
    specs: Sequence[kvcore.specs.KVCacheSpec],
    num_blocks: int,
    max_model_len: int = 4096,
    **kwargs: Any,
) -> kvcore.KVCacheManager:
    """A manager with one single-layer group per spec, served by the built-in plugins."""
    config = kvcore.KVCacheConfig.from_specs(num_blocks, list(specs))
    return kvcore.KVCacheManager(config, max_model_len, registry=registry(), **kwargs)


def tokens(*runs: tuple[int, int]) -> list[int]:
    """``tokens((7, 16), (8, 5))`` = sixteen 7s then five 8s."""
    out: list[int] = []
    for value, count in runs:
        out += [value] * count
    return out


def cached_pattern(
    pattern: Sequence[bool], block_size: int, num_groups: int = 1, free: bool = False
) -> tuple[kvcore.managers.BlockPool, list[str], list[list[int]]]:
    """A pool whose cache holds a block at position ``i`` iff ``pattern[i]``.

    Returns the pool, the hashes of every position (``"h<i>"``) and, per group,
    the block cached at each position (``NULL`` where none is). Positions are
    cached in every group; group ``g``'s blocks are allocated after group
    ``g - 1``'s. The blocks are held (reference count 1) unless ``free``:
    then they are freed, first position first, and stay cached.
    """
    pool = kvcore.managers.BlockPool(len(pattern) * num_groups + 1, num_groups=num_groups)
    hashes = [f"h{i}" for i in range(len(pattern))]
    request = kvcore.Request("pattern", [0] * max(1, len(pattern) * block_size))
    request.block_hashes.extend(hashes)
    tables = []
    for group in range(num_groups):
        table = [NULL] * len(pattern)
        for i, hit in enumerate(pattern):
            if hit:
                table[i] = pool.get_new_blocks(1)[0]
        pool.cache_full_blocks(request, table, 0, len(pattern), block_size, group)
        tables.append(table)
    if free:
        for table in tables:
            pool.free_blocks(table)
    return pool, hashes, tables
