"""The full-attention reference kernel: a query reads every earlier position."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel
from kvcore.specs import KVCacheSpec
from kvcore_plugins.full_attention.spec import FullAttentionSpec

__all__ = ["FullAttentionKernel"]


class FullAttentionKernel(TokenRowKernel):
    """Attention over positions ``[0, t]``, keys and values side by side in each row.

    A layer allocated as full attention but computing a local attention (its
    spec's ``compute_spec``, set by planning's unified mode and allocation-only
    fallback) reads only what that local spec reads
    (:meth:`~kvcore.specs.KVCacheSpec.tokens_read`), as the sliding-window and
    chunked kernels do.
    """

    def first_visible(self, spec: KVCacheSpec, position: int) -> int:
        """0; or the first position the recorded local spec reads."""
        if isinstance(spec, FullAttentionSpec) and spec.compute_spec is not None:
            reads = spec.compute_spec.tokens_read(position)
            return reads[0].start if reads else position
        return 0
