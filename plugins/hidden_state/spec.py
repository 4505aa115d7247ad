"""The hidden-state cache spec."""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar

import attrs

from kvcore.specs import (
    ALL_TOKENS_KEY,
    AttentionSpec,
    FallbackRole,
    TokenLimits,
    non_negative_int,
    span_read,
)

__all__ = ["HiddenStateCacheSpec"]


@attrs.frozen(kw_only=True)
class HiddenStateCacheSpec(AttentionSpec):
    """A layer whose hidden states are kept in the KV cache (to ship them out).

    One vector of ``num_kv_heads × head_size`` elements per token (no value
    part). Such layers are never grouped with attention layers: each gets its
    own group and block table, with a block size chosen to fit the common
    page.
    """

    kind: ClassVar[str] = "hidden_state"

    head_size_v: int = attrs.field(default=0, validator=non_negative_int)

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """Every position before ``start``."""
        return span_read(start, stop, 0)

    attends_to_all_tokens: ClassVar[bool] = True
    keeps_own_group: ClassVar[bool] = True
    full_allocation_fallback: ClassVar[FallbackRole] = "blocks"

    @property
    def uniform_type_key(self) -> Hashable:
        """Shared with full attention: every token's hidden state is kept."""
        return ALL_TOKENS_KEY
