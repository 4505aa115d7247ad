"""The chunked local attention spec (Llama-4 style)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import (
    AttentionSpec,
    FallbackRole,
    KVCacheSpec,
    TokenLimits,
    cdiv,
    positive_int,
    span_read,
)
from kvcore_plugins.full_attention import FullAttentionSpec

__all__ = ["ChunkedLocalAttentionSpec"]


@attrs.frozen(kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """A layer whose tokens attend only to tokens of their own fixed-size chunk.

    Tokens ``[k·C, (k+1)·C)`` form chunk ``k``; a token sees the earlier
    tokens of its chunk and nothing before it. Layers with different chunk
    sizes never share a block table (the default
    :attr:`~kvcore.specs.KVCacheSpec.uniform_type_key` includes the chunk).

    Attributes:
        attention_chunk_size: ``C``, in tokens; a multiple of ``block_size``
            so that every chunk starts on a block boundary (blocks of earlier
            chunks are then dropped whole).
    """

    kind: ClassVar[str] = "chunked_local"

    attention_chunk_size: int = attrs.field(validator=positive_int)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.attention_chunk_size % self.block_size:
            msg = (
                f"ChunkedLocalAttentionSpec.attention_chunk_size ({self.attention_chunk_size}) "
                f"must be a multiple of block_size ({self.block_size}) so chunks start on "
                "block boundaries; pick a block size that divides the chunk size"
            )
            raise InvalidSpecError(msg)

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One chunk plus one step of new tokens, capped at ``max_model_len``."""
        num_tokens = min(self.attention_chunk_size + limits.batched_tokens, limits.max_model_len)
        return cdiv(num_tokens, self.block_size) * self.page_size_bytes

    def tokens_read(self, position: int) -> tuple[range, ...]:
        """The tokens of ``position``'s chunk before it."""
        chunk = self.attention_chunk_size
        return (range(position // chunk * chunk, position),)

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """The positions of ``start``'s chunk before it (later chunks read nothing before it)."""
        chunk = self.attention_chunk_size
        return span_read(start, stop, start // chunk * chunk)

    # The reference engine never promotes chunked layers to make pages fit,
    # but engines without the hybrid manager allocate them as full attention.
    full_allocation_fallback: ClassVar[FallbackRole] = "blocks"
    promoted_to: ClassVar[type[KVCacheSpec] | None] = FullAttentionSpec
