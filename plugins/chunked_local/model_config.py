"""Chunked local attention layers from a model config (kind ``"chunked_attention"``)."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore_plugins.chunked_local.spec import ChunkedLocalAttentionSpec

__all__ = ["build_chunked_local", "kvcore_layer_kinds"]


def build_chunked_local(layer: kvcore.LayerConfig) -> ChunkedLocalAttentionSpec:
    """A chunked layer; the chunk is the config's ``attention_chunk_size`` (Llama-4)."""
    return ChunkedLocalAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        attention_chunk_size=int(layer.require("attention_chunk_size")),
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> dict[str, Callable[[kvcore.LayerConfig], ChunkedLocalAttentionSpec]]:
    """Claim ``"chunked_attention"`` layers."""
    return {"chunked_attention": build_chunked_local}
