"""The planned KV cache: groups of layers, a block count and the backing tensors."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Literal

import attrs

from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec, KVFormat

__all__ = ["KVCacheConfig", "KVCacheGroupSpec", "KVCacheLayout", "KVCacheTensor", "PagePool"]

#: How the pages of the layers are laid out in the backing allocation.
#: ``"layer_outer"``: each layer's pages are one contiguous run, block after
#: block (``[layer][block][page]``); the i-th layers of all groups share one
#: run. ``"block_outer"``: each block is one contiguous chunk holding the
#: pages of all layers of the group that owns it (``[block][layer][page]``).
KVCacheLayout = Literal["layer_outer", "block_outer"]
LAYOUTS: tuple[KVCacheLayout, ...] = ("layer_outer", "block_outer")


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        msg = f"expected a sequence of layer names, got the string {value!r}"
        raise InvalidConfigError(msg)
    return tuple(value)


def _spec_tuple(value: Iterable[KVCacheSpec] | None) -> tuple[KVCacheSpec, ...] | None:
    return None if value is None else tuple(value)


@attrs.frozen(kw_only=True)
class KVCacheGroupSpec:
    """Layers that share one block table per request, and their common spec.

    Attributes:
        layer_names: The layers of the group.
        kv_cache_spec: The spec the group's manager follows (block size,
            attention type). For a group of layers of one type with different
            pages (``layer_specs`` set) it is the first layer's spec.
        layer_specs: Each layer's own spec, in ``layer_names`` order, when the
            layers share token slots but not pages (different head sizes, or
            pages packed side by side); one block of the group then holds one
            page of every layer. ``None``: every layer follows
            ``kv_cache_spec``.
    """

    layer_names: tuple[str, ...] = attrs.field(converter=_str_tuple)
    kv_cache_spec: KVCacheSpec = attrs.field(validator=attrs.validators.instance_of(KVCacheSpec))
    layer_specs: tuple[KVCacheSpec, ...] | None = attrs.field(default=None, converter=_spec_tuple)

    def __attrs_post_init__(self) -> None:
        if self.layer_specs is not None and len(self.layer_specs) != len(self.layer_names):
            msg = (
                f"KVCacheGroupSpec.layer_specs has {len(self.layer_specs)} specs for "
                f"{len(self.layer_names)} layers; give one spec per layer name"
            )
            raise InvalidConfigError(msg)

    def spec_of(self, layer_name: str) -> KVCacheSpec:
        """The spec of one layer of the group.

        Raises:
            InvalidConfigError: the layer is not in the group.
        """
        try:
            index = self.layer_names.index(layer_name)
        except ValueError:
            msg = f"layer {layer_name!r} is not in this group ({', '.join(self.layer_names)})"
            raise InvalidConfigError(msg) from None
        return self.kv_cache_spec if self.layer_specs is None else self.layer_specs[index]

    def items(self) -> Iterator[tuple[str, KVCacheSpec]]:
        """``(layer name, spec)`` for every layer, in order."""
        specs = self.layer_specs or (self.kv_cache_spec,) * len(self.layer_names)
        return zip(self.layer_names, specs, strict=True)

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block of this group holds (one page of every layer)."""
        return sum(spec.page_size_bytes for _, spec in self.items())


