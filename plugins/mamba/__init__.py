"""Mamba and linear-attention state: a fixed-size recurrent state per request.

Keeps
    The state after the last computed token (block ``i`` of the table holds
    the state after ``(i + 1) × block_size`` tokens), plus
    ``num_speculative_blocks`` blocks for speculative decoding.
Frees
    Every earlier state block as the request advances (skipped tokens =
    computed tokens − 1); freed positions become null blocks.
Hits
    In ``mamba_cache_mode="align"``, the latest cached state at an aligned
    position, searched right to left: ``i`` null blocks and the state block.
    In ``"none"`` mode the group is never prefix-cached, and prefix caching
    must be off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.mamba.manager import MambaManager
from kvcore_plugins.mamba.model_config import (
    kvcore_layer_kinds,
    kvcore_model_layers,
    kvcore_plan_options,
)
from kvcore_plugins.mamba.spec import MambaSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "MambaManager",
    "MambaSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
    "kvcore_plan_options",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register Mamba / linear-attention state."""
    return [kvcore.LayerType(MambaSpec, MambaManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[MambaSpec], ReferenceKernel]:
    """The reference kernel of Mamba / linear-attention state (imports torch when asked)."""
    from kvcore_plugins.mamba.kernel import MambaKernel

    return {MambaSpec: MambaKernel()}
