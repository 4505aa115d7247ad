"""The full-attention spec."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import ClassVar

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import (
    ALL_TOKENS_KEY,
    AttentionSpec,
    KVCacheSpec,
    TokenLimits,
    optional_positive_int,
)

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

    @classmethod
    def allocating_for(
        cls,
        spec: AttentionSpec,
        block_size: int,
        *,
        sliding_window: int | None = None,
        attention_chunk_size: int | None = None,
    ) -> FullAttentionSpec:
        """Full attention with ``spec``'s shape, to allocate a windowed layer's every token.

        The layer keeps computing windowed attention (the window or chunk size
        is recorded); only its allocation becomes that of full attention. A
        padded page stays padded: to its old size, or to the natural page at
        ``block_size`` if that is larger.
        """
        padded = spec.page_size_padded
        if padded is not None:
            padded = max(padded, spec.bytes_per_token * block_size)
        return cls(
            block_size=block_size,
            num_kv_heads=spec.num_kv_heads,
            head_size=spec.head_size,
            head_size_v=spec.head_size_v,
            dtype=spec.dtype,
            page_size_padded=padded,
            sliding_window=sliding_window,
            attention_chunk_size=attention_chunk_size,
        )

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes

    attends_to_all_tokens: ClassVar[bool] = True

    @property
    def uniform_type_key(self) -> Hashable:
        """Shared with every type that keeps all tokens (MLA, hidden states)."""
        return ALL_TOKENS_KEY

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> FullAttentionSpec:
        """Merge full-attention layers that differ only in a recorded window or chunk.

        A layer allocated as full attention may record the window (or chunk)
        it computes with; layers with and without one share a group, and the
        merged spec records the one window. Everything else must be equal.

        Raises:
            InvalidSpecError: a spec is not a ``FullAttentionSpec``, two
                different windows (or chunk sizes) are recorded, both a window
                and a chunk size are, or another field differs.
        """
        if not specs:
            msg = "FullAttentionSpec.merge needs at least one spec"
            raise InvalidSpecError(msg)
        for spec in specs:
            if type(spec) is not cls:
                msg = (
                    f"FullAttentionSpec.merge: a {type(spec).__name__} layer cannot share a "
                    "group with full-attention layers"
                )
                raise InvalidSpecError(msg)
        full = [spec for spec in specs if isinstance(spec, FullAttentionSpec)]
        windows = {spec.sliding_window for spec in full} - {None}
        chunks = {spec.attention_chunk_size for spec in full} - {None}
        for label, values in (("sliding windows", windows), ("attention chunk sizes", chunks)):
            if len(values) > 1:
                msg = (
                    f"FullAttentionSpec.merge: the layers record different {label} "
                    f"{sorted(values)}; one group can record only one"
                )
                raise InvalidSpecError(msg)
        merged = attrs.evolve(
            full[0],
            sliding_window=next(iter(windows), None),
            attention_chunk_size=next(iter(chunks), None),
        )
        for spec in full:
            aligned = attrs.evolve(
                spec,
                sliding_window=merged.sliding_window,
                attention_chunk_size=merged.attention_chunk_size,
            )
            if aligned != merged:
                msg = (
                    f"FullAttentionSpec.merge: layers of one KV cache group need the same "
                    f"shape, but {spec!r} differs from {full[0]!r}"
                )
                raise InvalidSpecError(msg)
        if merged.sliding_window is not None and merged.attention_chunk_size is not None:
            msg = (
                "FullAttentionSpec.merge: the layers record both a sliding window and an "
                "attention chunk size; a group can record only one of them"
            )
            raise InvalidSpecError(msg)
        return merged
