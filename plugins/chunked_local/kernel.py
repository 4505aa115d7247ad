"""The chunked local attention reference kernel: a query reads its own chunk."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel

__all__ = ["ChunkedLocalAttentionKernel"]


class ChunkedLocalAttentionKernel(TokenRowKernel):
    """Attention over the positions of the query's chunk up to itself, ``[k·C, t]``.

    The first position read is the spec's
    :meth:`~kvcore.specs.KVCacheSpec.positions_read`. The manager frees the
    earlier chunks' blocks once the next token starts a new chunk, and
    counts them as computed (null blocks) on a cache hit: the kernel never
    reads before the chunk start, and reading a null block there is an error.
    """
