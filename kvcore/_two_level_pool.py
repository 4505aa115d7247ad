"""The two-level pool: one block pool per page class, carved out of shared large pages.

Groups whose pages differ keep their own page size. Each page class (one
page size, see :class:`~kvcore.PagePool`) has a :class:`ClassPool`: a
:class:`~kvcore.managers.BlockPool` over the class's small-page ids, with
its own reference counts, prefix-cache map and free queue built from the
eviction policy. Its groups' managers use it exactly as they use a shared
pool; block ids in their tables are small-page ids of the class. A class
pool's blocks exist only where a large page is carved for it:
:class:`~kvcore._large_pages.LargePages` decides which (and evicts across
classes), and :class:`TwoLevelBlockPool` holds the classes together: one
transaction, one event queue, one reset, lookups sent to the class of each
group.

A class's free small pages are its *spares* (never used since their page was
carved; they go first) and the blocks in its free queue.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, ClassVar

from kvcore._block_pool import BlockPool, Transaction, match_in_maps
from kvcore._blocks import UndoLog
from kvcore._config import PagePool
from kvcore._events import AllBlocksCleared, KVCacheEvent
from kvcore._free_ages import FreeAges
from kvcore._large_pages import LargePages
from kvcore.errors import InvalidBlockError
from kvcore.eviction import EvictionPolicyFactory, GroupInfo

__all__ = ["ClassPool", "TwoLevelBlockPool"]


class ClassPool(BlockPool):
    """The small pages of one page class of a :class:`TwoLevelBlockPool`.

    Built by the two-level pool; its groups' managers use it as any block
    pool. Its transactions are the two-level pool's (classes give memory to
    each other inside one operation).
    """

    __slots__ = ("_ages", "_klass", "_pages", "_room", "_spares", "_top")

    _FREE_AT_START = False

    def __init__(self, top: TwoLevelBlockPool, klass: int, num_blocks: int, **options: Any) -> None:
        super().__init__(num_blocks, **options)
        self._top = top
        self._klass = klass
        self._pages = top.pages
        # Free small pages never used since their large page was carved,
        # the one taken next last.
        self._spares: list[int] = []
        # The large pages' clock when each block was last freed (its age).
        self._ages = FreeAges(num_blocks, self)
        # Blocks the running transaction already made room for (make_room).
        self._room = 0

    @property
    def page_class(self) -> int:
        """The class this pool holds the small pages of."""
        return self._klass

    def transaction(self) -> Transaction:
        """A transaction of the whole two-level pool (see :meth:`BlockPool.transaction`)."""
        return self._top.transaction()

    def make_room(self, demand: Sequence[int], keep: Sequence[Sequence[int]]) -> bool:
        """See :meth:`TwoLevelBlockPool.make_room` (``demand`` and ``keep`` per group)."""
        return self._top.make_room(demand, keep)

    def pool_of(self, group: int) -> BlockPool:
        """The class pool of group ``group`` (see :meth:`TwoLevelBlockPool.pool_of`)."""
        return self._top.pool_of(group)

    # -- capacity -----------------------------------------------------------------------

    def own_free(self) -> int:
        """Free small pages of the class's own large pages (spares and queued)."""
        return self._num_free + len(self._spares)

    def num_spares(self) -> int:
        """Free small pages never used since their large page was carved."""
        return len(self._spares)

    @property
    def num_free(self) -> int:
        """Blocks the class can take without evicting: its own and the free large pages'.

        Free large pages count only up to the class's limit, if it has one
        (:meth:`TwoLevelBlockPool.limit_classes`).
        """
        pages = len(self._pages.free)
        room = self._pages.headroom(self._klass)
        if room is not None:
            pages = min(pages, room)
        return self.own_free() + self._pages.per_page[self._klass] * pages

    def get_num_free_blocks(self) -> int:
        """See :attr:`num_free`."""
        return self.num_free

    @property
    def num_in_use(self) -> int:
        """Small pages of the class held by requests or reserved."""
        return self._pages.owned[self._klass] * self._pages.per_page[self._klass] - self.own_free()

    def get_usage(self) -> float:
        """Fraction of the class's own small pages in use (0.0 when it owns none)."""
        owned = self._pages.owned[self._klass] * self._pages.per_page[self._klass]
        return self.num_in_use / owned if owned else 0.0

    # -- what LargePages asks (ClassMemory) ---------------------------------------------

    def queue_ages(self, skip: set[int]) -> Iterator[int]:
        """What taking each queued free block would lose, in the order they are taken.

        ``skip`` left out. ``-1`` for a block caching nothing; else the age
        of the stalest cached free block from it on (it, or one the policy
        hands out later): with a policy that orders by age (``lru``), the
        block's own age.
        """
        hash_of = self._hash
        freed_at = self._ages.freed_at
        counted = set(skip)
        stalest = self._ages.stalest(counted)
        for block in self._queue:
            if block in skip:
                continue
            if hash_of[block] is None:
                yield -1
            else:
                oldest = next(stalest)
                age = freed_at[block]
                yield age if oldest is None or oldest > age else oldest
            counted.add(block)

    def free_among(self, blocks: set[int]) -> int:
        """How many of ``blocks`` are free (waiting in the queue)."""
        ref = self._ref
        return sum(1 for block in blocks if not ref[block])

    def caches_any(self, blocks: range) -> bool:
        """Whether a block of ``blocks`` carries a hash."""
        return self._hash[blocks.start : blocks.stop].count(None) != len(blocks)

    def supply(self, blocks: range) -> None:
        """``blocks`` (a large page just given to the class) become spares.

        They are taken lowest first, after the spares of pages carved before.
        """
        self._spares[:0] = reversed(blocks)
        self.record(self._unsupply, len(blocks))

    def _unsupply(self, count: int) -> None:
        del self._spares[:count]

    def withdraw(self, blocks: range) -> None:
        """``blocks`` (one large page, nothing in use) leave the class; their hashes go."""
        start, stop = blocks.start, blocks.stop
        spares = self._spares
        kept = [block for block in spares if not start <= block < stop]
        spared = set(spares).difference(kept)
        if spared:
            self.record(self._set_spares, spares)
            self._spares = kept
        queued = [block for block in blocks if block not in spared]
        if not queued:
            return
        self._queue.withdraw(queued)
        self._num_free -= len(queued)
        self.record(self._add_free, len(queued))
        cached = [block for block in queued if self._hash[block] is not None]
        if cached:
            self._evict(cached)

    def _set_spares(self, spares: list[int]) -> None:
        self._spares = spares

    def _add_free(self, count: int) -> None:
        self._num_free += count

    # -- the trusted operations, with the large pages' bookkeeping ----------------------

    def _take(self, num_blocks: int) -> list[int]:
        """Spares first, then the free queue; memory is carved or reclaimed when short."""
        if not num_blocks:
            return []
        if num_blocks <= self._room:
            self._room -= num_blocks
        elif num_blocks > len(self._spares):
            # A direct call: the same choice of memory as an allocation's.
            self._pages.supply(self._klass, num_blocks)
        spares = self._spares
        from_spares = min(num_blocks, len(spares))
        blocks = spares[len(spares) - from_spares :][::-1]
        if from_spares:
            del spares[len(spares) - from_spares :]
            ref = self._ref
            for block in blocks:
                ref[block] = 1
            self.record(self._unspare, blocks)
        queued = self._take_queued(num_blocks - from_spares) if num_blocks > from_spares else []
        taken = blocks + queued
        self._pages.used(self._klass, taken)
        if queued and self.enable_caching:
            self._evict(queued)
        return taken

    def _unspare(self, blocks: list[int]) -> None:
        ref = self._ref
        for block in blocks:
            ref[block] = 0
        self._spares.extend(reversed(blocks))

    def _release(self, blocks: Sequence[int]) -> None:
        """As the block pool's, except that a block freed caching nothing becomes a spare.

        Such a block (a request's running state, a partly filled last block)
        holds nothing a hit could use, so it is taken before any queued block,
        whose cache the policy would evict; in the queue it would wait its
        turn behind cached blocks.
        """
        spared, queued = self._split_uncached(blocks)
        released = self._release_listing(queued) if queued else []
        if spared:
            ref = self._ref
            for block in spared:
                ref[block] = 0
            # The spare taken next is the last: the first block given goes first.
            self._spares.extend(reversed(spared))
            self.record(self._unspare_freed, spared)
        freed = released + spared
        if freed:
            self._pages.freed(self._klass, freed)
            if released:
                self._ages.stamp(released, self._pages.clock)

    def _split_uncached(self, blocks: Sequence[int]) -> tuple[list[int], Sequence[int]]:
        """The blocks this release frees that cache nothing, and the rest (for the queue).

        A block listed twice stays with the rest, whose release finds the double free.
        """
        ref, hash_of = self._ref, self._hash
        spared = [b for b in blocks if b and ref[b] == 1 and hash_of[b] is None]
        if not spared:
            return [], blocks
        if len(set(spared)) != len(spared):
            return [], blocks
        chosen = set(spared)
        return spared, [block for block in blocks if block not in chosen]

    def _unspare_freed(self, blocks: list[int]) -> None:
        del self._spares[len(self._spares) - len(blocks) :]
        ref = self._ref
        for block in blocks:
            ref[block] = 1

    def _touch(self, blocks: Sequence[int]) -> list[int]:
        revived = super()._touch(blocks)
        if revived:
            self._pages.used(self._klass, revived)
        return revived

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """See :meth:`BlockPool.evict_blocks`; a large page left holding nothing goes back."""
        blocks = list(block_ids)
        with self.transaction():
            super().evict_blocks(blocks)
            per = self._pages.per_page[self._klass]
            for page in sorted({block // per for block in blocks if block}):
                self._pages.settle(self._klass, page)

    def reset_prefix_cache(self) -> bool:
        """Reset every class at once (see :meth:`TwoLevelBlockPool.reset_prefix_cache`)."""
        return self._top.reset_prefix_cache()

    # -- inspection -----------------------------------------------------------------------

    def free_block_ids(self) -> list[int]:
        """The class's free small pages in the order they are taken: spares, then the queue's."""
        return [*reversed(self._spares), *self._queue]

    def holding(self, page: int) -> tuple[int, bool]:
        """Small pages of large page ``page`` in use, and whether one is cached."""
        blocks = self._pages.page_range(self._klass, page)
        in_use = sum(1 for block in blocks if self._ref[block])
        return in_use, self.caches_any(blocks)

    def check_invariants(self) -> None:
        """Verify the class; O(small pages), for tests.

        Free blocks (spares and queued) are exactly the unused small pages
        of the large pages the class owns; a spare caches nothing; a block
        of a page the class does not own is neither held, free nor cached.

        Raises:
            AssertionError: naming the first violated invariant.
        """
        queued = self._check_free_queue()
        spares = set(self._spares)
        if len(spares) != len(self._spares) or spares & queued:
            msg = f"class {self._klass}: a spare is listed twice or also queued"
            raise AssertionError(msg)
        per = self._pages.per_page[self._klass]
        owner = self._pages.owner
        reserved = set(self._reserved)
        for block in range(1, self.num_blocks):
            owned = owner[block // per] == self._klass
            self._check_block_state(block, owned, block in queued, block in spares, reserved)
        self._check_map()

    def _check_block_state(
        self, block: int, owned: bool, queued: bool, spare: bool, reserved: set[int]
    ) -> None:
        ref, cached = self._ref[block], self._hash[block] is not None
        where = f"class {self._klass}: small page {block}"
        if not owned and (ref or queued or spare or cached):
            msg = f"{where} is in a large page the class does not own, but is used or cached"
            raise AssertionError(msg)
        if owned and (ref == 0) != (queued or spare):
            msg = f"{where}: ref count {ref} but free={queued or spare}"
            raise AssertionError(msg)
        if (spare or block in reserved) and cached:
            msg = f"{where} is a spare or reserved, but cached"
            raise AssertionError(msg)


class TwoLevelBlockPool:
    """The KV cache blocks of one engine whose groups' pages differ: one pool per page class.

    Args:
        page_pool: How the memory is carved (large pages, classes, the class
            of each group).
        enable_caching: Keep full blocks in the prefix cache.
        hash_block_size: Tokens per entry of ``Request.block_hashes``.
        enable_kv_cache_events: Queue KV cache events for :meth:`take_events`.
        group_kinds: Attention kind of each group, stamped on events.
        eviction: The eviction policy (a name or a factory); every class gets
            its own instance, built for the class's small pages.
        group_info: What the policy is told about each group (a class's
            policy is told the other classes' groups cache nothing of it).
        alignment_tokens: Hit lengths are multiples of this (told to the policy).

    Raises:
        InvalidConfigError, PoolTooLargeError, UnknownEvictionPolicyError: as
            :class:`~kvcore.managers.BlockPool` (for any class).
    """

    null_block = 0
    #: Which backend serves this pool (two-level pools are Python only).
    backend: ClassVar[str] = "python"

    def __init__(
        self,
        page_pool: PagePool,
        *,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        enable_kv_cache_events: bool = False,
        group_kinds: Sequence[str] | None = None,
        eviction: str | EvictionPolicyFactory = "lru",
        group_info: Sequence[GroupInfo] | None = None,
        alignment_tokens: int = 1,
    ) -> None:
        num_groups = len(page_pool.group_classes)
        if group_info is None:
            kinds = group_kinds if group_kinds is not None else (None,) * num_groups
            group_info = [GroupInfo(kind=kind) for kind in kinds]
        self.page_pool = page_pool
        self.num_blocks = page_pool.num_large_pages
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self._undo_steps: UndoLog = []
        self._transaction = Transaction(self)
        self._journal: UndoLog | None = None
        self._events: list[KVCacheEvent] = []
        self.pages = LargePages(page_pool)
        self.pools: tuple[ClassPool, ...] = tuple(
            ClassPool(
                self,
                klass,
                page_pool.num_blocks(klass),
                enable_caching=enable_caching,
                hash_block_size=hash_block_size,
                num_groups=num_groups,
                enable_kv_cache_events=enable_kv_cache_events,
                group_kinds=group_kinds,
                eviction=eviction,
                group_info=_class_view(group_info, page_pool.group_classes, klass),
                alignment_tokens=alignment_tokens,
            )
            for klass in range(page_pool.num_classes)
        )
        for pool in self.pools:
            pool._events = self._events
        self.pages.attach(self.pools)

    def pool_of(self, group: int) -> ClassPool:
        """The class pool holding group ``group``'s blocks."""
        return self.pools[self.page_pool.group_classes[group]]

    def limit_classes(self, large_pages: Sequence[int | None]) -> None:
        """Confine each class to at most ``large_pages[class]`` large pages (``None``: no limit).

        Memory then stops moving to a class at its limit: it evicts from its
        own free queue instead, as a pool split between classes once at
        start-up would. Large page 0 is not counted. Meant for comparing the
        dynamic split with static ones; a limit can be raised or dropped at
        any time, lowered only to what the class owns.

        Raises:
            InvalidConfigError: not one entry per class, an entry that is
                neither ``None`` nor an int ≥ 0, or one below the large pages
                the class owns now; nothing changes.
        """
        self.pages.limit(large_pages)

    # -- transactions -------------------------------------------------------------------

    def transaction(self) -> Transaction:
        """A ``with`` block whose changes, in every class, all stay or none do."""
        return self._transaction

    def record(self, undo: Callable[..., None], *arguments: Any) -> None:
        """Add ``undo(*arguments)`` to the running transaction (no-op outside one)."""
        if self._journal is not None:
            self._journal.append((undo, arguments))

    def _set_journal(self, journal: UndoLog | None) -> None:
        self._journal = self.pages.journal = journal
        for pool in self.pools:
            pool._journal = pool._queue.journal = journal
            pool._room = 0

    def _begin(self) -> bool:
        if self._journal is not None:
            return False
        self._set_journal(self._undo_steps)
        return True

    def _commit(self) -> None:
        self._set_journal(None)
        self._undo_steps.clear()

    def _rollback(self) -> None:
        steps = self._undo_steps
        self._set_journal(None)
        for undo, arguments in reversed(steps):
            undo(*arguments)
        steps.clear()

    # -- an allocation's room -----------------------------------------------------------

    def make_room(self, demand: Sequence[int], keep: Sequence[Sequence[int]]) -> bool:
        """Make every class able to take its groups' part of an allocation, or change nothing.

        Args:
            demand: Per group, the blocks the allocation takes (the free hits
                it revives included).
            keep: Per group, the hit blocks it adopts (never evicted for it).

        Returns:
            Whether the room is there; large pages are carved or taken from
            other classes for it (inside the caller's transaction).
        """
        classes = self.page_pool.group_classes
        by_class: dict[int, int] = {}
        for group, count in enumerate(demand):
            if count:
                by_class[classes[group]] = by_class.get(classes[group], 0) + count
        pools = self.pools
        if any(count > len(pools[klass]._spares) for klass, count in by_class.items()):
            kept: dict[int, set[int]] = {}
            for group, blocks in enumerate(keep):
                if blocks:
                    kept.setdefault(classes[group], set()).update(b for b in blocks if b)
            if not self.pages.make_room(by_class, kept):
                return False
        if self._journal is not None:
            # The takes that follow in this transaction need not plan again.
            for klass, count in by_class.items():
                pools[klass]._room = count
        return True

    # -- capacity -------------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Large pages none of whose small pages is in use (free, or fully free in a class)."""
        return len(self.pages.free) + sum(len(pages) for pages in self.pages.fully_free)

    def get_num_free_blocks(self) -> int:
        """See :attr:`num_free` (in large pages)."""
        return self.num_free

    def get_usage(self) -> float:
        """Fraction of the memory (large page 0 aside) held by blocks in use, 0.0–1.0."""
        usable = self.num_blocks - 1
        if not usable:
            return 0.0
        per = self.pages.per_page
        used = sum(pool.num_in_use / per[pool.page_class] for pool in self.pools)
        return used / usable

    @property
    def num_in_use(self) -> int:
        """Small pages held by requests or reserved, every class."""
        return sum(pool.num_in_use for pool in self.pools)

    @property
    def num_reserved_blocks(self) -> int:
        """Small pages set aside for good, every class."""
        return sum(pool.num_reserved_blocks for pool in self.pools)

    @property
    def num_evicted(self) -> int:
        """Cached blocks whose contents were lost to new allocations so far, every class."""
        return sum(pool.num_evicted for pool in self.pools)

    def num_cached_blocks(self) -> int:
        """Blocks in the prefix cache, every class."""
        return sum(pool.num_cached_blocks() for pool in self.pools)

    # -- events and the cache as a whole --------------------------------------------------

    def take_events(self) -> list[KVCacheEvent]:
        """Return the queued events of every class, oldest first, and clear the queue."""
        events = self._events[:]
        self._events.clear()
        return events

    def peek_events(self) -> tuple[KVCacheEvent, ...]:
        """The queued events, oldest first, left in the queue."""
        return tuple(self._events)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block of every class, if no request holds a block.

        Every large page left holding nothing goes back to the common pool.
        Returns ``False`` (nothing changes) while a block is in use.
        """
        if self.num_in_use != self.num_reserved_blocks:
            return False
        for pool in self.pools:
            pool._clear_cache()
        for page, owner in enumerate(self.pages.owner):
            if owner >= 0:
                self.pages.settle(owner, page)
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())
        return True

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop the given block ids from the prefix cache of every class that has them.

        Block ids are per class, so one id may name a block in several
        classes: each is dropped (a cache entry lost, never an invalid one
        kept).

        Raises:
            InvalidBlockError: an id is no block of any class; nothing changes.
        """
        blocks = list(block_ids)
        largest = max(pool.num_blocks for pool in self.pools)
        for block in blocks:
            if type(block) is not int or not 0 <= block < largest:
                msg = f"block {block!r} is not a block of this pool (ids 0..{largest - 1})"
                raise InvalidBlockError(msg)
        with self.transaction():
            for pool in self.pools:
                pool.evict_blocks([block for block in blocks if block < pool.num_blocks])

    # -- lookups (the hit rule's) -----------------------------------------------------------

    def get_cached_block(
        self, block_hash: Hashable, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """One cached block per listed group for ``block_hash``, or ``None``."""
        classes = self.page_pool.group_classes
        first = classes[kv_cache_group_ids[0]]
        if all(classes[group] == first for group in kv_cache_group_ids):
            return self.pools[first].get_cached_block(block_hash, kv_cache_group_ids)
        found = []
        for group in kv_cache_group_ids:
            block = self.pools[classes[group]]._cached[group].get(block_hash)
            if block is None:
                return None
            found.append(block)
        return found

    def match_prefix(
        self,
        block_hashes: Sequence[Hashable],
        start: int,
        stop: int,
        kv_cache_group_ids: Sequence[int],
    ) -> tuple[list[int], ...]:
        """The run of hits from ``start`` in every listed group (as a shared pool finds it)."""
        classes = self.page_pool.group_classes
        first = classes[kv_cache_group_ids[0]]
        if all(classes[group] == first for group in kv_cache_group_ids):
            return self.pools[first].match_prefix(block_hashes, start, stop, kv_cache_group_ids)
        maps = [self.pools[classes[group]]._cached[group] for group in kv_cache_group_ids]
        return match_in_maps(maps, block_hashes[start:stop])

    def holds_cached(
        self, blocks: Sequence[int], block_hashes: Sequence[Hashable], group: int
    ) -> bool:
        """Whether ``blocks`` are cached in ``group`` under ``block_hashes`` (its class's pool)."""
        return self.pool_of(group).holds_cached(blocks, block_hashes, group)

    # -- inspection -----------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Verify every class and the large pages; O(small pages), for tests.

        Raises:
            AssertionError: naming the first violated invariant.
        """
        for pool in self.pools:
            pool.check_invariants()
        self.pages.check_invariants(lambda klass, page: self.pools[klass].holding(page))


def _class_view(
    groups: Sequence[GroupInfo], group_classes: Sequence[int], klass: int
) -> list[GroupInfo]:
    """What class ``klass``'s policy is told: the other classes' groups cache nothing in it."""
    return [
        info
        if group_classes[group] == klass
        else GroupInfo(kind=info.kind, block_size=info.block_size, prefix_cached=False)
        for group, info in enumerate(groups)
    ]
