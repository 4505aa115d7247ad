"""The sliding-window attention spec."""

from __future__ import annotations

from typing import ClassVar

import attrs

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

__all__ = ["SlidingWindowSpec"]


@attrs.frozen(kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer whose tokens attend to the last ``sliding_window`` tokens only.

    Layers with different windows never share a block table: the default
    :attr:`~kvcore.specs.KVCacheSpec.uniform_type_key` includes the window.

    Attributes:
        sliding_window: Tokens a query attends to, itself included (>= 1).
    """

    kind: ClassVar[str] = "sliding_window"

    sliding_window: int = attrs.field(validator=positive_int)

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """The window plus one step of new tokens (capped), plus one partial block.

        A window that starts mid-block spans one block more than its length
        needs, hence the extra block.
        """
        num_tokens = min(self.sliding_window - 1 + limits.batched_tokens, limits.max_model_len)
        return (cdiv(num_tokens, self.block_size) + 1) * self.page_size_bytes

    def tokens_read(self, position: int) -> tuple[range, ...]:
        """The ``sliding_window - 1`` tokens before ``position`` (the query is the last)."""
        return (range(max(0, position - self.sliding_window + 1), position),)

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """The ``sliding_window - 1`` positions before ``start``: the first query reads the most."""
        return span_read(start, stop, start - self.sliding_window + 1)

    full_allocation_fallback: ClassVar[FallbackRole] = "promotable"
    # Allocated for every token (compute unchanged) by engines without the
    # hybrid manager: the full_attention plugin must then be selected too.
    promoted_to: ClassVar[type[KVCacheSpec] | None] = FullAttentionSpec
