"""The sliding-window reference kernel: a query reads the last ``sliding_window`` positions."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel
from kvcore.specs import KVCacheSpec
from kvcore_plugins.sliding_window.spec import SlidingWindowSpec

__all__ = ["SlidingWindowKernel"]


class SlidingWindowKernel(TokenRowKernel):
    """Attention over positions ``[t - sliding_window + 1, t]`` (itself included).

    These are exactly the positions the manager keeps: before each
    allocation it frees the blocks wholly before ``n - sliding_window + 1``
    after ``n`` computed tokens, so the first query of a step reads the
    first position still kept, and a manager freeing one block too many
    makes the read hit the null block.
    """

    def first_visible(self, spec: KVCacheSpec, position: int) -> int:
        """``max(0, position - sliding_window + 1)``."""
        if not isinstance(spec, SlidingWindowSpec):
            msg = f"SlidingWindowKernel serves SlidingWindowSpec, got {type(spec).__name__}"
            raise TypeError(msg)
        return max(0, position - spec.sliding_window + 1)
