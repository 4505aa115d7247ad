"""The hidden-state cache spec."""

from __future__ import annotations

from typing import ClassVar

import attrs

from kvcore.specs import AttentionSpec, TokenLimits, non_negative_int

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
