"""Base classes for KV cache specs: what one layer needs from the cache.

A spec is an immutable value object describing one attention layer's cache:
how many tokens a block holds and how many bytes one block of that layer takes
(its *page*). Plugin authors subclass :class:`KVCacheSpec` (or
:class:`AttentionSpec` for layers that store keys and values per token) and
decorate the subclass with ``@attrs.frozen(kw_only=True)`` as well.

Specs are validated when they are made: a bad block size, head count or dtype
raises :class:`~kvcore.errors.InvalidSpecError` naming the class and the field.
Specs compare and hash by value; grouping layers relies on that.
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar, Final, Literal, TypeVar

import attrs

from kvcore._utils import cdiv
from kvcore.errors import InvalidSpecError

__all__ = [
    "cdiv",
    "InvalidSpecError",
    "DTYPE_SIZES",
    "dtype_name",
    "dtype_size",
    "TokenLimits",
    "PagePart",
    "KVFormat",
    "FallbackRole",
    "ALL_TOKENS_KEY",
    "KIND_PATTERN",
    "KVCacheSpec",
    "SpecT",
    "AttentionSpec",
    "positive_int",
    "optional_positive_int",
    "non_negative_int",
    "span_read",
]

#: Bytes per element of every dtype a spec may use, by canonical name (the
#: name torch gives the dtype, without the ``torch.`` prefix).
DTYPE_SIZES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
}

_DTYPE_ALIASES: dict[str, str] = {
    "double": "float64",
    "fp64": "float64",
    "float": "float32",
    "fp32": "float32",
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def dtype_name(value: object) -> str:
    """Return the canonical name of a dtype given as a name or a ``torch.dtype``.

    Accepts ``"bfloat16"``, aliases such as ``"bf16"`` or ``"half"``, and
    ``torch.bfloat16`` itself. torch is never imported: a torch dtype is
    recognised by its type and converted through its ``str()``.

    Raises:
        ValueError: ``value`` is not a dtype kvcore knows.
    """
    if isinstance(value, str):
        name = value.removeprefix("torch.")
    elif type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        name = str(value).removeprefix("torch.")
    else:
        msg = f"expected a dtype name or a torch.dtype, got {value!r}"
        raise ValueError(msg)
    name = _DTYPE_ALIASES.get(name, name)
    if name not in DTYPE_SIZES:
        known = ", ".join(sorted(DTYPE_SIZES))
        msg = f"unknown dtype {value!r}; known dtypes: {known}"
        raise ValueError(msg)
    return name


def dtype_size(value: object) -> int:
    """Return the size in bytes of one element of ``value`` (a name or torch dtype)."""
    return DTYPE_SIZES[dtype_name(value)]


def _check_step(start: int, stop: int | None) -> int:
    """``stop`` (default ``start + 1``) after checking that ``[start, stop)`` is a step."""
    if type(start) is not int or start < 0:
        msg = f"positions_read: start must be an integer >= 0, got {start!r}"
        raise ValueError(msg)
    if stop is None:
        return start + 1
    if type(stop) is not int or stop <= start:
        msg = f"positions_read: stop must be an integer above start ({start}), got {stop!r}"
        raise ValueError(msg)
    return stop


def _union(ranges: Sequence[range]) -> tuple[range, ...]:
    """Disjoint, increasing ranges covering exactly the positions of ``ranges``."""
    merged: list[range] = []
    for read in sorted(ranges, key=lambda r: r.start):
        if merged and read.start <= merged[-1].stop:
            if read.stop > merged[-1].stop:
                merged[-1] = range(merged[-1].start, read.stop)
        else:
            merged.append(read)
    return tuple(merged)


def span_read(start: int, stop: int | None, first: int) -> tuple[range, ...]:
    """``(range(first, start),)`` clipped to ``[0, start)``, or ``()`` if that is empty.

    The closed form of :meth:`KVCacheSpec.positions_read` for types whose
    queries read one contiguous span ending at the query, whose first
    position never decreases along a step (full attention, windows, chunks):
    the step's first query reads everything the later ones read before it.

    Args:
        start: The step's first position.
        stop: One past its last (checked, not otherwise used).
        first: The first position the query at ``start`` reads.
    """
    _check_step(start, stop)
    first = max(first, 0)
    return (range(first, start),) if first < start else ()


def _field_label(instance: object, attribute: attrs.Attribute[Any]) -> str:
    return f"{type(instance).__name__}.{attribute.name}"


def positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Attrs validator: ``value`` is an ``int`` (not a ``bool``) greater than 0."""
    if type(value) is not int or value <= 0:
        msg = f"{_field_label(instance, attribute)} must be a positive integer, got {value!r}"
        raise InvalidSpecError(msg)


