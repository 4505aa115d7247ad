"""The full-attention spec."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import ALL_TOKENS_KEY, AttentionSpec, KVCacheSpec, TokenLimits, span_read

__all__ = ["FullAttentionSpec"]


def _check_compute_spec(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, KVCacheSpec):
        msg = f"FullAttentionSpec.compute_spec must be a kvcore spec or None, got {value!r}"
        raise InvalidSpecError(msg)


@attrs.frozen(kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """A layer that attends to the whole context: one page per block of the request.

    Attributes:
        compute_spec: Set only when planning allocates a layer of a local type
            (a sliding window, a chunk) as full attention, for an engine that
            does not manage windows: the layer's own spec, which it still
            computes attention with, while it keeps every block. ``None``: the
            layer computes full attention.
    """

    kind: ClassVar[str] = "full_attention"

    compute_spec: KVCacheSpec | None = attrs.field(default=None, validator=_check_compute_spec)

    @classmethod
    def allocating_for(cls, spec: KVCacheSpec, block_size: int) -> FullAttentionSpec:
        """Full attention with ``spec``'s shape, to allocate a local layer's every token.

        The layer keeps computing its own attention (``spec`` is recorded as
        :attr:`compute_spec`); only its allocation becomes that of full
        attention. A padded page stays padded: to its old size, or to the
        natural page at ``block_size`` if that is larger.

        Raises:
            InvalidSpecError: ``spec`` does not store keys and values per token
                (it is not an :class:`~kvcore.specs.AttentionSpec`).
        """
        if not isinstance(spec, AttentionSpec):
            msg = (
                f"FullAttentionSpec.allocating_for: a {type(spec).__name__} layer stores no "
                "keys and values per token and cannot be allocated as full attention"
            )
            raise InvalidSpecError(msg)
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
            compute_spec=spec,
        )

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """One page per block of a ``max_model_len``-token request."""
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """Every position before ``start``; what :attr:`compute_spec` reads, when one is set.

        A window or chunk allocated as full attention keeps every block
        (:meth:`tokens_read` stays every earlier token, the rule its cache
        hits follow) but still computes its own attention, so its kernel reads
        what the recorded spec reads.
        """
        if self.compute_spec is not None:
            return self.compute_spec.positions_read(start, stop)
        return span_read(start, stop, 0)

    attends_to_all_tokens: ClassVar[bool] = True

    @property
    def uniform_type_key(self) -> Hashable:
        """Shared with every type that keeps all tokens (MLA, hidden states)."""
        return ALL_TOKENS_KEY

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> FullAttentionSpec:
        """Merge full-attention layers that differ only in the attention they compute.

        A layer allocated as full attention may record the local attention it
        computes (:attr:`compute_spec`); layers with and without one share a
        group, and the merged spec records the one local attention. Everything
        else must be equal.

        Raises:
            InvalidSpecError: a spec is not a ``FullAttentionSpec``, two
                different local attentions are recorded, or another field
                differs.
        """
        if not specs:
            msg = "FullAttentionSpec.merge needs at least one spec"
            raise InvalidSpecError(msg)
        full: list[FullAttentionSpec] = []
        for spec in specs:
            if type(spec) is not cls or not isinstance(spec, FullAttentionSpec):
                msg = (
                    f"FullAttentionSpec.merge: a {type(spec).__name__} layer cannot share a "
                    "group with full-attention layers"
                )
                raise InvalidSpecError(msg)
            full.append(spec)
        computed = {spec.compute_spec for spec in full} - {None}
        if len(computed) > 1:
            described = ", ".join(sorted(repr(spec) for spec in computed))
            msg = (
                "FullAttentionSpec.merge: the layers compute different local attentions "
                f"({described}); one group can record only one"
            )
            raise InvalidSpecError(msg)
        merged = attrs.evolve(full[0], compute_spec=next(iter(computed), None))
        for spec in full:
            if attrs.evolve(spec, compute_spec=merged.compute_spec) != merged:
                msg = (
                    f"FullAttentionSpec.merge: layers of one KV cache group need the same "
                    f"shape, but {spec!r} differs from {full[0]!r}"
                )
                raise InvalidSpecError(msg)
        return merged
