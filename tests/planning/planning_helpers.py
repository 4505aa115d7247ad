"""Shared helpers of the planning tests (imported, not a conftest).

The spec shapes follow the reference notes' §9.7 convention: ``P = 16 × 2 ×
64 × 4 × 2 = 16384`` bytes is the page of a block of 16 tokens, 2 KV heads,
head size 64, float32, keys and values.
"""

from __future__ import annotations

import functools
from typing import Any

import kvcore
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

P = 16 * 2 * 64 * 4 * 2
GIB = 1 << 30

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


@functools.cache
def registry() -> kvcore.Registry:
    """Every built-in plugin and nothing else installed."""
    return kvcore.load_registry(only=list(BUILTIN_PLUGINS))


def full(block_size: int = 16, head_size: int = 64, **kw: Any) -> FullAttentionSpec:
    fields = {"num_kv_heads": 2, "dtype": "float32", **kw}
    return FullAttentionSpec(block_size=block_size, head_size=head_size, **fields)


def sw(window: int = 1, block_size: int = 16, head_size: int = 64, **kw: Any) -> SlidingWindowSpec:
    fields = {"num_kv_heads": 2, "dtype": "float32", **kw}
    return SlidingWindowSpec(
        block_size=block_size, head_size=head_size, sliding_window=window, **fields
    )


def chunked(chunk: int = 64, block_size: int = 16, **kw: Any) -> ChunkedLocalAttentionSpec:
    fields = {"num_kv_heads": 2, "head_size": 64, "dtype": "float32", **kw}
    return ChunkedLocalAttentionSpec(block_size=block_size, attention_chunk_size=chunk, **fields)


def mamba(page: int = P, block_size: int = 16, **kw: Any) -> MambaSpec:
    """A Mamba spec whose state is ``page`` bytes of float32."""
    return MambaSpec(block_size=block_size, shapes=((page // 4,),), dtypes=("float32",), **kw)


def layers(**counts: Any) -> dict[str, Any]:
    """Layer dicts in the reference tests' naming: ``layers(full=2, sw=4)``.

    Names are ``l1, l2, ...`` in order: first every full layer, then every
    sliding-window layer (as the reference scenarios number them).
    """
    makers = {"full": full, "sw": sw, "chunked": chunked}
    specs = {}
    index = 1
    for kind, count in counts.items():
        for _ in range(count):
            specs[f"l{index}"] = makers[kind]()
            index += 1
    return specs


def names(groups: list[kvcore.KVCacheGroupSpec]) -> list[tuple[str, ...]]:
    return [group.layer_names for group in groups]
