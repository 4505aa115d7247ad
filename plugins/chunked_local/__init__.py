"""Chunked local attention (Llama-4 style): each token attends within its own chunk.

Keeps
    The blocks of the current chunk (``attention_chunk_size`` tokens, a
    multiple of the block size), plus the blocks of the tokens being computed.
Frees
    Every block of the earlier chunks, once the next token starts a new chunk;
    freed positions become null blocks in the block table.
Hits
    Everything before the chunk of the hit's end counts as computed (null
    blocks, no lookup); inside that chunk the cached blocks are taken left to
    right until the first miss. Not supported with EAGLE under prefix
    caching, nor with a hit alignment other than its block size (both refused
    when the KV cache manager is built).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.chunked_local.manager import ChunkedLocalAttentionManager
from kvcore_plugins.chunked_local.model_config import kvcore_layer_kinds, kvcore_model_layers
from kvcore_plugins.chunked_local.spec import ChunkedLocalAttentionSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "ChunkedLocalAttentionManager",
    "ChunkedLocalAttentionSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register chunked local attention."""
    return [kvcore.LayerType(ChunkedLocalAttentionSpec, ChunkedLocalAttentionManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[ChunkedLocalAttentionSpec], ReferenceKernel]:
    """The reference kernel of chunked local attention (imports torch, so only when asked)."""
    from kvcore_plugins.chunked_local.kernel import ChunkedLocalAttentionKernel

    return {ChunkedLocalAttentionSpec: ChunkedLocalAttentionKernel()}
