"""The NVFP4 attention spec and its KV format."""

from __future__ import annotations

from collections.abc import Hashable
from typing import ClassVar, Final

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import ALL_TOKENS_KEY, AttentionSpec, KVFormat, TokenLimits

__all__ = ["NVFP4", "NVFP4AttentionSpec"]

#: NVFP4 as an attention page stores it: 4-bit E2M1 values, two to a byte
#: (the first in the low four bits), and one E4M3 scale for every 16
#: consecutive values of a key or value vector. For 8 KV heads of 128:
#: 8 × (256 / 2 + 256 / 16) = 1,152 bytes per token, against 4,096 in bf16.
#: NVFP4's second, per-tensor fp32 scale lives outside the page.
NVFP4: Final = KVFormat(
    name="nvfp4",
    element_dtype="uint8",
    value_bits=4,
    scale_dtype="float8_e4m3fn",
    values_per_scale=16,
    description="4-bit E2M1 values, one E4M3 scale per 16 values",
)


@attrs.frozen(kw_only=True)
class NVFP4AttentionSpec(AttentionSpec):
    """Full attention whose keys and values are stored in NVFP4.

    The layer attends to every earlier token, as full attention does; only
    its page differs: ``dtype`` must be the :data:`NVFP4` format (or its
    name, ``"nvfp4"``), and ``head_size`` and ``head_size_v`` multiples of
    16 (one scale per 16 values). The page has two parts,
    ``"kv"`` ``(block_size, num_kv_heads, (head_size + head_size_v) / 2)``
    ``uint8`` and ``"kv_scale"`` ``(block_size, num_kv_heads, (head_size +
    head_size_v) / 16)`` ``float8_e4m3fn`` (see
    :meth:`kvcore.specs.KVFormat.page_parts`).
    """

    kind: ClassVar[str] = "nvfp4_attention"
    kv_formats: ClassVar[tuple[KVFormat, ...]] = (NVFP4,)
    attends_to_all_tokens: ClassVar[bool] = True

    def __attrs_post_init__(self) -> None:
        if self.kv_format is None:
            msg = (
                f"NVFP4AttentionSpec.dtype is {self.dtype!r}, a plain dtype; this type stores "
                "NVFP4: give dtype='nvfp4', or make the layer a full_attention layer to keep a "
                "plain dtype"
            )
            raise InvalidSpecError(msg)
        super().__attrs_post_init__()

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes

    @property
    def uniform_type_key(self) -> Hashable:
        """Shared with every type that keeps all tokens: its layers need the same slots."""
        return ALL_TOKENS_KEY
