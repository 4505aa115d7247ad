"""Hidden-state cache: layers whose hidden states are stored in the KV cache.

Keeps
    Every block of a request until it ends, as full attention, in the group's
    own block table (one ``num_kv_heads × head_size`` vector per token, no
    value part).
Frees
    Nothing before the request ends.
Hits
    As full attention: any cached prefix, found left to right.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.hidden_state.manager import HiddenStateCacheManager
from kvcore_plugins.hidden_state.model_config import kvcore_layer_kinds
from kvcore_plugins.hidden_state.spec import HiddenStateCacheSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "HiddenStateCacheManager",
    "HiddenStateCacheSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register the hidden-state cache."""
    return [kvcore.LayerType(HiddenStateCacheSpec, HiddenStateCacheManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[HiddenStateCacheSpec], ReferenceKernel]:
    """The reference kernel of the hidden-state cache (imports torch, so only when asked)."""
    from kvcore_plugins.hidden_state.kernel import HiddenStateCacheKernel

    return {HiddenStateCacheSpec: HiddenStateCacheKernel()}
