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

A two-level pool (:mod:`.page_classes`) lays out each backing run as
``num_large_pages`` large pages one after the other. A group's block ids are
the small pages of its class: small page ``s`` of a class with ``k`` pages
per large page is the ``s % k``-th of large page ``s // k``, so it starts at
``s × class page`` within the run, and a layer's view is still strided by
one page (the class page) from one block id to the next::

    run j:  | large 0: null blocks | large 1: class 1 | large 2: class 0      | ...
                                    [ s=2  | s=3     ][ s=134 | ... | s=200 ]
            (class 1: 2 small pages per large page; class 0: 67)

Layer-outer: layer ``j`` of every group lies in run ``j`` (there are as many
runs as the largest group has layers). Block-outer: one run, a small page
holding the pages of all the group's layers side by side.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcore._config import KVCacheGroupSpec, KVCacheLayout, KVCacheTensor
from kvcore._planning.page_classes import PageClasses
from kvcore.errors import InvalidConfigError
from kvcore.specs import KVCacheSpec

__all__ = ["bytes_per_block", "check_layout", "layout_tensors", "two_level_tensors"]


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


def _consecutive_runs(group: KVCacheGroupSpec) -> list[tuple[int, KVCacheSpec, list[str]]]:
    """``(index of the first layer, spec, layers)`` for each stretch of layers of one spec."""
    runs: list[tuple[int, KVCacheSpec, list[str]]] = []
    for index, (name, spec) in enumerate(group.items()):
        if runs and runs[-1][1] == spec:
            runs[-1][2].append(name)
        else:
            runs.append((index, spec, [name]))
    return runs


def two_level_tensors(
    groups: Sequence[KVCacheGroupSpec], classes: PageClasses, num_large_pages: int
) -> list[KVCacheTensor]:
    """The tensors of every group in a two-level pool of ``num_large_pages`` large pages.

    Each tensor's ``block_stride`` is its group's class page and its
    ``num_blocks`` the class's small pages (see the module docstring).
    """
    run_bytes = classes.large_page_bytes * num_large_pages
    size = classes.num_runs * run_bytes
    tensors = []
    for group, klass in zip(groups, classes.group_classes, strict=True):
        page = classes.class_page_bytes[klass]
        blocks = num_large_pages * classes.pages_per_large_page(klass)
        if classes.layout == "layer_outer":
            for first, _, names in _consecutive_runs(group):
                tensors.append(
                    KVCacheTensor(
                        size=size,
                        layers=names,
                        layer_stride=run_bytes,
                        block_stride=page,
                        offset=first * run_bytes,
                        num_blocks=blocks,
                    )
                )
            continue
        by_spec: dict[KVCacheSpec, list[str]] = {}
        for name, spec in group.items():
            by_spec.setdefault(spec, []).append(name)
        used = 0  # bytes of the small page taken by the group's earlier layers
        for spec, names in by_spec.items():
            tensors.append(
                KVCacheTensor(
                    size=size,
                    layers=names,
                    layer_stride=spec.page_size_bytes,
                    block_stride=page,
                    offset=used,
                    num_blocks=blocks,
                )
            )
            used += len(names) * spec.page_size_bytes
    return tensors
