"""The chunked local attention reference kernel: a query reads its own chunk."""

from __future__ import annotations

from kvcore.reference import TokenRowKernel
from kvcore.specs import KVCacheSpec
from kvcore_plugins.chunked_local.spec import ChunkedLocalAttentionSpec

__all__ = ["ChunkedLocalAttentionKernel"]


class ChunkedLocalAttentionKernel(TokenRowKernel):
    """Attention over the positions of the query's chunk up to itself, ``[k·C, t]``.

    The manager frees the earlier chunks' blocks once the next token starts a
    new chunk, and counts them as computed (null blocks) on a cache hit: the
    kernel never reads before the chunk start, and reading a null block
    there is an error.
    """

    def first_visible(self, spec: KVCacheSpec, position: int) -> int:
        """``position - position % attention_chunk_size``."""
        if not isinstance(spec, ChunkedLocalAttentionSpec):
            msg = (
                "ChunkedLocalAttentionKernel serves ChunkedLocalAttentionSpec, got "
                f"{type(spec).__name__}"
            )
            raise TypeError(msg)
        return position - position % spec.attention_chunk_size
