"""The full-attention spec."""

from __future__ import annotations

from typing import ClassVar

import attrs

from kvcore.specs import AttentionSpec, TokenLimits, optional_positive_int

__all__ = ["FullAttentionSpec"]


@attrs.frozen(kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends to the whole context: one page per block of the request.

    Attributes:
        sliding_window: Set only when a sliding-window layer is *allocated* as
            full attention (an engine that does not manage windows): the layer
            still computes windowed attention, but keeps every block.
        attention_chunk_size: Likewise, for a chunked local attention layer
            allocated as full attention.
    """

    kind: ClassVar[str] = "full_attention"

    sliding_window: int | None = attrs.field(default=None, validator=optional_positive_int)
    attention_chunk_size: int | None = attrs.field(default=None, validator=optional_positive_int)

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes
