"""The sliding-window reference kernel: a query reads the last ``sliding_window`` positions."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel

__all__ = ["SlidingWindowKernel"]


class SlidingWindowKernel(TokenRowKernel):
    """Attention over positions ``[t - sliding_window + 1, t]`` (itself included).

    The first position read is the spec's
    :meth:`~kvcore.specs.KVCacheSpec.positions_read`, exactly what the
    manager keeps: before each allocation it frees the blocks wholly before
    ``n - sliding_window + 1`` after ``n`` computed tokens, so the first query
    of a step reads the first position still kept, and a manager freeing one
    block too many makes the read hit the null block.
    """
