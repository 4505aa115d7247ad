"""The hit rule: how many tokens of a request hit, across all KV cache groups.

Every group's manager class searches its own blocks with its type's rule
(full attention: the longest cached prefix; a window: only the last window's
blocks; a state: one cached state). A hit is usable only at a length every
group can serve, so the answers are reconciled: :class:`HybridHitRule` runs a
fixed point over the candidate length. A rule holds no blocks and no pool:
it searches whatever :class:`~kvcore.managers.CachedBlockLookup` it is given
(the engine's pool, or the cluster index's view of another engine).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from kvcore._hashing import hashes_at_block_size
from kvcore.errors import InvalidConfigError
from kvcore.managers import CachedBlockLookup, HitQuery, SingleTypeManager
from kvcore.specs import KVCacheSpec

__all__ = [
    "HitRule",
    "HybridHitRule",
    "NoHitRule",
    "SingleGroupHitRule",
    "hash_and_alignment",
    "make_hit_rule",
]

Hits = tuple[list[int], ...]


class HitRule:
    """The hit search of one KV cache layout.

    Attributes:
        hash_block_size: Tokens per entry of a request's block hashes (the
            gcd of the cacheable groups' block sizes).
        alignment_tokens: Every hit length is a multiple of this (their lcm).
        use_eagle: EAGLE speculative decoding: a group must also hold the
            block after the hit (unless its type never drops one).
    """

    def __init__(
        self,
        num_groups: int,
        hash_block_size: int,
        alignment_tokens: int,
        *,
        use_eagle: bool = False,
    ) -> None:
        self.num_groups = num_groups
        self.hash_block_size = hash_block_size
        self.alignment_tokens = alignment_tokens
        self.use_eagle = use_eagle

    def find(
        self, block_hashes: Sequence[Hashable], max_length: int, cache: CachedBlockLookup
    ) -> tuple[Hits, int]:
        """The hit blocks per group and the hit length in tokens (at most ``max_length``).

        Args:
            block_hashes: The request's hashes at :attr:`hash_block_size`.
            max_length: Longest hit allowed, in tokens.
            cache: Where blocks are looked up.
        """
        return tuple([] for _ in range(self.num_groups)), 0


class NoHitRule(HitRule):
    """Prefix caching off: never a hit."""


class SingleGroupHitRule(HitRule):
    """One group: its manager class's hit is the answer."""

    def __init__(
        self,
        spec: KVCacheSpec,
        manager_class: type[SingleTypeManager[Any]],
        *,
        use_eagle: bool,
    ) -> None:
        super().__init__(1, spec.block_size, spec.block_size, use_eagle=use_eagle)
        self.spec = spec
        self.manager_class = manager_class

    def find(
        self, block_hashes: Sequence[Hashable], max_length: int, cache: CachedBlockLookup
    ) -> tuple[Hits, int]:
        """The group's own longest hit.

        With EAGLE the rule is the hybrid one: the group looks one block past
        the limit (as far as the request's hashes go) and drops the last
        matched block, so a hit of ``L`` tokens needs the block after it
        cached too, and ``L`` never exceeds the limit. (The reference stops
        at the limit before dropping, one block shorter.)
        """
        block_size = self.spec.block_size
        limit = max_length
        if self.use_eagle and self.manager_class.eagle_drops_last_block:
            limit = min(limit + block_size, len(block_hashes) * block_size)
        query = HitQuery(block_hashes, limit, (0,), cache, self.spec, self.use_eagle, block_size)
        hits = self.manager_class.find_longest_cache_hit(query)
        return hits, len(hits[0]) * block_size


class _SpecGroup:
    """Groups with an identical spec, looked up together (a hit needs all of them)."""

    __slots__ = ("block_size", "downward_closed", "group_ids", "manager_cls", "spec")

    def __init__(self, spec: KVCacheSpec, manager_cls: type[SingleTypeManager[Any]]) -> None:
        self.spec = spec
        self.manager_cls = manager_cls
        self.group_ids: list[int] = []
        self.block_size = spec.block_size
        self.downward_closed = manager_cls.downward_closed_hits


