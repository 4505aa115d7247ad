"""The full-attention reference kernel: a query reads every earlier position."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel
from kvcore.specs import KVCacheSpec
from kvcore_plugins.full_attention.spec import FullAttentionSpec

__all__ = ["FullAttentionKernel"]


class FullAttentionKernel(TokenRowKernel):
    """Attention over positions ``[0, t]``, keys and values side by side in each row.

    A layer allocated as full attention but computing a window or a chunk
    (:attr:`~FullAttentionSpec.sliding_window`,
    :attr:`~FullAttentionSpec.attention_chunk_size`, set by planning's
    unified mode and allocation-only fallback) reads only that window or
    chunk, as the sliding-window and chunked kernels do.
    """

    def first_visible(self, spec: KVCacheSpec, position: int) -> int:
        """0; or the window's or the chunk's first position when the spec records one."""
        if isinstance(spec, FullAttentionSpec):
            if spec.sliding_window is not None:
                return max(0, position - spec.sliding_window + 1)
            if spec.attention_chunk_size is not None:
                return position - position % spec.attention_chunk_size
        return 0
