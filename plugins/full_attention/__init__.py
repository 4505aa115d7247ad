"""Full attention: every token attends to every earlier token.

Every block of a request is kept until the request ends, and any cached prefix
of the prompt is a usable hit (found left to right, downward closed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.full_attention.manager import FullAttentionManager
from kvcore_plugins.full_attention.model_config import kvcore_layer_kinds, kvcore_model_layers
from kvcore_plugins.full_attention.spec import FullAttentionSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "FullAttentionManager",
    "FullAttentionSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register full attention."""
    return [kvcore.LayerType(FullAttentionSpec, FullAttentionManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[FullAttentionSpec], ReferenceKernel]:
    """The reference kernel of full attention (imports torch, so only when asked)."""
    from kvcore_plugins.full_attention.kernel import FullAttentionKernel

    return {FullAttentionSpec: FullAttentionKernel()}