@attrs.frozen(kw_only=True)
class KVCacheTensor:
    """A run of layers inside the one backing allocation of the KV cache.

    The page of block ``b`` of ``layers[j]`` starts at byte ``offset + j ×
    layer_stride + b × block_stride`` of the backing allocation, whose size is
    ``size`` bytes. Every tensor of a config has the same ``size``: they are
    views of one buffer, and tensors of different groups overlap. That is
    safe because a block id belongs to one group at a time.

    Attributes:
        size: Bytes of the backing allocation (the same for every tensor).
        layers: Layers laid out in this run, all with the same page.
        layer_stride: Bytes from one layer of the run to the next.
        block_stride: Bytes from one block of a layer to the next.
        offset: Byte offset of the run's first layer.
        num_blocks: Blocks of each of the run's layers: the config's
            ``num_blocks`` when ``None``; with a two-level pool, the small
            pages of the layers' page class.
    """

    size: int
    layers: tuple[str, ...] = attrs.field(converter=_str_tuple)
    layer_stride: int
    block_stride: int
    offset: int = 0
    num_blocks: int | None = None

    def page_offset(self, layer_index: int, block_id: int) -> int:
        """Byte offset of the page of block ``block_id`` of ``layers[layer_index]``."""
        return self.offset + layer_index * self.layer_stride + block_id * self.block_stride


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class PagePool:
    """How a two-level pool carves its memory: large pages, cut into small pages per class.

    Each page class is one page size among the groups; a group's block ids
    are small-page ids of its class. A large page belongs to one class at a
    time (or to none, then it is free): class ``c``'s small page ``s`` is the
    ``s % k``-th of large page ``s // k``, with ``k = large_page_bytes //
    class_page_bytes[c]``. Large page 0 holds every class's null block and
    is never handed out.

    Attributes:
        large_page_bytes: Bytes of one large page, in each backing run.
        num_large_pages: Large pages, large page 0 included.
        class_page_bytes: Bytes of one small page of each class (each
            divides ``large_page_bytes``), by class.
        group_classes: The class of each KV cache group, by group id.

    Raises:
        InvalidConfigError: a count or size is not a positive integer, a
            class page does not divide the large page, or a group names no
            class.
    """

    large_page_bytes: int
    num_large_pages: int
    class_page_bytes: tuple[int, ...] = attrs.field(converter=_int_tuple)
    group_classes: tuple[int, ...] = attrs.field(converter=_int_tuple)

    def __attrs_post_init__(self) -> None:
        for name in ("large_page_bytes", "num_large_pages"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                msg = f"PagePool.{name} must be a positive integer, got {value!r}"
                raise InvalidConfigError(msg)
        for page in self.class_page_bytes:
            if type(page) is not int or page < 1 or self.large_page_bytes % page:
                msg = (
                    f"PagePool.class_page_bytes: {page!r} is not a positive divisor of the "
                    f"{self.large_page_bytes}-byte large page"
                )
                raise InvalidConfigError(msg)
        for klass in self.group_classes:
            if type(klass) is not int or not 0 <= klass < len(self.class_page_bytes):
                msg = (
                    f"PagePool.group_classes: {klass!r} is not a class "
                    f"(0..{len(self.class_page_bytes) - 1})"
                )
                raise InvalidConfigError(msg)

    @property
    def num_classes(self) -> int:
        """Page classes."""
        return len(self.class_page_bytes)

    def pages_per_large_page(self, klass: int) -> int:
        """Small pages of class ``klass`` one large page holds."""
        return self.large_page_bytes // self.class_page_bytes[klass]

    def num_blocks(self, klass: int) -> int:
        """Small-page ids of class ``klass`` (over every large page, the null page's included)."""
        return self.num_large_pages * self.pages_per_large_page(klass)


def _group_tuple(groups: Iterable[KVCacheGroupSpec]) -> tuple[KVCacheGroupSpec, ...]:
    return tuple(groups)


def _tensor_tuple(tensors: Iterable[KVCacheTensor]) -> tuple[KVCacheTensor, ...]:
    return tuple(tensors)


def _check_num_blocks(instance: object, attribute: attrs.Attribute[int], value: Any) -> None:
    if type(value) is not int or value < 1:
        msg = f"KVCacheConfig.num_blocks must be an integer >= 1 (the null block), got {value!r}"
        raise InvalidConfigError(msg)


def _check_layout(instance: object, attribute: object, value: object) -> None:
    if value not in LAYOUTS:
        msg = f"KVCacheConfig.layout must be one of {', '.join(LAYOUTS)}, got {value!r}"
        raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class KVCacheConfig:
    """Everything the KV cache manager and the model runner need to agree on.

    Attributes:
        num_blocks: Blocks in the pool, the null block (id 0) included. With a
            two-level pool: its large pages (``page_pool.num_large_pages``).
        kv_cache_groups: The groups, in group-id order.
        kv_cache_tensors: The views of the backing allocation (empty for a
            manager-only config).
        layout: How pages are laid out in the backing allocation (see
            :data:`kvcore.KVCacheLayout`).
        page_pool: ``None``: one page size for every group, one pool of
            ``num_blocks`` blocks (the reference's design). Otherwise the
            two-level pool every group's pages are carved from.

    Building one raises :class:`~kvcore.errors.InvalidConfigError` on a bad block
    count or layout, or on a page pool whose classes do not match the groups.
    """

    num_blocks: int = attrs.field(validator=_check_num_blocks)
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = attrs.field(converter=_group_tuple)
    kv_cache_tensors: tuple[KVCacheTensor, ...] = attrs.field(default=(), converter=_tensor_tuple)
    layout: KVCacheLayout = attrs.field(default="layer_outer", validator=_check_layout)
    page_pool: PagePool | None = None

    def __attrs_post_init__(self) -> None:
        pool = self.page_pool
        if pool is None:
            return
        if len(pool.group_classes) != len(self.kv_cache_groups):
            msg = (
                f"KVCacheConfig.page_pool names a class for {len(pool.group_classes)} groups, "
                f"the config has {len(self.kv_cache_groups)}"
            )
            raise InvalidConfigError(msg)
        if pool.num_large_pages != self.num_blocks:
            msg = (
                f"KVCacheConfig.num_blocks ({self.num_blocks}) must equal the page pool's "
                f"num_large_pages ({pool.num_large_pages})"
            )
            raise InvalidConfigError(msg)

    @classmethod
    def from_specs(cls, num_blocks: int, specs: Sequence[KVCacheSpec]) -> KVCacheConfig:
        """A config with one single-layer group per spec, named ``layer.<i>``.

        For tests and for engines that plan their groups themselves.
        """
        groups = tuple(
            KVCacheGroupSpec(layer_names=(f"layer.{i}",), kv_cache_spec=spec)
            for i, spec in enumerate(specs)
        )
        return cls(num_blocks=num_blocks, kv_cache_groups=groups)

    @property
    def bytes_per_block(self) -> int:
        """The bytes one block id costs across all layers, the widest group's block.

        Groups alias the same bytes, so this is a maximum, not a sum. 0 for a
        config without groups.
        """
        return max((group.bytes_per_block for group in self.kv_cache_groups), default=0)

    @property
    def size_bytes(self) -> int:
        """Bytes of the backing allocation (0 for a manager-only config)."""
        return self.kv_cache_tensors[0].size if self.kv_cache_tensors else 0

    def group_of(self, layer_name: str) -> int:
        """Index of the group holding ``layer_name``.

        Raises:
            InvalidConfigError: no group holds the layer.
        """
        for index, group in enumerate(self.kv_cache_groups):
            if layer_name in group.layer_names:
                return index
        msg = f"layer {layer_name!r} is in no KV cache group of this config"
        raise InvalidConfigError(msg)

    def layer_spec(self, layer_name: str) -> KVCacheSpec:
        """The spec of one layer, from the group that holds it."""
        return self.kv_cache_groups[self.group_of(layer_name)].spec_of(layer_name)

    def tensor_of(self, layer_name: str) -> tuple[KVCacheTensor, int]:
        """The tensor laying out ``layer_name`` and the layer's index in it.

        Raises:
            InvalidConfigError: no tensor lays the layer out.
        """
        for tensor in self.kv_cache_tensors:
            if layer_name in tensor.layers:
                return tensor, tensor.layers.index(layer_name)
        msg = f"layer {layer_name!r} is laid out by no tensor of this config"
        raise InvalidConfigError(msg)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description: groups (layers, spec fields), tensors, layout, page pool."""
        return {
            "num_blocks": self.num_blocks,
            "layout": self.layout,
            "page_pool": None if self.page_pool is None else attrs.asdict(self.page_pool),
            "bytes_per_block": self.bytes_per_block,
            "kv_cache_groups": [
                {
                    "layer_names": list(group.layer_names),
                    "kind": group.kv_cache_spec.kind,
                    "spec": _spec_dict(group.kv_cache_spec),
                    "layer_specs": None
                    if group.layer_specs is None
                    else [_spec_dict(spec) for spec in group.layer_specs],
                }
                for group in self.kv_cache_groups
            ],
            "kv_cache_tensors": [attrs.asdict(tensor) for tensor in self.kv_cache_tensors],
        }


def _field_value(value: Any) -> Any:
    """A spec field as JSON holds it: tuples as lists, nested specs and KV formats as objects."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, KVCacheSpec):
        return _spec_dict(value)
    if isinstance(value, KVFormat):
        return attrs.asdict(value)
    return value


def _spec_dict(spec: KVCacheSpec) -> dict[str, Any]:
    fields = {k: _field_value(v) for k, v in attrs.asdict(spec, recurse=False).items()}
    return {"class": type(spec).__qualname__, "page_size_bytes": spec.page_size_bytes, **fields}
