"""What one request of the longest admitted length holds: blocks per group, per page class.

A request holds, in every group, at most the blocks its spec needs for the
longest admitted request (``ceil(max memory / page)``: every block of the
context for full attention, the window plus one step for a sliding window,
a few state slots for Mamba). Some types also take blocks out of the pool
once, for all requests (attention sinks). Both pools count the same blocks;
they differ in what a block costs (see :mod:`.sizing` and :mod:`.two_level`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcore._config import KVCacheGroupSpec
from kvcore._utils import cdiv
from kvcore.specs import TokenLimits

__all__ = [
    "blocks_per_request",
    "class_blocks",
    "class_reserved_blocks",
    "pages_per_request",
    "reserved_blocks",
]


def pages_per_request(group: KVCacheGroupSpec, limits: TokenLimits) -> int:
    """Blocks one request of the longest admitted length holds in ``group``.

    For a group whose layers have different pages, the largest count over its
    layers (every block holds one page of every layer).
    """
    specs = {group.kv_cache_spec} if group.layer_specs is None else set(group.layer_specs)
    return max(cdiv(s.max_memory_usage_bytes(limits), s.page_size_bytes) for s in specs)


def blocks_per_request(groups: Sequence[KVCacheGroupSpec], limits: TokenLimits) -> int:
    """Blocks one longest request holds across all groups."""
    return sum(pages_per_request(group, limits) for group in groups)


def reserved_blocks(groups: Sequence[KVCacheGroupSpec]) -> int:
    """Blocks the groups' managers take out of the pool once (attention sinks)."""
    return sum(group.kv_cache_spec.pool_reserved_blocks for group in groups)


def class_blocks(
    groups: Sequence[KVCacheGroupSpec],
    group_classes: Sequence[int],
    num_classes: int,
    limits: TokenLimits,
) -> list[int]:
    """Small pages one longest request holds in each page class (its groups' blocks summed)."""
    needs = [0] * num_classes
    for group, klass in zip(groups, group_classes, strict=True):
        needs[klass] += pages_per_request(group, limits)
    return needs


def class_reserved_blocks(
    groups: Sequence[KVCacheGroupSpec], group_classes: Sequence[int], num_classes: int
) -> list[int]:
    """Small pages each page class gives its groups' managers once (attention sinks)."""
    reserved = [0] * num_classes
    for group, klass in zip(groups, group_classes, strict=True):
        reserved[klass] += group.kv_cache_spec.pool_reserved_blocks
    return reserved