def _spec_groups(
    specs: Sequence[KVCacheSpec],
    classes: Sequence[type[SingleTypeManager[Any]]],
    cacheable: Sequence[bool],
) -> tuple[_SpecGroup, ...]:
    """The cacheable groups by (spec, manager class); downward-closed types first."""
    spec_groups: list[_SpecGroup] = []
    for group_id, (spec, cls, ok) in enumerate(zip(specs, classes, cacheable, strict=True)):
        if not ok:
            continue
        for spec_group in spec_groups:
            if spec_group.spec == spec and spec_group.manager_cls is cls:
                spec_group.group_ids.append(group_id)
                break
        else:
            spec_group = _SpecGroup(spec, cls)
            spec_group.group_ids.append(group_id)
            spec_groups.append(spec_group)
    if not spec_groups:
        msg = "prefix caching needs at least one KV cache group whose type can be cached"
        raise InvalidConfigError(msg)
    spec_groups.sort(key=lambda g: not g.downward_closed)
    return tuple(spec_groups)


class _Search:
    """The state of one fixed-point search (see :class:`HybridHitRule`)."""

    __slots__ = ("block_hashes", "cache", "eagle_checked", "hits", "lengths", "max_hashed")

    def __init__(
        self, rule: HybridHitRule, block_hashes: Sequence[Hashable], cache: CachedBlockLookup
    ) -> None:
        self.block_hashes = block_hashes
        self.cache = cache
        self.max_hashed = len(block_hashes) * rule.hash_block_size
        self.hits: list[list[int] | None] = [None] * rule.num_groups
        self.lengths = [0] * rule.num_groups
        self.eagle_checked: set[int] = set()


class HybridHitRule(HitRule):
    """Several groups: the hit is the longest length at which every group hits.

    Groups with equal specs are looked up together. Downward-closed types
    (full attention) come first and are looked up once: a shorter candidate
    only trims their hit. Every other type is asked again whenever the
    candidate shrinks, and may only shrink it further, until a whole pass
    leaves it unchanged (it only decreases, so this terminates). Hit lengths
    are multiples of the least common multiple of the groups' block sizes.

    With EAGLE a group must also hold the block after the hit: it is looked up
    one block past the candidate and drops that block again. Each group does
    this once per candidate length, and again whenever the candidate shrinks
    (a check at a longer length says nothing about the block after a shorter
    one).
    """

    def __init__(
        self,
        specs: Sequence[KVCacheSpec],
        classes: Sequence[type[SingleTypeManager[Any]]],
        cacheable: Sequence[bool],
        *,
        use_eagle: bool,
        hash_block_size: int,
        alignment_tokens: int,
    ) -> None:
        super().__init__(len(specs), hash_block_size, alignment_tokens, use_eagle=use_eagle)
        self._spec_groups = _spec_groups(specs, classes, cacheable)
        # With a downward-closed group first and one other spec group, the
        # second group's answer can only trim the first: one pass suffices.
        self._single_pass = len(self._spec_groups) == 2 and self._spec_groups[0].downward_closed

    def find(
        self, block_hashes: Sequence[Hashable], max_length: int, cache: CachedBlockLookup
    ) -> tuple[Hits, int]:
        """Fixed-point search for the longest length every group can serve."""
        search = _Search(self, block_hashes, cache)
        hit_length = max_length
        while True:
            candidate = hit_length
            for index, group in enumerate(self._spec_groups):
                candidate = self._search_group(search, index, group, candidate)
            if candidate >= hit_length:
                break
            hit_length = candidate
            if self._single_pass:
                break
        for group in self._spec_groups:
            if group.downward_closed:
                keep = hit_length // group.block_size
                for group_id in group.group_ids:
                    group_hit = search.hits[group_id]
                    if group_hit is not None:
                        del group_hit[keep:]
        return tuple(b if b is not None else [] for b in search.hits), hit_length

    def _search_group(self, search: _Search, index: int, group: _SpecGroup, candidate: int) -> int:
        """Ask one spec group for its hit at most ``candidate`` long; the new candidate."""
        first = group.group_ids[0]
        if group.downward_closed and search.hits[first] is not None:
            return min(candidate, search.lengths[first])
        drop_eagle = self.use_eagle and index not in search.eagle_checked
        limit = candidate
        if drop_eagle and group.manager_cls.eagle_drops_last_block:
            # Look one block past the candidate: after EAGLE drops the last
            # matched block the hit lands back on the candidate.
            limit = min(candidate + group.block_size, search.max_hashed)
        query = HitQuery(
            hashes_at_block_size(search.block_hashes, self.hash_block_size, group.block_size),
            limit,
            group.group_ids,
            search.cache,
            group.spec,
            drop_eagle,
            self.alignment_tokens,
        )
        hits = group.manager_cls.find_longest_cache_hit(query)
        length = len(hits[0]) * group.block_size
        if length < candidate:
            # A new, shorter candidate: every EAGLE group must check its extra
            # block again at this length.
            search.eagle_checked.clear()
        if drop_eagle:
            search.eagle_checked.add(index)
        for group_id, blocks in zip(group.group_ids, hits, strict=True):
            search.hits[group_id] = blocks
            search.lengths[group_id] = length
        return length


