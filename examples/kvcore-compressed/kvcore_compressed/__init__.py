"""kvcore plugin: attention that keeps one KV vector per ``ratio`` tokens."""

from __future__ import annotations

from typing import Any, ClassVar

import attrs

import kvcore
from kvcore.managers import PrefixManager
from kvcore.specs import AttentionSpec, InvalidSpecError, PagePart, TokenLimits, positive_int


@attrs.frozen(kw_only=True)
class CompressedAttentionSpec(AttentionSpec):
    """Full attention over a compressed context: one KV vector per ``ratio`` tokens."""

    kind: ClassVar[str] = "compressed_attention"
    ratio: int = attrs.field(validator=positive_int)

    def __attrs_post_init__(self) -> None:
        if self.block_size % self.ratio:
            msg = f"block_size ({self.block_size}) must be a multiple of ratio ({self.ratio})"
            raise InvalidSpecError(msg)
        super().__attrs_post_init__()

    def page_parts(self) -> tuple[PagePart, ...]:
        """A block holds ``block_size / ratio`` compressed vectors (the page follows)."""
        vectors = self.block_size // self.ratio
        shape = (vectors, self.num_kv_heads, self.head_size + self.head_size_v)
        return (PagePart(name="kv", offset=0, shape=shape, dtype=self.dtype),)

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes


class CompressedAttentionManager(PrefixManager[CompressedAttentionSpec]):
    """Every compressed block stays visible, so any cached prefix is a hit."""


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register compressed attention."""
    return [kvcore.LayerType(CompressedAttentionSpec, CompressedAttentionManager)]
