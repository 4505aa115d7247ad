"""Multi-head latent attention (MLA, DeepSeek style): one latent vector per token.

Keeps
    Every block of a request until it ends, as full attention. A block's page
    is ``block_size`` latent vectors (``num_kv_heads × head_size`` elements,
    no separate value), or ``block_size`` packed records for a packed cache
    format (``fp8_ds_mla``: 656 bytes per token).
Frees
    Nothing before the request ends.
Hits
    As full attention: any cached prefix, found left to right.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.mla.manager import MLAAttentionManager
from kvcore_plugins.mla.model_config import kvcore_layer_kinds, kvcore_model_layers
from kvcore_plugins.mla.spec import CACHE_DTYPE_BYTES_PER_TOKEN, MLAAttentionSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "CACHE_DTYPE_BYTES_PER_TOKEN",
    "MLAAttentionManager",
    "MLAAttentionSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register multi-head latent attention."""
    return [kvcore.LayerType(MLAAttentionSpec, MLAAttentionManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[MLAAttentionSpec], ReferenceKernel]:
    """The reference kernel of multi-head latent attention (imports torch, so only when asked)."""
    from kvcore_plugins.mla.kernel import MLAAttentionKernel

    return {MLAAttentionSpec: MLAAttentionKernel()}
