"""NVFP4 attention: full attention whose keys and values are stored in 4 bits.

Each value is a 4-bit E2M1 float and every 16 consecutive values of a key or
value vector share one E4M3 scale, both in the page
(:data:`~kvcore_plugins.nvfp4_attention.NVFP4`). The type keeps and hits
exactly as full attention does; its page is about a quarter of a bf16 one
(1,152 bytes per token for 8 KV heads of 128, against 4,096). Layers listed
as ``"nvfp4_attention"`` in a config's ``layer_types`` are planned with it,
next to the model's other layers in their own dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.nvfp4_attention.manager import NVFP4AttentionManager
from kvcore_plugins.nvfp4_attention.model_config import kvcore_layer_kinds
from kvcore_plugins.nvfp4_attention.spec import NVFP4, NVFP4AttentionSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "NVFP4",
    "NVFP4AttentionManager",
    "NVFP4AttentionSpec",
    "kvcore_layer_kinds",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register NVFP4 attention."""
    return [kvcore.LayerType(NVFP4AttentionSpec, NVFP4AttentionManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[NVFP4AttentionSpec], ReferenceKernel]:
    """The reference kernel, which quantizes on write (imports torch, so only when asked)."""
    from kvcore_plugins.nvfp4_attention.kernel import NVFP4AttentionKernel

    return {NVFP4AttentionSpec: NVFP4AttentionKernel()}
