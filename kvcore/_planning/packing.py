"""Packed groups: pages of different sizes side by side in block-outer blocks.

With the block-outer layout each block id is one contiguous chunk holding the
pages of all layers of the group that owns it, so layers need not share one
page size. Groups should still need about the same bytes per block, because a
block costs as much as the widest group's.

1. Layers are bucketed greedily in layer order: a layer joins the first bucket
   it shares token slots with (:func:`~kvcore._planning.unify.is_uniform_type`),
   else opens a new one.
2. A bucket is *balanced* when every page size in it has as many layers (a
   repeating pattern of one layer per page size, as an MLA layer and its
   indexer). Only balanced buckets are split by pattern repeats; others stay
   whole.
3. The repeats per group are the approximate gcd of the balanced buckets'
   layers per page size, at least the largest balanced bucket that mixes
   page sizes (that bucket stays whole).
4. A state bucket (pages that do not follow the block size, as Mamba) is
   split further so one group holds no more states than fit in the widest
   block the other buckets already need: a state bucket never widens the
   block.
5. Group ``i`` of a bucket split into ``G`` groups takes repeats ``i, i + G,
   ...`` (strided, as in uniform-page grouping).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from kvcore._config import KVCacheGroupSpec
from kvcore._planning.group_size import approximate_gcd
from kvcore._planning.unify import is_uniform_type
from kvcore._utils import cdiv
from kvcore.specs import KVCacheSpec

__all__ = ["packed_groups", "same_slots_group"]


def same_slots_group(names: list[str], specs: list[KVCacheSpec]) -> KVCacheGroupSpec:
    """One group of layers that need the same token slots, pages possibly different.

    The group's spec is the first layer's (what its manager follows); each
    layer keeps its own spec unless all are equal.
    """
    if all(spec == specs[0] for spec in specs):
        return KVCacheGroupSpec(layer_names=names, kv_cache_spec=specs[0])
    return KVCacheGroupSpec(layer_names=names, kv_cache_spec=specs[0], layer_specs=specs)


@attrs.define
class _Bucket:
    specs: dict[str, KVCacheSpec]
    by_page: dict[int, list[str]] = attrs.field(factory=dict)

    @property
    def balanced(self) -> bool:
        return len({len(names) for names in self.by_page.values()}) == 1

    @property
    def max_layers_per_page(self) -> int:
        return max(len(names) for names in self.by_page.values())

    @property
    def is_state(self) -> bool:
        return not next(iter(self.specs.values())).page_size_follows_block_size

    def widest_group_bytes(self, num_groups: int) -> int:
        """Bytes per block of the largest of ``num_groups`` groups this bucket splits into."""
        return sum(cdiv(len(names), num_groups) * page for page, names in self.by_page.items())


def packed_groups(layer_specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """Group layers for the block-outer layout; ``None`` if all pages are equal.

    Args:
        layer_specs: Layer name → spec, in layer order; hidden-state layers
            already removed.
    """
    if len({spec.page_size_bytes for spec in layer_specs.values()}) <= 1:
        return None

    buckets: list[_Bucket] = []
    for name, spec in layer_specs.items():
        for bucket in buckets:
            if is_uniform_type([*bucket.specs.values(), spec]):
                bucket.specs[name] = spec
                break
        else:
            buckets.append(_Bucket({name: spec}))
    for bucket in buckets:
        for name, spec in bucket.specs.items():
            bucket.by_page.setdefault(spec.page_size_bytes, []).append(name)

    min_repeats = max(
        (b.max_layers_per_page for b in buckets if b.balanced and len(b.by_page) > 1), default=0
    )
    repeats = (
        approximate_gcd(
            [b.max_layers_per_page for b in buckets if b.balanced], lower_bound=min_repeats
        )
        if min_repeats
        else None
    )

    def groups_for(bucket: _Bucket) -> int:
        if bucket.balanced and repeats is not None:
            return cdiv(bucket.max_layers_per_page, repeats)
        return 1

    anchor = max(
        b.widest_group_bytes(len(b.specs) if b.is_state else groups_for(b)) for b in buckets
    )

    groups: list[KVCacheGroupSpec] = []
    for bucket in buckets:
        count = groups_for(bucket)
        if bucket.is_state:
            state_page = next(iter(bucket.by_page))
            count = max(count, cdiv(len(bucket.specs), max(anchor // state_page, 1)))
        if count == 1:
            names = list(bucket.specs)
            groups.append(same_slots_group(names, [bucket.specs[n] for n in names]))
            continue
        pattern = list(zip(*bucket.by_page.values(), strict=True))
        for i in range(count):
            names = [name for repeat in pattern[i::count] for name in repeat]
            groups.append(same_slots_group(names, [bucket.specs[n] for n in names]))
    return groups
