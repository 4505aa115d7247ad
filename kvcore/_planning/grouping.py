"""Grouping: which layers share a block table (:func:`get_kv_cache_groups`).

The branches are tried in the reference engine's order:

1. unified mode (hybrid manager disabled): local layers become full attention;
2. no layers (attention-free model): no groups;
3. one spec for all layers: one group;
4. one type, pages possibly different (same token slots): one group whose
   block holds one page of every layer;
5. layers that keep their own group (hidden-state caches) are set aside;
6. block-outer layout with several page sizes: packed groups;
7. otherwise every page is grown to the largest (with the allocation-only
   fallback when that is impossible), and layers are grouped by uniform page
   size, with padding slots;
8. the set-aside layers get one group each, fitted to the common page.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from kvcore._config import LAYOUTS, KVCacheGroupSpec, KVCacheLayout
from kvcore._planning.group_size import choose_group_size
from kvcore._planning.packing import packed_groups, same_slots_group
from kvcore._planning.unify import (
    PageUnificationError,
    full_allocation_fallback,
    is_uniform_spec,
    is_uniform_type,
    promote_local_layers,
    unify_page_sizes,
)
from kvcore._utils import cdiv
from kvcore.errors import InvalidConfigError, InvalidSpecError
from kvcore.specs import KVCacheSpec, TokenLimits

__all__ = [
    "get_kv_cache_groups",
    "natural_page_groups",
    "uniform_page_buckets",
    "uniform_page_groups",
]


def get_kv_cache_groups(
    layer_specs: Mapping[str, KVCacheSpec],
    *,
    hybrid: bool = True,
    layout: KVCacheLayout = "layer_outer",
    group_size_rule: str = "reference",
    limits: TokenLimits | None = None,
) -> list[KVCacheGroupSpec]:
    """Split a model's layers into KV cache groups, each sharing one block table.

    Args:
        layer_specs: Layer name → spec, in layer order (the order decides
            bucket order and the strided split).
        hybrid: ``False`` reproduces engines that disable the hybrid manager:
            sliding-window and chunked layers are allocated as full attention
            (one block table for every layer).
        layout: ``"layer_outer"`` (pages of one size) or ``"block_outer"``
            (pages of different sizes may be packed side by side).
        group_size_rule: ``"reference"`` or ``"gcd"`` (padding weighted by
            the blocks a longest request holds; see the planning explanation).
        limits: Token limits; the ``"gcd"`` rule weighs padding by the blocks a
            longest request needs (without limits every padding slot counts
            once).

    Returns:
        The groups, an exact partition of the layers. Empty for a model
        without layers.

    Raises:
        InvalidConfigError: the layers cannot be grouped (pages that cannot
            be unified and no fallback, layers that cannot be promoted in
            unified mode, an unknown layout or rule); the message names the
            layer and what would fix it.
        InvalidSpecError: a spec transformed by grouping is invalid.
    """
    if layout not in LAYOUTS:
        msg = f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}"
        raise InvalidConfigError(msg)
    specs = promote_local_layers(layer_specs) if not hybrid else dict(layer_specs)
    if not specs:
        return []
    names, values = list(specs), list(specs.values())
    if is_uniform_spec(values):
        groups = [KVCacheGroupSpec(layer_names=names, kv_cache_spec=type(values[0]).merge(values))]
    elif is_uniform_type(values):
        groups = [same_slots_group(names, values)]
    else:
        groups = _hybrid_groups(specs, layout, group_size_rule, limits)
    _check_partition(specs, groups)
    return groups


def _hybrid_groups(
    specs: dict[str, KVCacheSpec],
    layout: KVCacheLayout,
    group_size_rule: str,
    limits: TokenLimits | None,
) -> list[KVCacheGroupSpec]:
    own = {name: spec for name, spec in specs.items() if spec.keeps_own_group}
    rest = {name: spec for name, spec in specs.items() if not spec.keeps_own_group}
    if layout == "block_outer":
        packed = packed_groups(rest)
        if packed is not None:
            # Blocks are strided by the widest group, so these need no fitting.
            return packed + [
                KVCacheGroupSpec(layer_names=[n], kv_cache_spec=s) for n, s in own.items()
            ]
    try:
        unified = unify_page_sizes(rest)
    except PageUnificationError:
        fallback = full_allocation_fallback(specs)
        if fallback is None:
            raise
        return [same_slots_group(*fallback)]
    groups = uniform_page_groups(unified, group_size_rule=group_size_rule, limits=limits)
    return _add_own_groups(groups, own)


def uniform_page_buckets(
    layer_specs: Mapping[str, KVCacheSpec],
) -> list[tuple[list[str], KVCacheSpec]]:
    """Layers that can share a group: identical specs, then mergeable ones.

    Returns:
        ``(layer names, merged spec)`` per bucket, in order of first
        appearance.
    """
    by_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in layer_specs.items():
        by_spec.setdefault(spec, []).append(name)
    buckets: list[tuple[list[str], list[KVCacheSpec]]] = []
    for spec, names in by_spec.items():
        for bucket_names, bucket_specs in buckets:
            try:
                type(bucket_specs[0]).merge([*bucket_specs, spec])
            except InvalidSpecError:
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            buckets.append((list(names), [spec]))
    return [(names, type(specs[0]).merge(specs)) for names, specs in buckets]


def _bucket_weights(
    buckets: list[tuple[list[str], KVCacheSpec]], limits: TokenLimits | None
) -> list[int] | None:
    if limits is None:
        return None
    return [cdiv(spec.max_memory_usage_bytes(limits), spec.page_size_bytes) for _, spec in buckets]


def uniform_page_groups(
    layer_specs: Mapping[str, KVCacheSpec],
    *,
    group_size_rule: str = "reference",
    limits: TokenLimits | None = None,
) -> list[KVCacheGroupSpec]:
    """Group layers that all have one page size into groups of equal size.

    Each bucket of ``n`` layers becomes ``G = ceil(n / size)`` groups, group
    ``i`` holding ``layers[i::G]`` (strided, so that every pipeline stage gets
    a layer of every group instead of a stage with an empty group).

    Raises:
        InvalidConfigError: the pages are not all equal.
    """
    pages = {spec.page_size_bytes for spec in layer_specs.values()}
    if len(pages) > 1:
        msg = f"uniform-page grouping needs one page size, got {sorted(pages)} bytes"
        raise InvalidConfigError(msg)
    return _bucket_groups(layer_specs, group_size_rule, limits)


def _bucket_groups(
    layer_specs: Mapping[str, KVCacheSpec], group_size_rule: str, limits: TokenLimits | None
) -> list[KVCacheGroupSpec]:
    """Buckets of mergeable layers split into groups of one group size, strided."""
    buckets = uniform_page_buckets(layer_specs)
    if not buckets:
        return []
    sizes = [len(names) for names, _ in buckets]
    size = choose_group_size(group_size_rule, sizes, _bucket_weights(buckets, limits))
    groups = []
    for names, _ in buckets:
        count = cdiv(len(names), size)
        for i in range(count):
            members = names[i::count]
            member_specs = [layer_specs[name] for name in members]
            spec = type(member_specs[0]).merge(member_specs)
            groups.append(KVCacheGroupSpec(layer_names=members, kv_cache_spec=spec))
    return groups


def natural_page_groups(
    layer_specs: Mapping[str, KVCacheSpec],
    *,
    hybrid: bool = True,
    group_size_rule: str = "reference",
    limits: TokenLimits | None = None,
) -> list[KVCacheGroupSpec]:
    """Groups for a two-level pool: every layer keeps its own block size and page.

    No page is grown, padded or fitted: the branches of
    :func:`get_kv_cache_groups` without page unification. Unified mode
    (``hybrid=False``) promotes local layers as there; one spec or one type
    makes one group; otherwise mergeable layers are bucketed and split into
    groups of one group size (the same rules, strided), and each layer that
    keeps its own group gets one with its own spec. Groups of different pages
    draw their block ids from different page classes.

    Raises:
        InvalidConfigError: as :func:`get_kv_cache_groups` (unified mode
            that cannot promote, an unknown rule).
    """
    specs = promote_local_layers(layer_specs) if not hybrid else dict(layer_specs)
    if not specs:
        return []
    names, values = list(specs), list(specs.values())
    if is_uniform_spec(values):
        groups = [KVCacheGroupSpec(layer_names=names, kv_cache_spec=type(values[0]).merge(values))]
    elif is_uniform_type(values):
        groups = [same_slots_group(names, values)]
    else:
        rest = {name: spec for name, spec in specs.items() if not spec.keeps_own_group}
        groups = _bucket_groups(rest, group_size_rule, limits) + [
            KVCacheGroupSpec(layer_names=[name], kv_cache_spec=spec)
            for name, spec in specs.items()
            if spec.keeps_own_group
        ]
    _check_partition(specs, groups)
    return groups


def _add_own_groups(
    groups: list[KVCacheGroupSpec], own: Mapping[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """One group per set-aside layer, its page padded to the common page.

    The layer's block size must divide every group's block size (so its
    hashes line up) and fit the common page; when even one token does not fit,
    every group's page is scaled up by the smallest whole factor that makes it
    fit.
    """
    if not own:
        return groups
    if not groups:
        return [KVCacheGroupSpec(layer_names=[n], kv_cache_spec=s) for n, s in own.items()]
    common = groups[0].kv_cache_spec.page_size_bytes
    for factor in range(1, 1025):
        scaled = groups if factor == 1 else _grow_groups(groups, common * factor)
        divisor = math.gcd(*(group.kv_cache_spec.block_size for group in scaled))
        fitted = {n: s.fitted_to_page(common * factor, divisor) for n, s in own.items()}
        if all(spec is not None for spec in fitted.values()):
            return scaled + [
                KVCacheGroupSpec(layer_names=[n], kv_cache_spec=s)
                for n, s in fitted.items()
                if s is not None
            ]
    name = next(n for n, s in own.items() if s.fitted_to_page(common * 1024, 1) is None)
    msg = (
        f"layer {name!r} ({type(own[name]).__name__}) keeps its own group but cannot be "
        f"fitted to a page of the other groups' size ({common} bytes, even scaled); its "
        "type must implement fitted_to_page"
    )
    raise InvalidConfigError(msg)


def _grow_groups(groups: list[KVCacheGroupSpec], page_size: int) -> list[KVCacheGroupSpec]:
    grown = []
    for group in groups:
        spec = group.kv_cache_spec.grown_to_page(page_size)
        if spec is None:
            msg = (
                f"group of {', '.join(group.layer_names)}: its page cannot grow to "
                f"{page_size} bytes to make room for a layer that keeps its own group"
            )
            raise PageUnificationError(msg)
        grown.append(KVCacheGroupSpec(layer_names=group.layer_names, kv_cache_spec=spec))
    return grown


def _check_partition(specs: Mapping[str, KVCacheSpec], groups: list[KVCacheGroupSpec]) -> None:
    seen = [name for group in groups for name in group.layer_names]
    if sorted(seen) != sorted(specs):
        missing = sorted(set(specs) - set(seen))
        doubled = sorted({name for name in seen if seen.count(name) > 1})
        msg = (
            "grouping is not an exact partition of the layers "
            f"(missing: {missing}, in two groups: {doubled}); this is a kvcore bug"
        )
        raise InvalidConfigError(msg)
