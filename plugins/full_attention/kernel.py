"""The full-attention reference kernel: a query reads every earlier position."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel

__all__ = ["FullAttentionKernel"]


class FullAttentionKernel(TokenRowKernel):
    """Attention over positions ``[0, t]``, keys and values side by side in each row.

    What a query reads is the spec's
    :meth:`~kvcore.specs.KVCacheSpec.positions_read`: every earlier position,
    or, for a layer allocated as full attention but computing a local
    attention (its spec's ``compute_spec``, set by planning's unified mode and
    the allocation-only fallback), what that local spec reads.
    """