def hash_and_alignment(specs: Sequence[KVCacheSpec], cacheable: Sequence[bool]) -> tuple[int, int]:
    """Tokens per hash entry (gcd of the cacheable block sizes) and the hit alignment (their lcm).

    Hashes are computed at the gcd so every cacheable group can view them per
    block; hits land on the lcm. Without a cacheable group: the gcd of all
    block sizes, and 1.
    """
    cacheable_sizes = [s.block_size for s, ok in zip(specs, cacheable, strict=True) if ok]
    hash_sizes = cacheable_sizes or [spec.block_size for spec in specs]
    hash_block_size = math.gcd(*hash_sizes) if hash_sizes else 1
    alignment = math.lcm(*cacheable_sizes) if cacheable_sizes else 1
    return hash_block_size, alignment


def make_hit_rule(
    specs: Sequence[KVCacheSpec],
    classes: Sequence[type[SingleTypeManager[Any]]],
    *,
    enable_caching: bool,
    use_eagle: bool,
) -> HitRule:
    """The hit rule of groups of ``specs`` served by manager ``classes``.

    Raises:
        InvalidConfigError: prefix caching is asked for a layout containing a
            group that can never be cached (its KV depends on per-request
            input).
    """
    cacheable = [cls.is_prefix_cacheable(spec) for cls, spec in zip(classes, specs, strict=True)]
    hash_block_size, alignment = hash_and_alignment(specs, cacheable)
    if enable_caching:
        _refuse_uncacheable(specs, classes, cacheable)
    if not enable_caching or not specs:
        return NoHitRule(len(specs), hash_block_size, alignment, use_eagle=use_eagle)
    if len(specs) == 1:
        return SingleGroupHitRule(specs[0], classes[0], use_eagle=use_eagle)
    return HybridHitRule(
        specs,
        classes,
        cacheable,
        use_eagle=use_eagle,
        hash_block_size=hash_block_size,
        alignment_tokens=alignment,
    )


def _refuse_uncacheable(
    specs: Sequence[KVCacheSpec],
    classes: Sequence[type[SingleTypeManager[Any]]],
    cacheable: Sequence[bool],
) -> None:
    uncacheable = [
        f"group {i} ({type(spec).__name__}, managed by {cls.__name__})"
        for i, (cls, spec, ok) in enumerate(zip(classes, specs, cacheable, strict=True))
        if not ok
    ]
    if uncacheable:
        # Other groups' KV was computed from the uncacheable group's
        # per-request state, so reusing it for another request is wrong.
        why = (
            "and the other groups' KV depends on it"
            if len(uncacheable) < len(specs)
            else "so no block could ever be reused"
        )
        msg = (
            f"prefix caching cannot be enabled: {', '.join(uncacheable)} is never "
            f"cached, {why}; pass enable_caching=False"
        )
        raise InvalidConfigError(msg)
