"""The Mamba / linear-attention state spec."""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, ClassVar, Literal

import attrs

from kvcore.errors import InvalidSpecError
from kvcore.specs import (
    KVCacheSpec,
    PagePart,
    TokenLimits,
    cdiv,
    dtype_name,
    non_negative_int,
    span_read,
)

__all__ = ["MambaSpec"]

MambaCacheMode = Literal["none", "align"]
#: Which states a prefill keeps (see :class:`MambaSpec`).
PrefillStates = Literal["every", "selective"]
PREFILL_STATES: tuple[PrefillStates, ...] = ("every", "selective")


def _convert_shapes(value: Iterable[Iterable[int]]) -> tuple[tuple[int, ...], ...]:
    try:
        return tuple(tuple(shape) for shape in value)
    except TypeError:
        msg = f"MambaSpec.shapes must be a sequence of shapes (sequences of ints), got {value!r}"
        raise InvalidSpecError(msg) from None


def _check_shapes(instance: object, attribute: Any, value: tuple[tuple[int, ...], ...]) -> None:
    if not value:
        msg = "MambaSpec.shapes is empty; give the shape of every state tensor of the layer"
        raise InvalidSpecError(msg)
    for shape in value:
        if not shape or any(type(d) is not int or d <= 0 for d in shape):
            msg = (
                f"MambaSpec.shapes contains {shape!r}; every state shape needs at least one "
                "dimension, all positive integers"
            )
            raise InvalidSpecError(msg)


def _check_cache_mode(instance: object, attribute: Any, value: object) -> None:
    if value not in ("none", "align"):
        msg = (
            f"MambaSpec.mamba_cache_mode must be 'none' (one state per request, never "
            f"cached) or 'align' (states cached at block boundaries), got {value!r}"
        )
        raise InvalidSpecError(msg)


def _check_prefill_states(instance: object, attribute: Any, value: object) -> None:
    if value not in PREFILL_STATES:
        msg = (
            f"MambaSpec.prefill_states must be 'every' (a state at every block boundary a "
            f"prefill crosses) or 'selective' (only where a prefix is likely to be reused), "
            f"got {value!r}"
        )
        raise InvalidSpecError(msg)


def _convert_dtypes(value: Iterable[object]) -> tuple[str, ...]:
    names = []
    for item in value:
        try:
            names.append(dtype_name(item))
        except ValueError as exc:
            msg = f"MambaSpec.dtypes: {exc}"
            raise InvalidSpecError(msg) from None
    return tuple(names)


@attrs.frozen(kw_only=True)
class MambaSpec(KVCacheSpec):
    """A recurrent state (Mamba, linear attention, ...) of fixed size per request.

    The page is the state itself: its tensors packed one after the other
    (``page_parts``), whatever the block size. ``block_size`` only sets
    the token granularity at which states can be cached: block ``i`` of a
    request holds the state after ``(i + 1) × block_size`` tokens.
    ``page_size_padded`` pads the page to match attention pages.

    Attributes:
        shapes: Shape of each state tensor (e.g. conv state and SSM state).
        dtypes: Element type of each state tensor (names or torch dtypes).
        mamba_type: Free-form label of the state kind (``"mamba2"``, ...).
        num_speculative_blocks: Extra state slots for speculative decoding.
        mamba_cache_mode: ``"none"``: one state per request, never
            prefix-cached (``block_size`` is then at least the model length).
            ``"align"``: ``block_size`` equals the attention block size, and
            the state at every block boundary can be cached and hit.
        prefill_states: Which block-boundary states a prefill keeps, in
            ``"align"`` mode. ``"every"``: each one it crosses (the
            reference engine's rule). ``"selective"``: inside the prompt,
            only the last boundary of the prompt (where a conversation's
            next turn diverges) and the deepest boundary an earlier prompt
            also crossed (where two prompts diverge); the others get null
            blocks, so they take no memory and are never hit. States past
            the prompt and the block holding the running state are kept as
            under ``"every"``.
    """

    kind: ClassVar[str] = "mamba"

    shapes: tuple[tuple[int, ...], ...] = attrs.field(
        converter=_convert_shapes, validator=_check_shapes
    )
    dtypes: tuple[str, ...] = attrs.field(converter=_convert_dtypes)
    mamba_type: str = "mamba2"
    num_speculative_blocks: int = attrs.field(default=0, validator=non_negative_int)
    mamba_cache_mode: MambaCacheMode = attrs.field(default="none", validator=_check_cache_mode)
    prefill_states: PrefillStates = attrs.field(default="every", validator=_check_prefill_states)

    def __attrs_post_init__(self) -> None:
        if len(self.dtypes) != len(self.shapes):
            msg = (
                f"MambaSpec.dtypes has {len(self.dtypes)} entries for {len(self.shapes)} "
                "shapes; give one dtype per state tensor"
            )
            raise InvalidSpecError(msg)
        super().__attrs_post_init__()

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """The state slots one request can hold at once.

        ``"none"``: one state plus the speculative slots. ``"align"``: the
        blocks a step can span (one per ``block_size`` tokens of one step,
        plus the block holding the previous state) plus the speculative
        slots, capped at one per block of ``max_model_len``. With
        ``prefill_states="selective"`` a step keeps at most four of them
        (the previous state, two kept boundaries, the running state).
        """
        if self.mamba_cache_mode == "none":
            slots = 1 + self.num_speculative_blocks
        else:
            step_tokens = min(limits.batched_tokens, limits.max_model_len)
            slots = min(
                cdiv(step_tokens, self.block_size) + 1, cdiv(limits.max_model_len, self.block_size)
            )
            if self.prefill_states == "selective" and slots > 4:
                slots = 4
            slots += self.num_speculative_blocks
        return slots * self.page_size_bytes

    def tokens_read(self, position: int) -> tuple[range, ...]:
        """The state after the token before ``position`` (held by that token's block)."""
        return (range(position - 1, position),) if position > 0 else ()

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """The state after ``start`` tokens (later positions read states the step computes)."""
        return span_read(start, stop, start - 1)

    page_size_follows_block_size: ClassVar[bool] = False

    def aligned_to_attention_block_size(self, block_size: int) -> MambaSpec:
        """In ``"align"`` mode states are cached per attention block: follow it; else unchanged."""
        if self.mamba_cache_mode == "align":
            return attrs.evolve(self, block_size=block_size)
        return self

    @property
    def uniform_type_key(self) -> Hashable:
        """States share a block table only with the same slot needs and page."""
        return (
            type(self),
            self.mamba_cache_mode,
            self.prefill_states,
            self.num_speculative_blocks,
            self.page_size_bytes,
        )

    def grown_to_page(self, page_size: int) -> MambaSpec | None:
        """Pad the page: a state's size does not follow the block size."""
        if page_size < self.real_page_size_bytes:
            return None
        if page_size == self.page_size_bytes:
            return self
        return attrs.evolve(self, page_size_padded=page_size)

    def page_parts(self) -> tuple[PagePart, ...]:
        """One array per state tensor, in order, packed from the start of the page."""
        parts = []
        offset = 0
        for index, (shape, dtype) in enumerate(zip(self.shapes, self.dtypes, strict=True)):
            part = PagePart(name=f"state{index}", offset=offset, shape=shape, dtype=dtype)
            parts.append(part)
            offset += part.nbytes
        return tuple(parts)
