"""The multi-head latent attention (MLA) spec."""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar, Final

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import (
    ALL_TOKENS_KEY,
    AttentionSpec,
    FallbackRole,
    PagePart,
    TokenLimits,
    non_negative_int,
    positive_int,
    span_read,
)

__all__ = ["CACHE_DTYPE_BYTES_PER_TOKEN", "MLAAttentionSpec"]

#: Packed per-token records of special MLA cache formats, in bytes per token.
#: ``fp8_ds_mla``: DeepSeek's fp8 layout (512 fp8 latent values, 4 fp32
#: scales and 64 bf16 rope values = 656 bytes).
CACHE_DTYPE_BYTES_PER_TOKEN: Final[dict[str, int]] = {"fp8_ds_mla": 656}


@attrs.frozen(kw_only=True)
class MLAAttentionSpec(AttentionSpec):
    """A layer caching one latent vector per token (DeepSeek-style MLA).

    Keys and values are reconstructed from the latent, so there is no
    separate value vector (``head_size_v`` defaults to 0) and usually a single
    "head" whose width is the latent size (e.g. 512 LoRA rank + 64 rope =
    576).

    Attributes:
        cache_dtype_str: A packed cache format whose per-token size is fixed
            (see :data:`CACHE_DTYPE_BYTES_PER_TOKEN`), or ``None`` for plain
            ``dtype`` elements.
    """

    kind: ClassVar[str] = "mla"
    page_only_fields: ClassVar[frozenset[str]] = AttentionSpec.page_only_fields | {
        "cache_dtype_str"
    }

    num_kv_heads: int = attrs.field(default=1, validator=positive_int)
    head_size_v: int = attrs.field(default=0, validator=non_negative_int)
    cache_dtype_str: str | None = None

    def __attrs_post_init__(self) -> None:
        if (
            self.cache_dtype_str is not None
            and self.cache_dtype_str not in CACHE_DTYPE_BYTES_PER_TOKEN
        ):
            known = ", ".join(sorted(CACHE_DTYPE_BYTES_PER_TOKEN))
            msg = (
                f"MLAAttentionSpec.cache_dtype_str {self.cache_dtype_str!r} is unknown; "
                f"known packed formats: {known} (or None for plain dtype elements)"
            )
            raise InvalidSpecError(msg)
        super().__attrs_post_init__()

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """Every position before ``start``."""
        return span_read(start, stop, 0)

    attends_to_all_tokens: ClassVar[bool] = True
    # MLA kernels (FlashMLA and the like) work on blocks of 64 tokens.
    kernel_block_alignment: ClassVar[int] = 64
    full_allocation_fallback: ClassVar[FallbackRole] = "enables"

    @property
    def uniform_type_key(self) -> Hashable:
        """Shared with full attention: MLA keeps every token too."""
        return ALL_TOKENS_KEY

    def grown_to_page(self, page_size: int) -> MLAAttentionSpec | None:
        """Scale the block size by a whole ratio; never pad.

        MLA kernels index the cache in whole token rows, so a page padded to
        an arbitrary size cannot be read: a target that is not a multiple of
        the page is refused.
        """
        if page_size % self.page_size_bytes:
            return None
        return attrs.evolve(
            self,
            block_size=self.block_size * (page_size // self.page_size_bytes),
            page_size_padded=None
            if self.page_size_padded is None
            else self.page_size_padded * (page_size // self.page_size_bytes),
        )

    def page_parts(self) -> tuple[PagePart, ...]:
        """The latent rows, ``(block_size, heads, head_size)``; packed formats as raw bytes."""
        if self.cache_dtype_str is not None:
            record = CACHE_DTYPE_BYTES_PER_TOKEN[self.cache_dtype_str]
            return (
                PagePart(name="latent", offset=0, shape=(self.block_size, record), dtype="uint8"),
            )
        shape = (self.block_size, self.num_kv_heads, self.head_size + self.head_size_v)
        return (PagePart(name="latent", offset=0, shape=shape, dtype=self.dtype),)
