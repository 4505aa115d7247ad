"""Where every page lives: bytes per block and the tensors of both layouts.

All groups share one backing allocation of ``bytes_per_block × num_blocks``
bytes, and groups overlay each other from byte 0: a block id belongs to one
group at a time, so the bytes of block ``b`` serve whichever group owns it.

Layer-outer (``[layer][block][page]``; pages of one size across groups)::

    group 0: | A [ blk 0 | blk 1 | ... ] | B [ blk 0 | blk 1 | ... ] |
    group 1: | C [ blk 0 | blk 1 | ... ] | D [ blk 0 | blk 1 | ... ] |

Block-outer (``[block][layer][page]``; the packing repeats in every block)::

    group 0: | blk 0 [ A | B  | pad ] | blk 1 [ A | B  | pad ] | ...
    group 1: | blk 0 [  C  |    D   ] | blk 1 [  C  |    D   ] | ...
             |<--- bytes_per_block -->|
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcore._config import KVCacheGroupSpec, KVCacheLayout, KVCacheTensor
from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec

__all__ = ["bytes_per_block", "check_layout", "layout_tensors"]


def bytes_per_block(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Bytes one block id costs: the widest group's pages (groups alias, so a maximum)."""
    return max((group.bytes_per_block for group in groups), default=0)


def check_layout(groups: Sequence[KVCacheGroupSpec], layout: KVCacheLayout) -> None:
    """Refuse groups the layout cannot express.

    In the layer-outer layout the i-th layers of all groups share one run of
    pages, so with several groups every page must have the same size.

    Raises:
        InvalidConfigError: several groups with different page sizes in the
            layer-outer layout.
    """
    pages = {spec.page_size_bytes for group in groups for _, spec in group.items()}
    if layout == "layer_outer" and len(groups) > 1 and len(pages) > 1:
        msg = (
            f"the layer-outer layout needs one page size when there are several groups, got "
            f"pages of {sorted(pages)} bytes; use layout='block_outer' or unify the pages"
        )
        raise InvalidConfigError(msg)


def layout_tensors(
    groups: Sequence[KVCacheGroupSpec], num_blocks: int, layout: KVCacheLayout
) -> list[KVCacheTensor]:
    """The tensors (views of the one backing allocation) of every group.

    A group's layers with the same spec form one run (one tensor); runs of a
    group follow each other, and every group starts at byte 0.
    """
    block_bytes = bytes_per_block(groups)
    size = block_bytes * num_blocks
    tensors = []
    for group in groups:
        runs: dict[KVCacheSpec, list[str]] = {}
        for name, spec in group.items():
            runs.setdefault(spec, []).append(name)
        used = 0  # bytes of one block taken by the group's earlier runs
        for spec, names in runs.items():
            page = spec.page_size_bytes
            if layout == "layer_outer":
                tensor = KVCacheTensor(
                    size=size,
                    layers=names,
                    layer_stride=page * num_blocks,
                    block_stride=page,
                    offset=used * num_blocks,
                )
            else:
                tensor = KVCacheTensor(
                    size=size,
                    layers=names,
                    layer_stride=page,
                    block_stride=block_bytes,
                    offset=used,
                )
            tensors.append(tensor)
            used += len(names) * page
    return tensors