def non_negative_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Attrs validator: ``value`` is an ``int`` (not a ``bool``) of at least 0."""
    if type(value) is not int or value < 0:
        msg = f"{_field_label(instance, attribute)} must be an integer >= 0, got {value!r}"
        raise InvalidSpecError(msg)


def optional_positive_int(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """Attrs validator: ``value`` is ``None`` or a positive ``int``."""
    if value is not None:
        positive_int(instance, attribute, value)


def _convert_cache_dtype(
    value: object, instance: object, field: attrs.Attribute[Any]
) -> str | KVFormat:
    """A plain dtype's canonical name, or a :class:`KVFormat` the spec's class declares."""
    cls = type(instance)
    declared: tuple[KVFormat, ...] = getattr(cls, "kv_formats", ())
    by_name = {kv_format.name: kv_format for kv_format in declared}
    if isinstance(value, KVFormat):
        if by_name.get(value.name) == value:
            return value
        stored = ", ".join(sorted(by_name)) or "none"
        msg = (
            f"{cls.__name__}.{field.name}: {cls.__name__} does not store the KV format "
            f"{value.name!r} (the formats it declares in kv_formats: {stored}); use a layer "
            "type that declares it, or a plain dtype"
        )
        raise InvalidSpecError(msg)
    if isinstance(value, str) and value in by_name:
        return by_name[value]
    try:
        return dtype_name(value)
    except ValueError as exc:
        formats = (
            f"; KV formats {cls.__name__} stores: {', '.join(sorted(by_name))}" if by_name else ""
        )
        msg = f"{cls.__name__}.{field.name}: {exc}{formats}"
        raise InvalidSpecError(msg) from None


def _convert_part_dtype(value: object) -> str:
    try:
        return dtype_name(value)
    except ValueError as exc:
        msg = f"PagePart.dtype: {exc}"
        raise InvalidSpecError(msg) from None


def _convert_shape(value: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(value)
    if any(type(dim) is not int or dim <= 0 for dim in shape):
        msg = f"PagePart.shape must hold positive integers, got {shape!r}"
        raise InvalidSpecError(msg)
    return shape


@attrs.frozen(kw_only=True)
class TokenLimits:
    """The per-request token limits that bound a spec's memory needs.

    Attributes:
        max_model_len: Longest request (prompt + output) the engine admits.
        max_num_batched_tokens: Most tokens one request can have scheduled in
            one step (the chunked-prefill budget). ``None`` means
            ``max_model_len``. Windowed attention types need room for the
            window plus this many tokens.
        max_num_encoder_tokens: Most encoder tokens of one request
            (encoder-decoder models); 0 for decoder-only models.
    """

    max_model_len: int = attrs.field(validator=positive_int)
    max_num_batched_tokens: int | None = attrs.field(default=None, validator=optional_positive_int)
    max_num_encoder_tokens: int = attrs.field(default=0, validator=non_negative_int)

    @property
    def batched_tokens(self) -> int:
        """``max_num_batched_tokens``, or ``max_model_len`` when it is not set."""
        if self.max_num_batched_tokens is None:
            return self.max_model_len
        return self.max_num_batched_tokens


@attrs.frozen(kw_only=True)
class PagePart:
    """One typed array inside a page, as torch allocation views it.

    A page (one block of one layer) is raw bytes; a spec describes it as one or
    more typed arrays so that the allocated cache can be handed to kernels as
    per-layer tensors of shape ``(num_blocks, *shape)``.

    Attributes:
        name: What the array holds (``"kv"``, ``"conv_state"``, ...).
        offset: Bytes from the start of the page to the array.
        shape: Shape of the array within one block.
        dtype: Element type (canonical name, see :data:`DTYPE_SIZES`).
    """

    name: str
    offset: int = attrs.field(validator=non_negative_int)
    shape: tuple[int, ...] = attrs.field(converter=_convert_shape)
    dtype: str = attrs.field(converter=_convert_part_dtype)

    @property
    def end(self) -> int:
        """Bytes from the start of the page to the end of the array."""
        return self.offset + self.nbytes

    @property
    def nbytes(self) -> int:
        """Bytes of the array within one block."""
        count = 1
        for dim in self.shape:
            count *= dim
        return count * DTYPE_SIZES[self.dtype]


def _check_format_name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not KIND_PATTERN.fullmatch(value):
        msg = (
            f"KVFormat.name must be lowercase words joined by underscores (e.g. 'nvfp4'), "
            f"got {value!r}"
        )
        raise InvalidSpecError(msg)
    if value in DTYPE_SIZES or value in _DTYPE_ALIASES:
        msg = (
            f"KVFormat.name {value!r} is the name of a plain dtype; a KV format needs a "
            "name of its own (plain dtypes need no format)"
        )
        raise InvalidSpecError(msg)


def _convert_format_dtype(value: object) -> str:
    try:
        return dtype_name(value)
    except ValueError as exc:
        msg = f"KVFormat: {exc}"
        raise InvalidSpecError(msg) from None


def _convert_optional_format_dtype(value: object) -> str | None:
    return None if value is None else _convert_format_dtype(value)


@attrs.frozen(kw_only=True)
class KVFormat:
    """A quantized layout of an attention page: packed values plus the scales that decode them.

    A spec whose ``dtype`` is a format (:attr:`AttentionSpec.kv_formats`)
    has a page of two parts, derived here: ``"kv"``, the values of every
    key and value vector, packed ``values_per_element`` to an element of
    ``element_dtype``, shape ``(block_size, num_kv_heads, (head_size +
    head_size_v) / values_per_element)``; then ``"kv_scale"``, the scales,
    ``(block_size, num_kv_heads, scales per key + scales per value)`` of
    ``scale_dtype``. Keys and values sit side by side in each row, as in a
    plain page, and each scale covers ``values_per_scale`` consecutive
    values of one key or one value vector. A scale kept outside the page
    (fp8 with one scale per tensor, the second-level scale of NVFP4) does
    not change the page and is not described here.

    Formats are values: two equal formats are the same format. A spec class
    declares the formats its page and its kernel handle; a registry refuses
    two different formats under one name.

    Attributes:
        name: What users call it (``"nvfp4"``): lowercase words joined by
            underscores, never the name of a plain dtype.
        element_dtype: Element type of the ``"kv"`` part (``"uint8"`` for
            packed 4-bit values, ``"float8_e4m3fn"``, ``"int8"``).
        value_bits: Bits of one value; divides the element's bits (4 in a
            ``uint8``: two values per element, the first in the low bits).
        scale_dtype: Element type of the ``"kv_scale"`` part; ``None``: the
            page holds no scales.
        values_per_scale: Consecutive values of a key or a value vector
            sharing one scale; ``None``: one scale per vector (per token and
            head). Must be ``None`` without ``scale_dtype``.
        description: One line for ``kvcore plugins`` and messages.
    """

    name: str = attrs.field(validator=_check_format_name)
    element_dtype: str = attrs.field(converter=_convert_format_dtype)
    value_bits: int = attrs.field(validator=positive_int)
    scale_dtype: str | None = attrs.field(default=None, converter=_convert_optional_format_dtype)
    values_per_scale: int | None = attrs.field(default=None, validator=optional_positive_int)
    description: str = attrs.field(default="", eq=False)

    def __attrs_post_init__(self) -> None:
        element_bits = 8 * DTYPE_SIZES[self.element_dtype]
        if element_bits % self.value_bits:
            msg = (
                f"KVFormat {self.name!r}: {self.value_bits}-bit values do not pack into "
                f"{self.element_dtype} ({element_bits} bits); pick value_bits dividing "
                f"{element_bits}"
            )
            raise InvalidSpecError(msg)
        if self.scale_dtype is None and self.values_per_scale is not None:
            msg = (
                f"KVFormat {self.name!r}: values_per_scale is {self.values_per_scale} but the "
                "page holds no scales (scale_dtype None); give scale_dtype or drop it"
            )
            raise InvalidSpecError(msg)

    @property
    def values_per_element(self) -> int:
        """Values packed into one element of ``element_dtype``."""
        return 8 * DTYPE_SIZES[self.element_dtype] // self.value_bits

    def scales_per_vector(self, width: int) -> int:
        """Scales one key or value vector of ``width`` values keeps in the page."""
        if self.scale_dtype is None or width == 0:
            return 0
        return 1 if self.values_per_scale is None else width // self.values_per_scale

    def _check_width(self, what: str, width: int) -> None:
        for unit, reason in (
            (self.values_per_element, f"{self.values_per_element} values pack into an element"),
            (self.values_per_scale or 1, f"{self.values_per_scale} values share a scale"),
        ):
            if width % unit:
                msg = (
                    f"KV format {self.name!r}: {what} {width} is not a multiple of {unit} "
                    f"({reason}); use a {what} that is"
                )
                raise InvalidSpecError(msg)

    def page_parts(
        self, *, block_size: int, num_kv_heads: int, head_size: int, head_size_v: int
    ) -> tuple[PagePart, ...]:
        """The ``"kv"`` part and, when the format keeps scales, the ``"kv_scale"`` part after it.

        Raises:
            InvalidSpecError: ``head_size`` or ``head_size_v`` is not a
                multiple of the values packed into an element or sharing a
                scale, or the scales would start at a byte that is not a
                multiple of their element size.
        """
        self._check_width("head_size", head_size)
        self._check_width("head_size_v", head_size_v)
        width = (head_size + head_size_v) // self.values_per_element
        data = PagePart(
            name="kv",
            offset=0,
            shape=(block_size, num_kv_heads, width),
            dtype=self.element_dtype,
        )
        scales = self.scales_per_vector(head_size) + self.scales_per_vector(head_size_v)
        if self.scale_dtype is None or scales == 0:
            return (data,)
        if data.nbytes % DTYPE_SIZES[self.scale_dtype]:
            msg = (
                f"KV format {self.name!r}: the scales would start at byte {data.nbytes}, not a "
                f"multiple of their {DTYPE_SIZES[self.scale_dtype]}-byte {self.scale_dtype} "
                "elements; use a block size or head count that makes the values' bytes one"
            )
            raise InvalidSpecError(msg)
        scale = PagePart(
            name="kv_scale",
            offset=data.nbytes,
            shape=(block_size, num_kv_heads, scales),
            dtype=self.scale_dtype,
        )
        return (data, scale)

    def bytes_per_token(self, *, num_kv_heads: int, head_size: int, head_size_v: int) -> int:
        """Bytes one token of one layer takes: its packed values and its scales."""
        self._check_width("head_size", head_size)
        self._check_width("head_size_v", head_size_v)
        values = (head_size + head_size_v) // self.values_per_element
        per_head = values * DTYPE_SIZES[self.element_dtype]
        if self.scale_dtype is not None:
            scales = self.scales_per_vector(head_size) + self.scales_per_vector(head_size_v)
            per_head += scales * DTYPE_SIZES[self.scale_dtype]
        return num_kv_heads * per_head


#: How a spec takes part in the allocation-only fallback of planning, tried
#: when page sizes cannot be unified: ``"neutral"`` (no part), ``"enables"``
#: (its presence makes the fallback worth trying: a layer whose page cannot be
#: padded, as MLA), ``"promotable"`` (allocated as full attention by the
#: fallback, compute unchanged: sliding window), ``"blocks"`` (its presence
#: rules the fallback out: chunked local attention, hidden-state layers).
FallbackRole = Literal["neutral", "enables", "promotable", "blocks"]

#: The :attr:`KVCacheSpec.uniform_type_key` of the types that keep a slot for
#: every token of a request (full attention, MLA, hidden-state caches): layers
#: of these types with one block size may share a block table.
ALL_TOKENS_KEY = "all tokens"


#: What a :attr:`KVCacheSpec.kind` looks like: lowercase words joined by
#: underscores (``"sliding_window"``). The kind is the attention type's one
#: name: in events, plans, ``kvcore plugins`` and model configs.
KIND_PATTERN: Final = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")


@attrs.frozen(kw_only=True)
class KVCacheSpec:
    """What one layer needs from the KV cache; the base of every spec.

    Subclasses set :attr:`kind`, describe their page with :meth:`page_parts`
    and implement :meth:`max_memory_usage_bytes`. The page size is derived
    from the parts (it is never declared separately), and the parts are
    checked when a spec is made: they must not overlap, and a padded page
    must hold them. A subclass that defines ``__attrs_post_init__`` must call
    ``super().__attrs_post_init__()``.

    Attributes:
        block_size: Tokens per block (> 0).
        page_size_padded: Page size to use instead of the natural one (the
            end of the last page part), in bytes; never smaller than the
            natural page. Planning pads pages so that layers of different
            shapes can share block ids.
    """

    #: The attention type's name (see :data:`~kvcore.specs.KIND_PATTERN`), reported in KV
    #: cache events (``BlockStored.kind``), plans and ``kvcore plugins``. Every
    #: registered spec class sets its own; two classes in one registry may
    #: not share one. It is not the plugin's name: one plugin may register
    #: several types (kvcore's built-in plugins register one each, named alike).
    kind: ClassVar[str]

    #: Fields that change only the page, not which token slots a request
    #: needs; the default ``uniform_type_key`` ignores them. A subclass
    #: adding such a field (a packed cache format, say) extends the set.
    page_only_fields: ClassVar[frozenset[str]] = frozenset({"block_size", "page_size_padded"})

    block_size: int = attrs.field(validator=positive_int)
    page_size_padded: int | None = attrs.field(default=None, validator=optional_positive_int)

    def __attrs_post_init__(self) -> None:
        parts = self.page_parts()
        if not parts:
            msg = f"{type(self).__name__}.page_parts() returned no part; describe the page"
            raise InvalidSpecError(msg)
        ordered = sorted(parts, key=lambda part: part.offset)
        for before, after in itertools.pairwise(ordered):
            if after.offset < before.end:
                msg = (
                    f"{type(self).__name__}.page_parts(): part {after.name!r} (bytes "
                    f"{after.offset}-{after.end}) overlaps part {before.name!r} (bytes "
                    f"{before.offset}-{before.end}); give each part its own bytes"
                )
                raise InvalidSpecError(msg)
        if self.page_size_padded is not None and self.page_size_padded < (
            real := self.real_page_size_bytes
        ):
            msg = (
                f"{type(self).__name__}.page_size_padded ({self.page_size_padded} bytes) "
                f"is smaller than the page it pads ({real} bytes); "
                "pad to at least the natural page size or leave it unset"
            )
            raise InvalidSpecError(msg)

    def page_parts(self) -> tuple[PagePart, ...]:
        """The typed arrays of one page: the one description of the page's layout.

        The natural page size (``real_page_size_bytes``) is the end of the
        last part, and torch allocation (:func:`kvcore.allocate_kv_cache`)
        views every part, so what a spec says about its page and what is
        allocated cannot disagree.

        Raises:
            NotImplementedError: the subclass does not describe its page.
        """
        msg = f"{type(self).__name__} must describe its page: implement page_parts()"
        raise NotImplementedError(msg)

    @functools.cached_property
    def real_page_size_bytes(self) -> int:
        """The natural page: bytes up to the end of the last :meth:`page_parts` part.

        Derived, never overridden (a registry refuses a spec class that does).
        """
        return max(part.end for part in self.page_parts())

    @property
    def page_size_bytes(self) -> int:
        """Bytes one block of one layer occupies (``page_size_padded``, else the natural page)."""
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.real_page_size_bytes

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """Most bytes one request can hold in one layer of this spec.

        Args:
            limits: The per-request token limits of the engine.
        """
        msg = f"{type(self).__name__} must implement max_memory_usage_bytes"
        raise NotImplementedError(msg)

    @property
    def pool_reserved_blocks(self) -> int:
        """Blocks a group of this spec takes out of the pool once, for all requests.

        0 for most types; attention sinks keep their sink tokens in blocks
        reserved when the manager is built. Sizing adds these to the blocks
        the requests need.
        """
        return 0

    def tokens_read(self, position: int) -> tuple[range, ...]:
        """Earlier tokens whose cached KV (or state) the query at ``position`` reads.

        The type's declared attention rule. :func:`kvcore.testing.check_plugin`
        builds its brute-force cache-hit oracle from it (a hit of ``L`` tokens
        is usable when every token read at position ``L`` sits in a cached
        block), and checks that no block a manager freed is still read. The
        default, every earlier token, is right for types that attend to the
        whole context.

        Args:
            position: Index of the token being computed (= tokens before it).

        Returns:
            Disjoint, increasing ranges of token indices, all below ``position``.
        """
        return (range(position),)

    def positions_read(self, start: int, stop: int | None = None) -> tuple[range, ...]:
        """Cached positions before ``start`` that a step computing ``[start, stop)`` reads.

        What the layer's kernel gathers from the cache, besides the step's own
        positions (which an attention layer writes and then reads too): the
        union, below ``start``, of :meth:`tokens_read` over the step's
        positions. It differs from :meth:`tokens_read` only for a layer
        allocated for more tokens than it attends to (a window planned as
        full attention, whose ``compute_spec`` says what it computes):
        :meth:`tokens_read` is the allocation's rule (what a cache hit needs),
        this is the computation's. The default evaluates the union exactly,
        one :meth:`tokens_read` call per position of the step; types with a
        closed form override it.

        Args:
            start: The step's first position (the request's computed tokens).
            stop: One past its last position; default ``start + 1`` (one query).

        Returns:
            Disjoint, increasing ranges of positions, all below ``start``.

        Raises:
            ValueError: ``start`` is negative or ``stop`` is not above it.
        """
        stop = _check_step(start, stop)
        covered: list[range] = []
        for position in range(start, stop):
            for read in self.tokens_read(position):
                low, high = read.start, min(read.stop, start)
                if low < high:
                    covered.append(range(low, high))
        return _union(covered)

    # -- planning protocol: how layers of this type are grouped and sized ---------------
    # Planning (kvcore.planning.get_kv_cache_groups, kvcore.plan) asks the spec classes
    # every type-specific question, so the core never names an attention type.

    #: The layer keeps every token of the request (full attention, MLA, ...).
    #: Planning with the hybrid manager disabled allocates local layers with
    #: the block size of these layers.
    attends_to_all_tokens: ClassVar[bool] = False
    #: Layers of this type never join another layer's group; each gets its
    #: own group and block table, with a block size fitted to the common page
    #: (hidden-state caches).
    keeps_own_group: ClassVar[bool] = False
    #: The page grows with the block size (attention). ``False`` for a
    #: fixed-size state (Mamba): its page is padded instead, and planning
    #: raises the attention block size until an attention page holds it.
    page_size_follows_block_size: ClassVar[bool] = True
    #: Block sizes of this type's kernels come in multiples of this many
    #: tokens; planning respects it when it raises the attention block size
    #: to fit a state page.
    kernel_block_alignment: ClassVar[int] = 16
    #: Role in the allocation-only fallback (see :data:`FallbackRole`).
    full_allocation_fallback: ClassVar[FallbackRole] = "neutral"

    @classmethod
    def merge(cls, specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
        """Return the one spec a group of layers with these specs follows.

        Called on the class of the first spec. The default accepts only
        identical specs and returns the first; a type whose layers may differ
        in fields that do not change allocation overrides it.

        Args:
            specs: The layers' specs, at least one.

        Raises:
            InvalidSpecError: the specs cannot share one block table; the
                message names the first spec that differs.
        """
        if not specs:
            msg = f"{cls.__name__}.merge needs at least one spec"
            raise InvalidSpecError(msg)
        first = specs[0]
        for spec in specs[1:]:
            if spec != first:
                msg = (
                    f"{cls.__name__}.merge: layers of one KV cache group need identical "
                    f"specs, but {spec!r} differs from {first!r}"
                )
                raise InvalidSpecError(msg)
        return first

    @property
    def uniform_type_key(self) -> Hashable:
        """Layers with equal keys and block sizes need the same token slots.

        Such layers can share one block table even when their pages differ
        (different head sizes, say): planning then puts them in one group
        whose block holds one page of every layer. The default is the spec
        class with the value of every field not listed in
        :attr:`page_only_fields` (a window, a chunk size, ...), so layers
        that differ in such a field never share a table. Types override it
        to share a key with another class of the same needs
        (:data:`ALL_TOKENS_KEY`).
        """
        cls = type(self)
        skip = self.page_only_fields
        return (
            cls,
            *(getattr(self, f.name) for f in attrs.fields(cls) if f.name not in skip),
        )

    def grown_to_page(self, page_size: int) -> KVCacheSpec | None:
        """Return this spec with its page grown to ``page_size`` bytes, if it can be.

        Planning calls it to give every layer the same page. The default
        accepts only the current page size.

        Args:
            page_size: The target page, in bytes; at least the current page.

        Returns:
            The grown spec, or ``None`` if this type cannot take that page
            (planning then tries the allocation-only fallback, else fails).
        """
        return self if page_size == self.page_size_bytes else None

    def fitted_to_page(self, page_size: int, block_size_divisor_of: int) -> KVCacheSpec | None:
        """Return this spec re-sized to live alone in a ``page_size``-byte page.

        Used for layers that keep their own group (:attr:`keeps_own_group`):
        the block size must divide ``block_size_divisor_of`` (so the group's
        hashes line up with the others') and the page is padded to
        ``page_size``. The default cannot be fitted.

        Returns:
            The fitted spec, or ``None`` if it cannot be fitted.
        """
        return None

    #: The spec class that allocates this type's layers for every token, when
    #: planning promotes a local layer (engines without the hybrid manager, and
    #: the allocation-only fallback); ``None``: the type is not promoted. The
    #: layer keeps computing its own attention; only its allocation changes.
    #: Declaring it makes the plugin registering that class a dependency: a
    #: registry without it is refused when it is built.
    promoted_to: ClassVar[type[KVCacheSpec] | None] = None

    @classmethod
    def allocating_for(cls, spec: KVCacheSpec, block_size: int) -> KVCacheSpec:
        """A spec of this class allocating ``spec``'s layer for every token.

        Implemented by the classes other types name in :attr:`promoted_to`.

        Args:
            spec: The promoted layer's own spec.
            block_size: Block size of the result, in tokens.

        Raises:
            NotImplementedError: this class does not allocate other types' layers.
        """
        msg = f"{cls.__name__} cannot allocate other types' layers (allocating_for)"
        raise NotImplementedError(msg)

    def aligned_to_attention_block_size(self, block_size: int) -> KVCacheSpec:
        """This spec after planning raised the attention block size to ``block_size``.

        Planning raises the block size of the attention layers until one of
        their pages holds a recurrent state (see
        :attr:`page_size_follows_block_size`). The default: a spec whose page
        follows the block size takes the new block size; any other spec is
        unchanged. A state cached per attention block overrides it to follow.

        Raises:
            InvalidSpecError: the spec does not accept the new block size.
        """
        if self.page_size_follows_block_size:
            return attrs.evolve(self, block_size=block_size)
        return self


#: A spec type: what a manager class serves, a layer type registers.
SpecT = TypeVar("SpecT", bound=KVCacheSpec)


@attrs.frozen(kw_only=True)
class AttentionSpec(KVCacheSpec):
    """A layer that stores a key and a value vector per token and KV head.

    The page of one block is one array of ``(block_size, num_kv_heads,
    head_size + head_size_v)`` elements (:meth:`page_parts`), or
    ``page_size_padded`` bytes when that is set. A subclass whose page holds
    something else (fewer vectors, a packed record) overrides
    :meth:`page_parts`; the page must stay ``block_size ×``
    :attr:`bytes_per_token` bytes, which is checked when the spec is made.

    Attributes:
        num_kv_heads: Key/value heads stored per token (> 0).
        head_size: Width of a key vector, in elements (> 0).
        head_size_v: Width of a value vector, in elements (>= 0); defaults to
            ``head_size``. 0 for layers with no separate value (MLA).
        dtype: Element type, as a name (``"bfloat16"``) or a ``torch.dtype``,
            stored as its canonical name; or a :class:`KVFormat` (or its
            name) among the class's :attr:`kv_formats`, stored as the format:
            the page then holds packed values and their scales.
    """

    page_only_fields: ClassVar[frozenset[str]] = KVCacheSpec.page_only_fields | {
        "num_kv_heads",
        "head_size",
        "head_size_v",
        "dtype",
    }

    num_kv_heads: int = attrs.field(validator=positive_int)
    head_size: int = attrs.field(validator=positive_int)
    head_size_v: int = attrs.field(
        default=attrs.Factory(lambda self: self.head_size, takes_self=True),
        validator=non_negative_int,
    )
    dtype: str | KVFormat = attrs.field(
        # mypy's attrs plugin does not read attrs.Converter (it converts to str | KVFormat).
        converter=attrs.Converter(_convert_cache_dtype, takes_self=True, takes_field=True)  # type: ignore[misc]
    )

    #: The quantized formats this class stores (its page parts and its
    #: reference kernel handle them); a ``dtype`` naming another format is
    #: refused when the spec is made. Checked when a registry is built: no
    #: two different formats of one name in one registry.
    kv_formats: ClassVar[tuple[KVFormat, ...]] = ()

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        if self.real_page_size_bytes % self.block_size:
            msg = (
                f"{type(self).__name__}: its page parts end at byte {self.real_page_size_bytes}, "
                f"not a whole number of bytes for each of its {self.block_size} tokens; an "
                "attention page must grow by the same bytes per token (page_parts)"
            )
            raise InvalidSpecError(msg)

    @property
    def kv_format(self) -> KVFormat | None:
        """The quantized format of the page, or ``None`` for a plain ``dtype``."""
        return self.dtype if isinstance(self.dtype, KVFormat) else None

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token takes in one layer's page (the natural page over ``block_size``)."""
        return self.real_page_size_bytes // self.block_size

    def pages_for_tokens(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens (``ceil(num_tokens / block_size)``)."""
        return cdiv(num_tokens, self.block_size)

    def grown_to_page(self, page_size: int) -> AttentionSpec | None:
        """Scale the block size when the target is a whole multiple of the page, else pad.

        More tokens per block keep the bytes per token; padding keeps the
        block size and leaves the page's tail unused (read through strided
        views).
        """
        current = self.page_size_bytes
        if page_size < current:
            return None
        if page_size == current:
            return self
        if page_size % current == 0:
            ratio = page_size // current
            padded = None if self.page_size_padded is None else self.page_size_padded * ratio
            return attrs.evolve(self, block_size=self.block_size * ratio, page_size_padded=padded)
        return attrs.evolve(self, page_size_padded=page_size)

    def fitted_to_page(self, page_size: int, block_size_divisor_of: int) -> AttentionSpec | None:
        """The largest block size dividing ``block_size_divisor_of`` whose page fits, padded."""
        per_token = self.bytes_per_token
        limit = max(page_size // per_token, 1)
        block_size = next(
            size
            for size in range(min(block_size_divisor_of, limit), 0, -1)
            if block_size_divisor_of % size == 0
        )
        if block_size * per_token > page_size:
            return None
        return attrs.evolve(self, block_size=block_size, page_size_padded=page_size)

    def page_parts(self) -> tuple[PagePart, ...]:
        """One array per block: ``(block_size, num_kv_heads, head_size + head_size_v)``.

        Keys and values sit side by side in the last axis: the key of token
        ``t``, head ``h`` is ``[t, h, :head_size]``, its value
        ``[t, h, head_size:]``. With a :class:`KVFormat` as ``dtype``, the
        format's packed ``"kv"`` part and its ``"kv_scale"`` part
        (:meth:`KVFormat.page_parts`).
        """
        if isinstance(self.dtype, KVFormat):
            return self.dtype.page_parts(
                block_size=self.block_size,
                num_kv_heads=self.num_kv_heads,
                head_size=self.head_size,
                head_size_v=self.head_size_v,
            )
        shape = (self.block_size, self.num_kv_heads, self.head_size + self.head_size_v)
        return (PagePart(name="kv", offset=0, shape=shape, dtype=self.dtype),)
