"""Sliding-window attention: each token attends to the last ``sliding_window`` tokens.

Keeps
    The blocks holding the current window, plus the blocks of the tokens being
    computed.
Frees
    As the request advances, every whole block before the next token's window
    (the first ``n - sliding_window + 1`` tokens after ``n`` computed tokens);
    freed positions become null blocks in the block table.
Hits
    A cache hit of ``L`` tokens needs only the blocks covering tokens
    ``[L - sliding_window + 1, L)`` (``ceil((sliding_window - 1) / block_size)``
    contiguous blocks), found right to left; blocks before them are returned as
    null blocks. A cached run starting at block 0 is a hit even if shorter.
    With EAGLE one more block must be cached, then dropped from the hit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.sliding_window.manager import SlidingWindowManager, contiguous_blocks_needed
from kvcore_plugins.sliding_window.model_config import kvcore_layer_kinds, kvcore_model_layers
from kvcore_plugins.sliding_window.spec import SlidingWindowSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "SlidingWindowManager",
    "SlidingWindowSpec",
    "contiguous_blocks_needed",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register sliding-window attention."""
    return [kvcore.LayerType(SlidingWindowSpec, SlidingWindowManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[SlidingWindowSpec], ReferenceKernel]:
    """The reference kernel of sliding-window attention (imports torch, so only when asked)."""
    from kvcore_plugins.sliding_window.kernel import SlidingWindowKernel

    return {SlidingWindowSpec: SlidingWindowKernel()}
