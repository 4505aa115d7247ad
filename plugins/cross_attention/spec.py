"""The cross-attention spec (encoder-decoder models)."""

from __future__ import annotations

from typing import ClassVar

import attrs

from kvcore.specs import AttentionSpec, TokenLimits, span_read

__all__ = ["CrossAttentionSpec"]


@attrs.frozen(kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """A decoder layer attending to the encoder's output (e.g. Whisper).

    Its blocks hold the keys and values of the request's encoder tokens:
    allocated once per request, never shared through the prefix cache.
    """

    kind: ClassVar[str] = "cross_attention"

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of the longest encoder input."""
        return self.pages_for_tokens(limits.max_num_encoder_tokens) * self.page_size_bytes

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """Every encoder position before ``start`` (the decoder reads all of them)."""
        return span_read(start, stop, 0)
