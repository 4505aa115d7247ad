"""The coordinator: one manager per KV cache group, one answer per request.

The coordinator owns the block pool and the managers and fans every operation
out to the groups. Which hit a request gets across the groups is its hit
rule's answer (:mod:`kvcore._hits`); the coordinator also checks that a hit an
engine hands back is the request's own, before anything is adopted.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from kvcore._backend import resolve_backend
from kvcore._block_pool import BlockPool
from kvcore._config import KVCacheConfig
from kvcore._hashing import hashes_at_block_size
from kvcore._hits import HitRule, hash_and_alignment, make_hit_rule
from kvcore._native_pool import NativeBlockPool, native_gap
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore._two_level_pool import TwoLevelBlockPool
from kvcore.errors import InvalidCacheHitError
from kvcore.eviction import EvictionPolicyFactory, GroupInfo
from kvcore.managers import SingleTypeManager

__all__ = ["KVCacheCoordinator", "make_coordinator"]

Hits = tuple[list[int], ...]


class KVCacheCoordinator:
    """Fans manager operations out over the groups of one engine.

    Built by :func:`make_coordinator`, which validates the configuration
    first.

    Args:
        config: The KV cache config (groups and block count).
        classes: The manager class of each group.
        hit_rule: How hits are found and reconciled across the groups.
        enable_caching: Prefix caching on.
        enable_kv_cache_events: Queue KV cache events in the pool.
        eviction: The pool's eviction policy.
        backend: The pool's backend (see :func:`kvcore._backend.resolve_backend`).
        digest_size: Bytes of every block hash, when the hasher makes digests
            of one width (the shared pool's ``digest_size``); ``None``: any.
        int_hashes: Every block hash is a 64-bit int (the shared pool's
            ``int_hashes``).
    """

    def __init__(
        self,
        config: KVCacheConfig,
        classes: Sequence[type[SingleTypeManager[Any]]],
        hit_rule: HitRule,
        *,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        eviction: str | EvictionPolicyFactory,
        backend: str | None = None,
        digest_size: int | None = None,
        int_hashes: bool = False,
    ) -> None:
        specs = [group.kv_cache_spec for group in config.kv_cache_groups]
        self.config = config
        self.enable_caching = enable_caching
        self.use_eagle = hit_rule.use_eagle
        self.hit_rule = hit_rule
        self.hash_block_size = hit_rule.hash_block_size
        self.alignment_tokens = hit_rule.alignment_tokens
        options: dict[str, Any] = {
            "enable_caching": enable_caching,
            "hash_block_size": self.hash_block_size,
            "enable_kv_cache_events": enable_kv_cache_events,
            "group_kinds": [spec.kind for spec in specs],
            "eviction": eviction,
            "group_info": [
                GroupInfo.of(spec, enable_caching and cls.is_prefix_cacheable(spec))
                for cls, spec in zip(classes, specs, strict=True)
            ],
            "alignment_tokens": self.alignment_tokens,
        }
        #: The engine's blocks: one shared pool, or (with ``config.page_pool``)
        #: one pool per page class carved from large pages.
        self.block_pool: BlockPool | TwoLevelBlockPool
        if config.page_pool is None:
            chosen = resolve_backend(backend, native_gap(eviction, len(specs)))
            pool_class = NativeBlockPool if chosen == "native" else BlockPool
            self.block_pool = pool_class(
                config.num_blocks,
                num_groups=len(specs),
                digest_size=digest_size,
                int_hashes=int_hashes,
                **options,
            )
        else:
            resolve_backend(backend, "a two-level pool (a KVCacheConfig with a page_pool)")
            self.block_pool = TwoLevelBlockPool(config.page_pool, **options)
        self.managers: tuple[SingleTypeManager[Any], ...] = tuple(
            cls(
                spec,
                self.block_pool.pool_of(i),
                kv_cache_group_id=i,
                enable_caching=enable_caching,
            )
            for i, (cls, spec) in enumerate(zip(classes, specs, strict=True))
        )
        # Only managers that declare it drop blocks before a request ends; for
        # the others remove_skipped_blocks is not even called.
        self.windowed = tuple(m for m in self.managers if m.frees_skipped_blocks)
        self.cacheable = tuple(m for m in self.managers if m.caches_blocks)
        #: Groups shown each request before an allocation for it (see
        #: SingleTypeManager.before_allocation); empty for most engines.
        self.watching = tuple(m for m in self.managers if m.watches_requests)
        if not self.use_eagle:
            # cache_blocks caches up to the last aligned token count only (with
            # EAGLE, one block further: any block boundary may then matter).
            for manager in self.cacheable:
                manager.cache_grid_tokens = self.alignment_tokens
        self.decoder_groups = tuple(m for m in self.managers if not m.allocates_for_encoder)
        #: Groups whose blocks hold encoder tokens.
        self.encoder_groups = tuple(m for m in self.managers if m.allocates_for_encoder)
        #: Every group's index: what the per-group passes act on by default.
        self.all_groups = tuple(range(len(self.managers)))

    def find_longest_cache_hit(
        self, block_hashes: Sequence[Hashable], max_cache_hit_length: int
    ) -> tuple[Hits, int]:
        """Per-group hit blocks in this engine's pool, and the hit length in tokens."""
        return self.hit_rule.find(block_hashes, max_cache_hit_length, self.block_pool)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
    ) -> int:
        """Blocks the allocation will take, summed over groups."""
        return sum(
            self.blocks_to_allocate(
                request_id,
                num_tokens,
                new_computed_blocks,
                num_encoder_tokens,
                total_computed_tokens,
            )
        )

    def blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[Sequence[int]],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        groups: Sequence[int] | None = None,
    ) -> list[int]:
        """Blocks the allocation will take in each group (the free hits it revives included).

        ``groups``: the groups that act (default all); the others take 0.
        """
        # Plain loops: a comprehension costs a function call of its own on
        # every allocation (this runs on each one; most engines have 1-3 groups).
        managers = self.managers
        demand = [0] * len(managers)
        for group in self.all_groups if groups is None else groups:
            manager = managers[group]
            if manager.allocates_for_encoder:
                demand[group] = manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0
                )
            else:
                demand[group] = manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[group], total_computed_tokens
                )
        return demand

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
        # Per pool (one, or one per page class): the hits pinned, in group order.
        pinned: dict[int, tuple[BlockPool, list[int]]] = {}
        if num_external_computed_tokens and len(self.managers) > 1:
            num_computed = num_local_computed_tokens + num_external_computed_tokens
            for manager, hits in zip(self.managers, new_computed_blocks, strict=True):
                if hits:
                    # The hits a group adopts: those its type still reads.
                    skipped = max(0, manager.get_num_skipped_tokens(num_computed))
                    pool = manager.block_pool
                    blocks = pinned.setdefault(id(pool), (pool, []))[1]
                    blocks.extend(hits[skipped // manager.block_size :])
            for pool, blocks in pinned.values():
                pool._touch(blocks)
        for manager, hits in zip(self.managers, new_computed_blocks, strict=True):
            manager.allocate_new_computed_blocks(
                request_id, hits, num_local_computed_tokens, num_external_computed_tokens
            )
        for pool, blocks in pinned.values():
            if blocks:
                pool._release(blocks)

    def allocate_new_blocks(
        self,
        request_id: str,
        num_tokens: int,
        num_encoder_tokens: int = 0,
        groups: Sequence[int] | None = None,
    ) -> tuple[Sequence[int], ...]:
        """Grow the tables to ``num_tokens`` slots (encoder groups: encoder tokens).

        ``groups``: the groups that act (default all); the others grow by nothing.
        """
        managers = self.managers
        # Groups that do not act grow by an empty tuple (no list to build).
        grown: list[Sequence[int]] = [()] * len(managers)
        for group in self.all_groups if groups is None else groups:
            manager = managers[group]
            grown[group] = manager.allocate_new_blocks(
                request_id, num_encoder_tokens if manager.allocates_for_encoder else num_tokens
            )
        return tuple(grown)

    def cache_blocks(
        self, request: Request, num_computed_tokens: int, groups: Sequence[int] | None = None
    ) -> None:
        """Cache the request's full blocks in every cacheable group, as far as a hit can reach.

        Blocks past the last multiple of the alignment can never be part of a
        hit, so caching them would only pin map entries. With EAGLE, lookups
        match one block past a candidate, so one more block is cached.
        ``groups``: the groups that act (default all).
        """
        aligned = num_computed_tokens - num_computed_tokens % self.alignment_tokens
        cacheable = self.cacheable if groups is None else self._among(groups, self.cacheable)
        for manager in cacheable:
            limit = aligned
            if self.use_eagle and aligned:
                limit = min(num_computed_tokens, aligned + manager.block_size)
            manager.cache_blocks(request, limit)

    def _among(
        self, groups: Sequence[int], kind: tuple[SingleTypeManager[Any], ...]
    ) -> list[SingleTypeManager[Any]]:
        """The managers of ``groups`` that are in ``kind`` (e.g. :attr:`cacheable`)."""
        return [self.managers[group] for group in groups if self.managers[group] in kind]

    def free(self, request_id: str) -> None:
        """Release the request's blocks in every group."""
        for manager in self.managers:
            manager.free(request_id)

    def remove_skipped_blocks(
        self, request_id: str, total_computed_tokens: int, groups: Sequence[int] | None = None
    ) -> None:
        """Free the blocks no longer read, in every group whose type frees skipped blocks.

        ``groups``: the groups that act (default all).
        """
        windowed = self.windowed if groups is None else self._among(groups, self.windowed)
        for manager in windowed:
            manager.remove_skipped_blocks(request_id, total_computed_tokens)

    def steady_until(self, request_id: str, num_computed_tokens: int) -> list[int]:
        """Per group, the most tokens a running request can need before the group acts."""
        steady = []
        for manager in self.managers:  # a loop, not a comprehension: see blocks_to_allocate
            steady.append(manager.steady_until(request_id, num_computed_tokens))  # noqa: PERF401
        return steady

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

    # -- checking a hit handed back ---------------------------------------------------

    def check_hit(
        self,
        request: Request,
        hits: Sequence[Sequence[int]],
        num_hit_tokens: int,
        num_computed_tokens: int,
    ) -> None:
        """Check that ``hits`` are this request's cache hit of ``num_hit_tokens`` tokens.

        One list per group, each covering exactly ``num_hit_tokens``; and every
        block the group will adopt (those from its first not-skipped position
        after ``num_computed_tokens`` computed tokens, local and external) is
        a block of the pool cached, in that group, under the hash its position
        implies for this request. Blocks a windowed type no longer reads are
        never adopted and not looked at (the search returns the null block
        there); a null block elsewhere must stand for tokens the type does not
        read (its ``spec.tokens_read``). O(groups + adopted blocks), no scan
        of the pool. The request's ``block_hashes`` must be up to date.

        Raises:
            InvalidCacheHitError: naming the group, the position and the block.
        """
        if len(hits) != len(self.managers):
            msg = (
                f"request {request.request_id!r}: new_computed_blocks has {len(hits)} groups, "
                f"this manager has {len(self.managers)}; pass what get_computed_blocks returned"
            )
            raise InvalidCacheHitError(msg)
        if not self.enable_caching:
            if num_hit_tokens or any(hits):
                msg = (
                    f"request {request.request_id!r}: cache-hit blocks were given, but prefix "
                    "caching is disabled; pass num_new_computed_tokens=0 and no blocks"
                )
                raise InvalidCacheHitError(msg)
            return
        for group_id, (manager, blocks) in enumerate(zip(self.managers, hits, strict=True)):
            self._check_group_hit(
                request, group_id, manager, blocks, num_hit_tokens, num_computed_tokens
            )

    def _check_group_hit(
        self,
        request: Request,
        group_id: int,
        manager: SingleTypeManager[Any],
        blocks: Sequence[int],
        num_hit_tokens: int,
        num_computed_tokens: int,
    ) -> None:
        size = manager.block_size
        if len(blocks) * size != num_hit_tokens:
            msg = (
                f"request {request.request_id!r}: num_new_computed_tokens={num_hit_tokens} "
                f"but group {group_id}'s {len(blocks)} hit blocks of {size} tokens cover "
                f"{len(blocks) * size}; pass what get_computed_blocks returned"
            )
            raise InvalidCacheHitError(msg)
        first = max(0, manager.get_num_skipped_tokens(num_computed_tokens) // size)
        if first >= len(blocks):
            return
        expected = hashes_at_block_size(request.block_hashes, self.hash_block_size, size)
        if len(expected) < len(blocks):
            msg = (
                f"request {request.request_id!r}: group {group_id} has {len(blocks)} hit "
                f"blocks, but the request's tokens fill only {len(expected)}"
            )
            raise InvalidCacheHitError(msg)
        kept = blocks[first:]
        if not self.block_pool.holds_cached(kept, expected[first : len(blocks)], group_id):
            _name_bad_block(
                manager.block_pool,
                request,
                manager,
                blocks,
                expected,
                first,
                group_id,
                num_computed_tokens,
            )


def _name_bad_block(
    pool: BlockPool,
    request: Request,
    manager: SingleTypeManager[Any],
    blocks: Sequence[int],
    expected: Sequence[object],
    first: int,
    group_id: int,
    num_computed_tokens: int,
) -> None:
    """Walk a hit that failed the fast check block by block: raise for the first bad one.

    A null block passes where the type does not read the block's tokens at
    the first token to compute (its declared rule, ``spec.tokens_read``): the
    gap of a sinks-plus-window type, say. Everywhere else it is refused.
    """
    size = manager.block_size
    reads = tuple(r for r in manager.spec.tokens_read(num_computed_tokens) if r)
    prefix = f"request {request.request_id!r}: cache hit"
    for position in range(first, len(blocks)):
        block = blocks[position]
        where = f"at position {position} of group {group_id}"
        if type(block) is not int or not 0 <= block < pool.num_blocks:
            msg = (
                f"{prefix}: block {block!r} {where} is not a block of this pool "
                f"(ids 0..{pool.num_blocks - 1}); pass what get_computed_blocks returned"
            )
            raise InvalidCacheHitError(msg)
        if block == 0:
            start, stop = position * size, (position + 1) * size
            if any(r.start < stop and r.stop > start for r in reads):
                msg = (
                    f"{prefix}: position {position} of group {group_id} is the null block, "
                    "but the group reads those tokens; pass what get_computed_blocks returned"
                )
                raise InvalidCacheHitError(msg)
            continue
        if pool.block_hash(block) != expected[position] or pool.block_group(block) != group_id:
            msg = (
                f"{prefix}: block {block} {where} is not cached under this request's hash "
                "for that position (it comes from another request's lookup, or was "
                "evicted since); look the request up again with get_computed_blocks"
            )
            raise InvalidCacheHitError(msg)


def make_coordinator(
    config: KVCacheConfig,
    registry: Registry,
    *,
    enable_caching: bool,
    use_eagle: bool,
    enable_kv_cache_events: bool,
    eviction: str | EvictionPolicyFactory = "lru",
    backend: str | None = None,
    digest_size: int | None = None,
    int_hashes: bool = False,
) -> KVCacheCoordinator:
    """Validate ``config`` and build its coordinator.

    Every group's manager class first validates the configuration
    (:meth:`~kvcore.managers.SingleTypeManager.validate_config`), so a refused
    configuration builds nothing.

    Raises:
        UnknownSpecError: a group's spec has no manager in ``registry``.
        InvalidConfigError: a manager class refuses the configuration, or
            prefix caching is asked for a config containing a group that can
            never be cached (its KV depends on per-request input).
    """
    specs = [group.kv_cache_spec for group in config.kv_cache_groups]
    classes = [registry.manager_class(spec) for spec in specs]
    cacheable = [cls.is_prefix_cacheable(spec) for cls, spec in zip(classes, specs, strict=True)]
    _, alignment = hash_and_alignment(specs, cacheable)
    for cls, spec in zip(classes, specs, strict=True):
        cls.validate_config(
            spec,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            alignment_tokens=alignment if any(cacheable) else spec.block_size,
        )
    hit_rule = make_hit_rule(specs, classes, enable_caching=enable_caching, use_eagle=use_eagle)
    return KVCacheCoordinator(
        config,
        classes,
        hit_rule,
        enable_caching=enable_caching and bool(specs),
        enable_kv_cache_events=enable_kv_cache_events,
        eviction=eviction,
        backend=backend,
        digest_size=digest_size,
        int_hashes=int_hashes,
    )
