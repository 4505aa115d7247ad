"""Large pages: which page class owns each one, and which class gets memory next.

The memory of a two-level pool is cut into large pages (see
:class:`~kvcore.PagePool`). A large page is *free* (in the common pool), or
owned by one page class, whose small pages it holds. :class:`LargePages`
keeps, per large page, its owner and how many of its small pages are in use,
and, per class, its *fully free* pages: owned, none of their small pages in
use, some still cached (a page with nothing in use and nothing cached goes
back to the common pool at once).

It also decides where an allocation's small pages come from
(:meth:`LargePages.plan`), class by class, cheapest first:

1. the class's *spares* (small pages of its pages that were never used
   since the page was carved: they cache nothing);
2. free large pages, carved for the class;
3. then, oldest first, either the class's own free queue (evicting the
   blocks its policy hands out first) or a fully free page of another class
   (evicting every block it caches), whichever holds the staler cache (the
   class's stalest cached free block, see ``ClassMemory.queue_ages``,
   against the page's release).
   That is eviction aware of large pages: memory moves to the class that
   needs it a whole page at a time, and the pages given up are the ones
   whose cached contents are the stalest, whatever their class. A class
   gives up a page only while it keeps enough for its own part of the
   allocation, and never one holding a block the allocation adopts.

A caller may confine classes (:meth:`LargePages.limit`): a class at its
limit takes no free large page and no other class's page, and evicts from
its own queue instead (a static split between classes, for comparison).

The class pools report every block that becomes used or free
(:meth:`LargePages.used`, :meth:`LargePages.freed`) and are called back to
take or give up a page's small pages (:class:`ClassMemory`). Every change is
recorded in the running transaction's undo log.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from kvcore._blocks import UndoLog
from kvcore._config import PagePool
from kvcore.errors import InvalidConfigError, OutOfBlocksError

__all__ = ["FREE", "RESERVED", "ClassMemory", "LargePages"]

#: Owner of a large page in the common pool.
FREE = -1
#: Owner of large page 0, which holds every class's null block.
RESERVED = -2
#: Owner of a page while its class gives it up (its blocks' hooks must not act).
_LEAVING = -3
#: The age of a free small page that caches nothing: taking it loses nothing.
_NOTHING_LOST = -1
#: Most blocks of one class :meth:`LargePages._own_queues_cover` looks at.
_QUICK_PLAN_BLOCKS = 8
#: Stale entries a class's index of fully free pages may hold beyond twice
#: its live ones before it is rebuilt.
_STALE_ALLOWED = 64
#: Above this many blocks, :func:`_per_page` counts them in C.
_COUNT_IN_C = 8


class ClassMemory(Protocol):
    """What :class:`LargePages` asks of the pool of one page class."""

    def own_free(self) -> int:
        """Free small pages the class holds now (spares and queued)."""
        ...

    def num_spares(self) -> int:
        """Free small pages of the class never used since their page was carved."""
        ...

    def queue_ages(self, skip: set[int]) -> Iterator[int]:
        """What taking each queued free block loses, in the order they are taken.

        ``skip`` left out. ``-1`` for a block caching nothing; else the
        clock at which the stalest cached free block from this one on (in
        the order they are taken) was freed.
        """
        ...

    def free_among(self, blocks: set[int]) -> int:
        """How many of ``blocks`` (an allocation's hits) are free, waiting in the queue."""
        ...

    def caches_any(self, blocks: range) -> bool:
        """Whether a block of ``blocks`` carries a hash."""
        ...

    def supply(self, blocks: range) -> None:
        """``blocks`` (a large page just given to the class) become spares."""
        ...

    def withdraw(self, blocks: range) -> None:
        """``blocks`` (a large page none of whose blocks is in use) leave the class.

        Their hashes are dropped (an eviction, with its events).
        """
        ...


class LargePages:
    """Owners, use counts and fully free pages of a two-level pool's large pages.

    Args:
        page_pool: The layout (large pages, classes).

    The class pools are attached with :meth:`attach` once built. The owner
    sets :attr:`journal` to the running transaction's undo log (``None``
    outside one).
    """

    __slots__ = (
        "_borrowed",
        "_clock",
        "_heaps",
        "free",
        "fully_free",
        "in_use",
        "journal",
        "limits",
        "moves",
        "owned",
        "owner",
        "per_page",
        "pools",
    )

    def __init__(self, page_pool: PagePool) -> None:
        count = page_pool.num_large_pages
        classes = page_pool.num_classes
        #: The running transaction's undo log, or ``None``.
        self.journal: UndoLog | None = None
        #: Small pages a large page holds, per class.
        self.per_page = tuple(page_pool.pages_per_large_page(c) for c in range(classes))
        self.owner = [FREE] * count
        self.owner[0] = RESERVED
        #: The common pool, the page handed out next last.
        self.free: list[int] = list(range(count - 1, 0, -1))
        #: Small pages in use (held or reserved), per large page.
        self.in_use = [0] * count
        #: Large pages owned, per class.
        self.owned = [0] * classes
        #: Per class: fully free page -> the clock when it became so.
        self.fully_free: list[dict[int, int]] = [{} for _ in range(classes)]
        # Per class: (clock, page) of fully free pages, oldest first; an entry
        # whose clock is no longer the page's in fully_free is stale.
        self._heaps: list[list[tuple[int, int]]] = [[] for _ in range(classes)]
        self._clock = 0
        #: Large pages taken from one class for another so far.
        self.moves = 0
        # Index entries the running plan took out of the heaps, to put back.
        self._borrowed: list[tuple[int, tuple[int, int]]] = []
        self.pools: tuple[ClassMemory, ...] = ()
        #: Per class, the most large pages it may own (``None``: no limit).
        self.limits: tuple[int | None, ...] = (None,) * classes

    def attach(self, pools: Sequence[ClassMemory]) -> None:
        """Give the pools of the classes, by class."""
        self.pools = tuple(pools)

    def limit(self, limits: Sequence[int | None]) -> None:
        """Confine each class to at most ``limits[class]`` large pages (``None``: no limit).

        Raises:
            InvalidConfigError: not one entry per class, an entry that is
                neither ``None`` nor an int ≥ 0, or a limit below what the
                class owns now; nothing changes.
        """
        entries = tuple(limits)
        if len(entries) != len(self.owned):
            msg = f"limits: give one entry per page class ({len(self.owned)}), got {len(entries)}"
            raise InvalidConfigError(msg)
        for klass, entry in enumerate(entries):
            if entry is None:
                continue
            if type(entry) is not int or entry < 0:
                msg = f"limits[{klass}]: a number of large pages >= 0 or None, got {entry!r}"
                raise InvalidConfigError(msg)
            if entry < self.owned[klass]:
                msg = (
                    f"limits[{klass}]: class {klass} owns {self.owned[klass]} large pages "
                    f"now, more than {entry}; free its blocks first or give at least "
                    f"{self.owned[klass]}"
                )
                raise InvalidConfigError(msg)
        self.limits = entries

    def headroom(self, klass: int) -> int | None:
        """Large pages ``klass`` may still gain under its limit (``None``: no limit)."""
        cap = self.limits[klass]
        return None if cap is None else cap - self.owned[klass]

    @property
    def clock(self) -> int:
        """Counts the releases so far: the age stamped on freed blocks and pages."""
        return self._clock

    def _record(self, undo: Callable[..., object], *arguments: object) -> None:
        journal = self.journal
        if journal is not None:
            journal.append((undo, arguments))

    def page_range(self, klass: int, page: int) -> range:
        """The small-page ids of class ``klass`` that large page ``page`` holds."""
        per = self.per_page[klass]
        return range(page * per, (page + 1) * per)

    # -- what the class pools report --------------------------------------------------

    def used(self, klass: int, blocks: Sequence[int]) -> None:
        """Free ``blocks`` of class ``klass`` are now in use."""
        per = self.per_page[klass]
        in_use = self.in_use
        fully_free = self.fully_free[klass]
        for page, count in _per_page(list(map(per.__rfloordiv__, blocks))):
            if not in_use[page]:
                since = fully_free.pop(page, None)
                if since is not None:
                    self._record(fully_free.__setitem__, page, since)
            in_use[page] += count
        self._record(self._unuse, per, blocks)

    def _unuse(self, per: int, blocks: Sequence[int]) -> None:
        in_use = self.in_use
        for block in blocks:
            in_use[block // per] -= 1

    def freed(self, klass: int, blocks: Sequence[int]) -> None:
        """``blocks`` of class ``klass`` are free again (one release); a page left empty goes."""
        self._record(self._set_clock, self._clock)
        self._clock += 1
        per = self.per_page[klass]
        in_use = self.in_use
        self._record(self._unfree, per, blocks)
        pages = list(map(per.__rfloordiv__, blocks))
        for page, count in _per_page(pages):
            in_use[page] -= count
        # Settled in the order the pages were left empty: that of their last block.
        emptied = [page for page in dict.fromkeys(reversed(pages)) if not in_use[page]]
        for page in reversed(emptied):
            self.settle(klass, page)

    def _set_clock(self, value: int) -> None:
        self._clock = value

    def _unfree(self, per: int, blocks: Sequence[int]) -> None:
        in_use = self.in_use
        for block in blocks:
            in_use[block // per] += 1

    def settle(self, klass: int, page: int) -> None:
        """Page ``page`` of class ``klass`` has nothing in use: keep it fully free, or give it back.

        No-op for a page in use, or not the class's.
        """
        if self.owner[page] != klass or self.in_use[page]:
            return
        if self.pools[klass].caches_any(self.page_range(klass, page)):
            fully_free = self.fully_free[klass]
            if page not in fully_free:
                fully_free[page] = self._clock
                heap = self._heaps[klass]
                heapq.heappush(heap, (self._clock, page))
                self._record(fully_free.pop, page)
                if len(heap) > 2 * len(fully_free) + _STALE_ALLOWED:
                    self._rebuild_heap(klass)
        else:
            self._give_back(page)

    def _rebuild_heap(self, klass: int) -> None:
        """Index ``klass``'s fully free pages afresh, without the stale entries.

        Entries are unique ``(clock, page)`` pairs, so the pages come out of
        the new heap in the same order as out of the old one.
        """
        self._record(self._heaps.__setitem__, klass, self._heaps[klass])
        heap = [(since, page) for page, since in self.fully_free[klass].items()]
        heapq.heapify(heap)
        self._heaps[klass] = heap

    def _oldest(self, owner: int) -> int | None:
        """Clock of ``owner``'s longest fully free page (``None``: none); stale entries go."""
        heap = self._heaps[owner]
        fully_free = self.fully_free[owner]
        while heap:
            since, page = heap[0]
            if fully_free.get(page) == since:
                return since
            self._record(heapq.heappush, heap, heapq.heappop(heap))
        return None

    # -- moving large pages -----------------------------------------------------------

    def _set_owner(self, page: int, owner: int) -> None:
        self._record(self.owner.__setitem__, page, self.owner[page])
        self.owner[page] = owner

    def _count_owned(self, klass: int, delta: int) -> None:
        self.owned[klass] += delta
        self._record(self._count_owned_undo, klass, -delta)

    def _count_owned_undo(self, klass: int, delta: int) -> None:
        self.owned[klass] += delta

    def _give_back(self, page: int) -> None:
        """Page ``page`` (nothing in use, nothing cached) leaves its class for the common pool."""
        klass = self.owner[page]
        since = self.fully_free[klass].pop(page, None)
        if since is not None:
            self._record(self.fully_free[klass].__setitem__, page, since)
        self._set_owner(page, _LEAVING)
        self.pools[klass].withdraw(self.page_range(klass, page))
        self._count_owned(klass, -1)
        self._set_owner(page, FREE)
        self.free.append(page)
        self._record(self.free.pop)

    def _leave_class(self, page: int) -> None:
        """Fully free ``page`` leaves its class, evicting what it caches."""
        klass = self.owner[page]
        since = self.fully_free[klass].pop(page)
        self._record(self.fully_free[klass].__setitem__, page, since)
        self._set_owner(page, _LEAVING)
        self.pools[klass].withdraw(self.page_range(klass, page))
        self._count_owned(klass, -1)
        self.moves += 1
        self._record(self._count_move_undo)

    def _count_move_undo(self) -> None:
        self.moves -= 1

    def _carve(self, page: int, klass: int) -> None:
        """Give ``page`` (free, or just taken from its class) to ``klass``."""
        self._set_owner(page, klass)
        self._count_owned(klass, 1)
        self.pools[klass].supply(self.page_range(klass, page))

    def _take_free_page(self, page: int) -> None:
        position = len(self.free) - 1 if self.free[-1] == page else self.free.index(page)
        del self.free[position]
        self._record(self.free.insert, position, page)

    # -- deciding where an allocation's pages come from -------------------------------

    def plan(
        self, demand: Mapping[int, int], keep: Mapping[int, set[int]]
    ) -> list[tuple[int, int]] | None:
        """The large pages to give each class so that it can take ``demand[class]`` blocks.

        ``demand`` counts the blocks an allocation takes per class, the free
        hits it revives included; ``keep``: per class, the hits it adopts
        (never evicted). Returns ``(large page, class)`` pairs to carry out in
        order, or ``None`` if the memory is not there (see the module
        documentation). Changes nothing.
        """
        if self._own_queues_cover(demand, keep):
            return []
        try:
            return self._plan(demand, keep)
        finally:
            for klass, entry in self._borrowed:
                heapq.heappush(self._heaps[klass], entry)
            self._borrowed.clear()

    def _own_queues_cover(self, demand: Mapping[int, int], keep: Mapping[int, set[int]]) -> bool:
        """Whether :meth:`_plan` would move no page: each class evicts from its own queue.

        A quick answer for the common case (an allocation of a few blocks,
        no hits, no free large page to carve): each class's next queued
        blocks were freed no later than every other class's longest fully
        free page, the oldest page the plan could weigh them against, so the
        plan takes them too. ``False`` when in doubt.
        """
        heaps = self._heaps
        for klass, wanted in demand.items():
            pool = self.pools[klass]
            short = wanted - pool.num_spares()
            if short <= 0:
                continue
            if short > _QUICK_PLAN_BLOCKS or keep.get(klass) or pool.own_free() < wanted:
                return False
            room = self.headroom(klass)
            if self.free and (room is None or room > 0):
                return False
            bound = min(
                (
                    since
                    for owner in range(len(heaps))
                    if owner != klass and (since := self._oldest(owner)) is not None
                ),
                default=None,
            )
            if bound is None:
                continue
            ages = pool.queue_ages(set())
            for _ in range(short):
                if next(ages) > bound:
                    return False
        return True

    def _plan(
        self, demand: Mapping[int, int], keep: Mapping[int, set[int]]
    ) -> list[tuple[int, int]] | None:
        plan: list[tuple[int, int]] = []
        gained = dict.fromkeys(range(len(self.pools)), 0)
        lost = dict(gained)
        free_pages = iter(reversed(self.free))
        for klass, wanted in demand.items():
            pool = self.pools[klass]
            # Free hits come out of the queue without evicting anything.
            hits = pool.free_among(keep[klass]) if keep.get(klass) else 0
            short = wanted - hits - pool.num_spares()
            for page in free_pages if short > 0 and self._may_gain(klass, gained, lost) else ():
                plan.append((page, klass))
                gained[klass] += self.per_page[klass]
                short -= self.per_page[klass]
                if short <= 0 or not self._may_gain(klass, gained, lost):
                    break
            if short > 0:
                queued = pool.own_free() - pool.num_spares() - hits
                budget = _Budget(demand, keep, gained, lost, {page for page, _ in plan})
                if not self._plan_eviction(klass, short, queued, budget, plan):
                    return None
        return plan

    def _plan_eviction(
        self, klass: int, short: int, queued: int, budget: _Budget, plan: list[tuple[int, int]]
    ) -> bool:
        """Cover ``short`` blocks of ``klass`` from its queue or others' fully free pages.

        ``queued``: the queued blocks the class may take. Appends the pages
        taken from other classes to ``plan``; ``False`` if there are too few.
        """
        candidates = [
            found
            for owner in range(len(self.pools))
            if owner != klass and (found := self._next_candidate(owner, budget)) is not None
        ]
        if not candidates:
            return queued >= short
        ages = self.pools[klass].queue_ages(budget.keep.get(klass, set()))
        own_age = next(ages, None) if queued > 0 else None
        room = self._pages_room(klass, budget)
        while short > 0:
            other = min(candidates) if candidates and room != 0 else None
            if own_age is not None and (other is None or own_age <= other[0]):
                short -= 1
                queued -= 1
                own_age = next(ages, None) if queued > 0 else None
                continue
            if other is None:
                return False
            _, page, owner = other
            candidates.remove(other)
            if room is not None:
                room -= 1
            plan.append((page, klass))
            budget.planned.add(page)
            budget.lost[owner] += self.per_page[owner]
            short -= self.per_page[klass]
            found = self._next_candidate(owner, budget)
            if found is not None:
                candidates.append(found)
        return True

    def _may_gain(self, klass: int, gained: Mapping[int, int], lost: Mapping[int, int]) -> bool:
        """Whether ``klass``, having gained and lost these blocks so far, may gain a page."""
        room = self.headroom(klass)
        return room is None or room * self.per_page[klass] > gained[klass] - lost[klass]

    def _pages_room(self, klass: int, budget: _Budget) -> int | None:
        """Large pages ``klass`` may still gain in this plan (``None``: no limit)."""
        room = self.headroom(klass)
        if room is None:
            return None
        per = self.per_page[klass]
        return max(0, room - (budget.gained[klass] - budget.lost[klass]) // per)

    def _next_candidate(self, owner: int, budget: _Budget) -> tuple[int, int, int] | None:
        """``owner``'s oldest fully free page it can give, not planned: ``(clock, page, owner)``."""
        per = self.per_page[owner]
        if budget.spare(owner, self.pools[owner].own_free()) < per:
            return None
        kept = budget.keep.get(owner)
        heap = self._heaps[owner]
        fully_free = self.fully_free[owner]
        while heap:
            since, page = entry = heapq.heappop(heap)
            if fully_free.get(page) != since:
                self._record(heapq.heappush, heap, entry)  # stale: dropped for good
                continue
            self._borrowed.append((owner, entry))
            if page in budget.planned:
                continue
            if kept and any(block in kept for block in self.page_range(owner, page)):
                continue
            return since, page, owner
        return None

    def carry_out(self, plan: Sequence[tuple[int, int]]) -> None:
        """Give the planned large pages to their classes (see :meth:`plan`)."""
        for page, klass in plan:
            if self.owner[page] == FREE:
                self._take_free_page(page)
            else:
                self._leave_class(page)
            self._carve(page, klass)

    def make_room(self, demand: Mapping[int, int], keep: Mapping[int, set[int]]) -> bool:
        """Plan and carry out; ``False`` (nothing changed) if the memory is not there."""
        plan = self.plan(demand, keep)
        if plan is None:
            return False
        self.carry_out(plan)
        return True

    def supply(self, klass: int, blocks: int) -> None:
        """Make room for ``klass`` to take ``blocks`` blocks (a direct call on its pool).

        Raises:
            OutOfBlocksError: the memory is not there; nothing changes.
        """
        if not self.make_room({klass: blocks}, {}):
            msg = (
                f"cannot take {blocks} blocks of page class {klass}: its free blocks, the "
                "free large pages and what other classes can give are not enough"
            )
            raise OutOfBlocksError(msg)

    # -- inspection ---------------------------------------------------------------------

    def check_invariants(self, holding: Callable[[int, int], tuple[int, bool]]) -> None:
        """Every large page in one place, its use counted, empty ones back in the common pool.

        ``holding(klass, page)``: the small pages of ``page`` class ``klass``
        has in use, and whether one is cached.

        Raises:
            AssertionError: naming the page.
        """
        free = set(self.free)
        if len(free) != len(self.free) or 0 in free:
            msg = "the common pool lists a large page twice, or the null blocks' page"
            raise AssertionError(msg)
        owned = [0] * len(self.pools)
        for page, owner in enumerate(self.owner):
            if (owner == FREE) != (page in free):
                msg = f"large page {page}: owner {owner} but in the common pool={page in free}"
                raise AssertionError(msg)
            if owner < 0:
                if self.in_use[page] or any(page in f for f in self.fully_free):
                    msg = f"large page {page} belongs to no class but counts blocks in use"
                    raise AssertionError(msg)
                continue
            owned[owner] += 1
            self._check_owned_page(page, owner, *holding(owner, page))
        if owned != self.owned:
            msg = f"large pages per class {owned}, counted {self.owned}"
            raise AssertionError(msg)

    def _check_owned_page(self, page: int, owner: int, in_use: int, cached: bool) -> None:
        if in_use != self.in_use[page]:
            msg = (
                f"large page {page} (class {owner}): {in_use} small pages in use, counted "
                f"{self.in_use[page]}"
            )
            raise AssertionError(msg)
        if not in_use and not cached:
            msg = f"large page {page} holds nothing but still belongs to class {owner}"
            raise AssertionError(msg)
        listed = page in self.fully_free[owner]
        if listed != (not in_use):
            msg = f"large page {page} (class {owner}): in use {in_use}, listed fully free {listed}"
            raise AssertionError(msg)
        for other, pages in enumerate(self.fully_free):
            if other != owner and page in pages:
                msg = f"large page {page} of class {owner} is listed fully free in class {other}"
                raise AssertionError(msg)


class _Budget:
    """What a plan has given and taken per class so far, and what it must not touch."""

    __slots__ = ("demand", "gained", "keep", "lost", "planned")

    def __init__(
        self,
        demand: Mapping[int, int],
        keep: Mapping[int, set[int]],
        gained: dict[int, int],
        lost: dict[int, int],
        planned: set[int],
    ) -> None:
        self.demand = demand
        self.keep = keep
        self.gained = gained
        self.lost = lost
        self.planned = planned

    def spare(self, klass: int, own_free: int) -> int:
        """Free blocks ``klass`` holds beyond its own part of the allocation."""
        return own_free + self.gained[klass] - self.lost[klass] - self.demand.get(klass, 0)


def _per_page(pages: list[int]) -> Iterable[tuple[int, int]]:
    """``(large page, how often it is listed)`` for ``pages``, in order of first listing.

    Many entries (a request's blocks, a page at a time) are counted in C; a
    few, in a loop (cheaper for them).
    """
    if len(pages) > _COUNT_IN_C:
        return Counter(pages).items()
    if len(pages) == 1:
        return ((pages[0], 1),)
    counts: dict[int, int] = {}
    for page in pages:
        counts[page] = counts.get(page, 0) + 1
    return counts.items()
