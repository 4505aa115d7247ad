"""Coordinators: one manager per KV cache group, one answer per request.

The coordinator owns the block pool and the managers, fans every operation
out to the groups, and reconciles prefix-cache hits across groups: a hit is
only usable at a length every group can serve.

- :class:`NoPrefixCacheCoordinator`: prefix caching off (any number of groups).
- :class:`UnitaryCoordinator`: one group.
- :class:`HybridCoordinator`: several groups (hybrid models), fixed-point hit.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

from kvcore._block_pool import BlockPool
from kvcore._config import KVCacheConfig
from kvcore._hashing import hashes_at_block_size
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore._utils import round_down
from kvcore.errors import InvalidConfigError
from kvcore.eviction import EvictionPolicyFactory, GroupInfo
from kvcore.managers import HitQuery, SingleTypeManager
from kvcore.specs import KVCacheSpec

__all__ = [
    "HybridCoordinator",
    "KVCacheCoordinator",
    "NoPrefixCacheCoordinator",
    "UnitaryCoordinator",
    "make_coordinator",
]

Hits = tuple[list[int], ...]

# Builds a HitQuery from all its fields without NamedTuple's argument handling:
# one per group and lookup, so it is kept cheap.
_new_query = tuple.__new__


class KVCacheCoordinator:
    """Fans manager operations out over the groups; subclasses find cache hits.

    Args:
        config: The KV cache config (groups and block count).
        registry: Resolves each group's spec to its manager class.
        enable_caching: Prefix caching on.
        use_eagle: EAGLE speculative decoding on (last hit block recomputed).
        enable_kv_cache_events: Queue KV cache events in the pool.
        hash_block_size: Tokens per entry of ``Request.block_hashes``.
        alignment_tokens: Every hit length is a multiple of this (the least
            common multiple of the cacheable groups' block sizes).
        eviction: The pool's eviction policy (a built-in name or a factory).
    """

    def __init__(
        self,
        config: KVCacheConfig,
        registry: Registry,
        *,
        enable_caching: bool,
        use_eagle: bool,
        enable_kv_cache_events: bool,
        hash_block_size: int,
        alignment_tokens: int,
        eviction: str | EvictionPolicyFactory = "lru",
    ) -> None:
        groups = config.kv_cache_groups
        specs = [group.kv_cache_spec for group in groups]
        manager_classes = [registry.manager_class(spec) for spec in specs]
        self.config = config
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.hash_block_size = hash_block_size
        self.alignment_tokens = alignment_tokens
        self.block_pool = BlockPool(
            config.num_blocks,
            enable_caching=enable_caching,
            hash_block_size=hash_block_size,
            num_groups=len(groups),
            enable_kv_cache_events=enable_kv_cache_events,
            group_kinds=[spec.kind for spec in specs],
            eviction=eviction,
            group_info=[
                GroupInfo.of(spec, enable_caching and cls.is_prefix_cacheable(spec))
                for cls, spec in zip(manager_classes, specs, strict=True)
            ],
            alignment_tokens=alignment_tokens,
        )
        self.managers: tuple[SingleTypeManager[Any], ...] = tuple(
            cls(spec, self.block_pool, kv_cache_group_id=i, enable_caching=enable_caching)
            for i, (cls, spec) in enumerate(zip(manager_classes, specs, strict=True))
        )
        # Only managers that declare it drop blocks before a request ends; for
        # the others remove_skipped_blocks is not even called.
        self._windowed = tuple(m for m in self.managers if m.frees_skipped_blocks)
        self._cacheable = tuple(m for m in self.managers if m.is_prefix_cacheable(m.spec))
        self._has_encoder_groups = any(m.allocates_for_encoder for m in self.managers)

    @property
    def has_windowed_groups(self) -> bool:
        """Whether some group frees blocks before the request ends (``frees_skipped_blocks``)."""
        return bool(self._windowed)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
    ) -> int:
        """Blocks the allocation will take, summed over groups (one shared pool)."""
        total = 0
        if not self._has_encoder_groups:
            for manager, hits in zip(self.managers, new_computed_blocks, strict=True):
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, hits, total_computed_tokens
                )
            return total
        for manager, hits in zip(self.managers, new_computed_blocks, strict=True):
            if manager.allocates_for_encoder:
                total += manager.get_num_blocks_to_allocate(request_id, num_encoder_tokens, (), 0)
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, hits, total_computed_tokens
                )
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[Sequence[int]],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Adopt a new request's hits in every group, and blocks for its external tokens.

        A group allocates its external-token blocks from the head of the free
        queue, where another group's hit block may wait (freed but cached).
        So with several groups, every group's hit blocks are first taken out
        of the queue (one extra reference each, dropped once every group has
        adopted its own): no block ends up in two groups. The reference
        adopts group by group and can hand a block to two groups.
        """
        managers = self.managers
        pinned: list[int] = []
        if num_external_computed_tokens and len(managers) > 1:
            num_computed = num_local_computed_tokens + num_external_computed_tokens
            for manager, hits in zip(managers, new_computed_blocks, strict=True):
                if hits:
                    # The hits a group adopts: those its type still reads.
                    skipped = max(0, manager.get_num_skipped_tokens(num_computed))
                    pinned.extend(hits[skipped // manager.block_size :])
            self.block_pool._touch(pinned)
        for manager, hits in zip(managers, new_computed_blocks, strict=True):
            manager.allocate_new_computed_blocks(
                request_id, hits, num_local_computed_tokens, num_external_computed_tokens
            )
        if pinned:
            self.block_pool._free_blocks(pinned)

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_encoder_tokens: int = 0
    ) -> Hits:
        """Grow every group's table to ``num_tokens`` slots (encoder groups: encoder tokens)."""
        if not self._has_encoder_groups:
            return tuple([m.allocate_new_blocks(request_id, num_tokens) for m in self.managers])
        return tuple(
            m.allocate_new_blocks(
                request_id, num_encoder_tokens if m.allocates_for_encoder else num_tokens
            )
            for m in self.managers
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks in every cacheable group."""
        for manager in self._cacheable:
            manager.cache_blocks(request, num_computed_tokens)

    def free(self, request_id: str) -> None:
        """Release the request's blocks in every group."""
        for manager in self.managers:
            manager.free(request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the blocks no longer read, in every group whose type frees skipped blocks."""
        for manager in self._windowed:
            manager.remove_skipped_blocks(request_id, total_computed_tokens)

    def new_step_starts(self) -> None:
        """Tell every group's manager that a scheduling step begins."""
        for manager in self.managers:
            manager.new_step_starts()

    def get_blocks(self, request_id: str) -> Hits:
        """The request's block table in every group."""
        return tuple(manager.get_block_ids(request_id) for manager in self.managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, leading blocks shared by every request holding blocks."""
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.managers]

    def find_longest_cache_hit(
        self, block_hashes: Sequence[Hashable], max_cache_hit_length: int
    ) -> tuple[Hits, int]:
        """Return per-group hit blocks and the hit length in tokens."""
        raise NotImplementedError


class NoPrefixCacheCoordinator(KVCacheCoordinator):
    """Prefix caching off: never a hit, nothing cached; any number of groups."""

    def find_longest_cache_hit(
        self, block_hashes: Sequence[Hashable], max_cache_hit_length: int
    ) -> tuple[Hits, int]:
        """Always no hit: one empty list per group, length 0."""
        return tuple([] for _ in self.managers), 0

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Nothing is ever cached."""


class UnitaryCoordinator(KVCacheCoordinator):
    """One group: its manager's hit is the answer (aligned to its block size)."""

    def __init__(self, config: KVCacheConfig, registry: Registry, **kwargs: Any) -> None:
        super().__init__(config, registry, **kwargs)
        (self._manager,) = self.managers
        if self._manager.allocates_for_encoder or not self._cacheable:
            # Only cacheable, decoder-side groups get here (make_coordinator
            # routes the others to NoPrefixCacheCoordinator).
            msg = "UnitaryCoordinator serves one prefix-cacheable decoder group"
            raise InvalidConfigError(msg)
        self._spec = self._manager.spec
        self._block_size = self._spec.block_size
        self._group_ids = (0,)
        # The fields of every HitQuery of this group after the two that change.
        self._query_tail = (
            self._group_ids,
            self.block_pool,
            self._spec,
            self.use_eagle,
            self._block_size,
        )
        self._eagle_looks_past = self.use_eagle and self._manager.eagle_drops_last_block

    # One group: the fan-out methods call the manager directly (no loop); they
    # run for every request on every step.

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
    ) -> int:
        """Blocks the allocation will take in the single group."""
        return self._manager.get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks[0], total_computed_tokens
        )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_encoder_tokens: int = 0
    ) -> Hits:
        """Grow the single group's table to ``num_tokens`` slots."""
        return (self._manager.allocate_new_blocks(request_id, num_tokens),)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks in the single group."""
        self._manager.cache_blocks(request, num_computed_tokens)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[Hashable], max_cache_hit_length: int
    ) -> tuple[Hits, int]:
        """The group's own longest hit.

        With EAGLE the rule is the hybrid coordinator's: the group looks one
        block past the limit (as far as the request's hashes go) and drops
        the last matched block, so a hit of ``L`` tokens needs the block
        after it cached too, and ``L`` never exceeds the limit. (The reference
        stops at the limit before dropping, one block shorter.)
        """
        limit = max_cache_hit_length
        if self._eagle_looks_past:
            limit = min(limit + self._block_size, len(block_hashes) * self.hash_block_size)
        # Concatenation: twice as fast as unpacking the tail into a display.
        query = (block_hashes, limit) + self._query_tail  # noqa: RUF005
        hits = self._manager.find_longest_cache_hit(_new_query(HitQuery, query))
        return hits, len(hits[0]) * self._block_size


class _SpecGroup:
    """Groups with an identical spec, looked up together (a hit needs all of them)."""

    __slots__ = ("block_size", "downward_closed", "group_ids", "manager_cls", "spec")

    def __init__(self, spec: KVCacheSpec, manager_cls: type[SingleTypeManager[Any]]) -> None:
        self.spec = spec
        self.manager_cls = manager_cls
        self.group_ids: list[int] = []
        self.block_size = spec.block_size
        self.downward_closed = manager_cls.downward_closed_hits


class HybridCoordinator(KVCacheCoordinator):
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

    def __init__(self, config: KVCacheConfig, registry: Registry, **kwargs: Any) -> None:
        super().__init__(config, registry, **kwargs)
        spec_groups: list[_SpecGroup] = []
        for group_id, manager in enumerate(self.managers):
            if not manager.is_prefix_cacheable(manager.spec):
                continue
            for spec_group in spec_groups:
                if spec_group.spec == manager.spec and spec_group.manager_cls is type(manager):
                    spec_group.group_ids.append(group_id)
                    break
            else:
                spec_group = _SpecGroup(manager.spec, type(manager))
                spec_group.group_ids.append(group_id)
                spec_groups.append(spec_group)
        if not spec_groups:
            msg = "prefix caching needs at least one KV cache group whose type can be cached"
            raise InvalidConfigError(msg)
        spec_groups.sort(key=lambda g: not g.downward_closed)
        self._spec_groups = tuple(spec_groups)
        # With a downward-closed group first and one other spec group, the
        # second group's answer can only trim the first: one pass suffices.
        self._single_pass = len(spec_groups) == 2 and spec_groups[0].downward_closed
        self._num_groups = len(self.managers)
        for manager in self._cacheable:
            if manager.block_size % self.hash_block_size:
                msg = (
                    f"group {manager.kv_cache_group_id} has block size {manager.block_size}, "
                    f"not a multiple of the hash block size {self.hash_block_size}"
                )
                raise InvalidConfigError(msg)

    def find_longest_cache_hit(
        self, block_hashes: Sequence[Hashable], max_cache_hit_length: int
    ) -> tuple[Hits, int]:
        """Fixed-point search for the longest length every group can serve."""
        hash_size = self.hash_block_size
        max_hashed_tokens = len(block_hashes) * hash_size
        alignment = self.alignment_tokens
        pool = self.block_pool
        hits_by_group: list[list[int] | None] = [None] * self._num_groups
        length_by_group = [0] * self._num_groups
        eagle_checked: set[int] = set()
        hit_length = max_cache_hit_length
        while True:
            candidate = hit_length
            for index, group in enumerate(self._spec_groups):
                first = group.group_ids[0]
                if group.downward_closed and hits_by_group[first] is not None:
                    candidate = min(candidate, length_by_group[first])
                    continue
                drop_eagle = self.use_eagle and index not in eagle_checked
                limit = candidate
                if drop_eagle and group.manager_cls.eagle_drops_last_block:
                    # Look one block past the candidate: after EAGLE drops the
                    # last matched block the hit lands back on the candidate.
                    limit = min(candidate + group.block_size, max_hashed_tokens)
                hits = group.manager_cls.find_longest_cache_hit(
                    _new_query(
                        HitQuery,
                        (
                            hashes_at_block_size(block_hashes, hash_size, group.block_size),
                            limit,
                            group.group_ids,
                            pool,
                            group.spec,
                            drop_eagle,
                            alignment,
                        ),
                    )
                )
                length = len(hits[0]) * group.block_size
                if length < candidate:
                    # A new, shorter candidate: every EAGLE group must check its
                    # extra block again at this length (a check at a longer
                    # length says nothing about the block after this one).
                    eagle_checked.clear()
                if drop_eagle:
                    eagle_checked.add(index)
                candidate = length
                for group_id, blocks in zip(group.group_ids, hits, strict=True):
                    hits_by_group[group_id] = blocks
                    length_by_group[group_id] = length
            if candidate >= hit_length:
                break
            hit_length = candidate
            if self._single_pass:
                break
        for group in self._spec_groups:
            if group.downward_closed:
                keep = hit_length // group.block_size
                for group_id in group.group_ids:
                    group_hit = hits_by_group[group_id]
                    if group_hit is not None:
                        del group_hit[keep:]
        return tuple(b if b is not None else [] for b in hits_by_group), hit_length

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache only what a hit can reach: up to the last aligned boundary.

        Blocks past the last multiple of the alignment can never be part of a
        hit, so caching them would only pin map entries. With EAGLE, lookups
        match one block past a candidate, so one more block is cached.
        """
        aligned = round_down(num_computed_tokens, self.alignment_tokens)
        for manager in self._cacheable:
            limit = aligned
            if self.use_eagle and aligned:
                limit = min(num_computed_tokens, aligned + manager.block_size)
            manager.cache_blocks(request, limit)


def make_coordinator(
    config: KVCacheConfig,
    registry: Registry,
    *,
    enable_caching: bool,
    use_eagle: bool,
    enable_kv_cache_events: bool,
    eviction: str | EvictionPolicyFactory = "lru",
) -> KVCacheCoordinator:
    """Pick and build the coordinator for ``config``.

    Every group's manager class first validates the configuration
    (:meth:`~kvcore.managers.SingleTypeManager.validate_config`), so a refused
    configuration builds nothing.

    Raises:
        UnknownSpecError: a group's spec has no manager in ``registry``.
        InvalidConfigError: a manager class refuses the configuration, or
            prefix caching is asked for a config containing a group that can
            never be cached (its KV depends on per-request input).
    """
    groups = config.kv_cache_groups
    specs = [group.kv_cache_spec for group in groups]
    classes = [registry.manager_class(spec) for spec in specs]
    cacheable = [cls.is_prefix_cacheable(spec) for cls, spec in zip(classes, specs, strict=True)]
    num_groups = len(groups)
    cacheable_sizes = [s.block_size for s, c in zip(specs, cacheable, strict=True) if c]
    # Hashes are computed at the gcd of the cacheable block sizes, so every
    # cacheable group can view them per block; hits land on their lcm.
    hash_sizes = cacheable_sizes or [spec.block_size for spec in specs]
    hash_block_size = math.gcd(*hash_sizes) if hash_sizes else 1
    alignment = math.lcm(*cacheable_sizes) if cacheable_sizes else 1
    for cls, spec in zip(classes, specs, strict=True):
        cls.validate_config(
            spec,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            alignment_tokens=alignment if cacheable_sizes else spec.block_size,
        )
    if enable_caching:
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
                if len(uncacheable) < num_groups
                else "so no block could ever be reused"
            )
            msg = (
                f"prefix caching cannot be enabled: {', '.join(uncacheable)} is never "
                f"cached, {why}; pass enable_caching=False"
            )
            raise InvalidConfigError(msg)
    kwargs: dict[str, Any] = {
        "use_eagle": use_eagle,
        "enable_kv_cache_events": enable_kv_cache_events,
        "hash_block_size": hash_block_size,
        "alignment_tokens": alignment,
        "eviction": eviction,
    }
    if not enable_caching or num_groups == 0:
        return NoPrefixCacheCoordinator(config, registry, enable_caching=False, **kwargs)
    if num_groups == 1:
        return UnitaryCoordinator(config, registry, enable_caching=True, **kwargs)
    return HybridCoordinator(config, registry, enable_caching=True, **kwargs)
