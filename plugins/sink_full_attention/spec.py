"""The full attention with attention sinks spec."""

from __future__ import annotations

from typing import ClassVar

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import AttentionSpec, TokenLimits, positive_int, span_read

__all__ = ["SinkFullAttentionSpec"]


@attrs.frozen(kw_only=True)
class SinkFullAttentionSpec(AttentionSpec):
    """Full attention plus ``sink_len`` learned sink tokens every request attends to.

    The sink keys and values are the same for every request, so they live in
    ``sink_len / block_size`` blocks reserved from the pool once, when the
    manager is built, and counted in the pool's size (not per request).

    Attributes:
        sink_len: Sink tokens (> 0, a multiple of ``block_size``).
    """

    kind: ClassVar[str] = "sink_full_attention"

    sink_len: int = attrs.field(validator=positive_int)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.sink_len % self.block_size:
            msg = (
                f"SinkFullAttentionSpec.sink_len ({self.sink_len}) must be a multiple of "
                f"block_size ({self.block_size}): sink tokens fill whole reserved blocks"
            )
            raise InvalidSpecError(msg)

    @property
    def pool_reserved_blocks(self) -> int:
        """The sink blocks, reserved once per pool."""
        return self.sink_len // self.block_size

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request (sinks excluded)."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """Every position before ``start`` (the sinks are in reserved blocks, not the table)."""
        return span_read(start, stop, 0)

    # Not ALL_TOKENS_KEY: a group's spec decides whether sinks are reserved, so
    # these layers keep their own tables (the default key includes sink_len).
    attends_to_all_tokens: ClassVar[bool] = True
