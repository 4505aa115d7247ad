"""The sliding-window attention spec."""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import attrs

from kvcore.specs import AttentionSpec, FallbackRole, TokenLimits, cdiv, positive_int
from kvcore_plugins.full_attention import FullAttentionSpec

__all__ = ["SlidingWindowSpec"]


@attrs.frozen(kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """A layer whose tokens attend to the last ``sliding_window`` tokens only.

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

    full_allocation_fallback: ClassVar[FallbackRole] = "promotable"

    @property
    def uniform_type_key(self) -> Hashable:
        """Layers share token slots only with the same window."""
        return (type(self), self.sliding_window)

    def as_full_attention(self, block_size: int) -> FullAttentionSpec:
        """Full attention recording this window; a padded page keeps its padding."""
        return FullAttentionSpec.allocating_for(
            self, block_size, sliding_window=self.sliding_window
        )
