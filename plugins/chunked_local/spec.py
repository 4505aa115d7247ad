"""The chunked local attention spec (Llama-4 style)."""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import AttentionSpec, FallbackRole, TokenLimits, cdiv, positive_int
from kvcore_plugins.full_attention import FullAttentionSpec

__all__ = ["ChunkedLocalAttentionSpec"]


@attrs.frozen(kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """A layer whose tokens attend only to tokens of their own fixed-size chunk.

    Tokens ``[k·C, (k+1)·C)`` form chunk ``k``; a token sees the earlier
    tokens of its chunk and nothing before it.

    Attributes:
        attention_chunk_size: ``C``, in tokens; a multiple of ``block_size``
            so that every chunk starts on a block boundary (blocks of earlier
            chunks are then dropped whole).
    """

    kind: ClassVar[str] = "chunked_local_attention"

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

    # The reference engine never promotes chunked layers to make pages fit.
    full_allocation_fallback: ClassVar[FallbackRole] = "blocks"

    @property
    def uniform_type_key(self) -> Hashable:
        """Layers share token slots only with the same chunk size."""
        return (type(self), self.attention_chunk_size)

    def as_full_attention(self, block_size: int) -> FullAttentionSpec:
        """Full attention recording this chunk size; a padded page keeps its padding."""
        return FullAttentionSpec.allocating_for(
            self, block_size, attention_chunk_size=self.attention_chunk_size
        )
