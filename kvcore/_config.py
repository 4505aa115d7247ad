"""The planned KV cache: groups of layers, a block count and the backing tensors."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec

__all__ = ["KVCacheConfig", "KVCacheGroupSpec", "KVCacheTensor"]


def _str_tuple(value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, str):
        msg = f"expected a sequence of layer names, got the string {value!r}"
        raise InvalidConfigError(msg)
    return tuple(value)


@attrs.frozen(kw_only=True)
class KVCacheGroupSpec:
    """Layers that share one block table per request, and their common spec.

    Attributes:
        layer_names: The layers of the group.
        kv_cache_spec: The spec every layer of the group follows.
    """

    layer_names: tuple[str, ...] = attrs.field(converter=_str_tuple)
    kv_cache_spec: KVCacheSpec = attrs.field(validator=attrs.validators.instance_of(KVCacheSpec))


@attrs.frozen(kw_only=True)
class KVCacheTensor:
    """One backing buffer of the KV cache and the layers that share it.

    Attributes:
        size: Bytes of the buffer.
        shared_by: Layers whose pages live in this buffer (one layer per
            group: a block id belongs to one group at a time, so the i-th
            layers of all groups can use the same bytes).
    """

    size: int
    shared_by: tuple[str, ...] = attrs.field(converter=_str_tuple)


def _check_num_blocks(instance: object, attribute: object, value: object) -> None:
    if type(value) is not int or value < 1:
        msg = f"KVCacheConfig.num_blocks must be an integer >= 1 (the null block), got {value!r}"
        raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class KVCacheConfig:
    """Everything the KV cache manager and the model runner need to agree on.

    Attributes:
        num_blocks: Blocks in the pool, the null block (id 0) included.
        kv_cache_groups: The groups, in group-id order.
        kv_cache_tensors: The backing buffers (empty for a manager-only config).
    """

    num_blocks: int = attrs.field(validator=_check_num_blocks)
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = attrs.field(converter=tuple)
    kv_cache_tensors: tuple[KVCacheTensor, ...] = attrs.field(default=(), converter=tuple)

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
