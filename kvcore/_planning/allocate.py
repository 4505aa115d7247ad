"""torch allocation: a :class:`~kvcore.KVCacheConfig` as one buffer and per-layer views.

torch is imported here, lazily, when :func:`allocate_kv_cache` is called:
importing kvcore never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kvcore._config import KVCacheConfig
from kvcore.errors import InvalidConfigError
from kvcore.specs import DTYPE_SIZES, PagePart

if TYPE_CHECKING:
    import torch

__all__ = ["KVCacheBuffers", "allocate_kv_cache"]


@attrs.frozen(kw_only=True)
class KVCacheBuffers:
    """The allocated KV cache: the backing buffer and every layer's views.

    Attributes:
        buffer: The one backing allocation, ``uint8``, ``config.size_bytes``
            bytes, zero-filled.
        views: Layer name → one view per :class:`~kvcore.specs.PagePart` of its
            spec, in order. Each view has shape ``(num_blocks, *part.shape)``
            (with a two-level pool, ``num_blocks`` is the small pages of the
            layer's page class, and ``view[b]`` is small page ``b``) and the
            part's dtype, and aliases ``buffer``: for attention, one
            ``(num_blocks, block_size, num_kv_heads, head_size + head_size_v)``
            tensor (keys then values in the last axis); for Mamba, one tensor
            per state.
        config: The config the buffers were allocated for.
    """

    buffer: torch.Tensor
    views: Mapping[str, tuple[torch.Tensor, ...]]
    config: KVCacheConfig

    def __getitem__(self, layer_name: str) -> torch.Tensor:
        """The single view of a layer whose page has one part (attention layers).

        Raises:
            KeyError: unknown layer.
            InvalidConfigError: the layer's page has several parts; use
                :attr:`views`.
        """
        parts = self.views[layer_name]
        if len(parts) != 1:
            msg = (
                f"layer {layer_name!r} has {len(parts)} page parts (a state with several "
                f"tensors); use buffers.views[{layer_name!r}]"
            )
            raise InvalidConfigError(msg)
        return parts[0]


def _torch_dtype(torch_module: Any, name: str) -> Any:
    return getattr(torch_module, name)


def _part_view(
    torch_module: Any,
    buffer: torch.Tensor,
    part: PagePart,
    *,
    page_offset: int,
    block_stride: int,
    num_blocks: int,
    layer: str,
) -> torch.Tensor:
    element = DTYPE_SIZES[part.dtype]
    start = page_offset + part.offset
    if start % element or block_stride % element:
        msg = (
            f"layer {layer!r}: part {part.name!r} ({part.dtype}) starts at byte {start} with "
            f"block stride {block_stride}, not multiples of its {element}-byte elements"
        )
        raise InvalidConfigError(msg)
    raw = torch_module.as_strided(
        buffer, size=(num_blocks, part.nbytes), stride=(block_stride, 1), storage_offset=start
    )
    typed = raw.view(_torch_dtype(torch_module, part.dtype))
    view: torch.Tensor = typed.unflatten(1, part.shape)
    return view


def allocate_kv_cache(config: KVCacheConfig, *, device: Any = "cpu") -> KVCacheBuffers:
    """Allocate the KV cache of ``config`` as torch tensors.

    One zero-filled ``uint8`` buffer of ``config.size_bytes`` bytes is
    allocated on ``device``; every layer gets strided views into it, placed
    exactly as the config's tensors say, so layers of different groups that
    the plan overlays share bytes and no others do. With a two-level pool
    (``config.page_pool``) the buffer holds each backing run's large pages
    and a layer's view is indexed by the small-page ids of its group's class
    (its tensor's ``num_blocks`` of them): a paged kernel still reads
    ``view[block_id]``.

    Args:
        config: A planned config (with tensors), e.g. ``kvcore.plan(...).kv_cache_config``.
        device: A torch device or its name.

    Returns:
        The buffer and the per-layer views.

    Raises:
        InvalidConfigError: the config has no tensors (built without
            planning), or a part of a page is not aligned to its element size.
    """
    import torch  # imported here: importing kvcore must not import torch

    if not config.kv_cache_tensors:
        if any(group.layer_names for group in config.kv_cache_groups):
            msg = (
                "this KVCacheConfig has no tensors (it was built for the manager only); plan "
                "it with kvcore.plan or kvcore.planning.get_kv_cache_config to allocate it"
            )
            raise InvalidConfigError(msg)
        empty = torch.zeros(0, dtype=torch.uint8, device=device)
        return KVCacheBuffers(buffer=empty, views={}, config=config)
    buffer = torch.zeros(config.size_bytes, dtype=torch.uint8, device=device)
    views: dict[str, tuple[torch.Tensor, ...]] = {}
    for tensor in config.kv_cache_tensors:
        blocks = config.num_blocks if tensor.num_blocks is None else tensor.num_blocks
        for index, layer in enumerate(tensor.layers):
            spec = config.layer_spec(layer)
            views[layer] = tuple(
                _part_view(
                    torch,
                    buffer,
                    part,
                    page_offset=tensor.page_offset(index, 0),
                    block_stride=tensor.block_stride,
                    num_blocks=blocks,
                    layer=layer,
                )
                for part in spec.page_parts()
            )
    return KVCacheBuffers(buffer=buffer, views=views, config=config)
