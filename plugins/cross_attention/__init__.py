"""Cross attention (encoder-decoder models such as Whisper).

Keeps
    The keys and values of the request's encoder tokens: ``ceil(encoder tokens
    / block_size)`` blocks taken by the request's first allocation (sized by
    ``num_encoder_tokens``, not by decoder tokens), held until it ends.
Frees
    Nothing before the request ends.
Hits
    None: encoder output is unique per request, so the group is never
    prefix-cached. Looking it up or caching it raises
    :class:`~kvcore.errors.PrefixCachingNotSupportedError`, and a KV cache
    manager with a cross-attention group needs ``enable_caching=False``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.cross_attention.manager import CrossAttentionManager
from kvcore_plugins.cross_attention.model_config import kvcore_layer_kinds, kvcore_model_layers
from kvcore_plugins.cross_attention.spec import CrossAttentionSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "CrossAttentionManager",
    "CrossAttentionSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register cross attention."""
    return [kvcore.LayerType(CrossAttentionSpec, CrossAttentionManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[CrossAttentionSpec], ReferenceKernel]:
    """The reference kernel of cross attention (imports torch, so only when asked)."""
    from kvcore_plugins.cross_attention.kernel import CrossAttentionKernel

    return {CrossAttentionSpec: CrossAttentionKernel()}
