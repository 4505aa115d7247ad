"""When the free blocks of a page class were freed, and which cached one is the stalest.

A page class of a two-level pool weighs evicting from its own free queue
against taking another class's fully free large page by age: the clock of
the release that freed a block (:attr:`~kvcore._large_pages.LargePages.clock`).
Its eviction policy hands its free blocks out in its own order, which for a
value policy is not the order of their ages: its next victim may be a block
freed a moment ago that it judged worthless. What the class stands to lose
is then better told by its *stalest* cached free block. :class:`FreeAges`
keeps every block's age and the releases in order, so the stalest cached
free block is found at the head of a list, O(1) amortised: entries whose
block was taken, revived, released again or uncached since are skipped
(and dropped once they reach the head).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Container, Hashable, Iterator, Sequence
from itertools import repeat
from typing import Protocol

__all__ = ["FreeAges"]

#: Entries the list may hold beyond twice the blocks before it is rebuilt.
_SLACK = 4096


class BlockState(Protocol):
    """What :class:`FreeAges` reads of its class pool (read afresh: a reset replaces them)."""

    _ref: list[int]
    _hash: list[Hashable | None]

    def record(self, undo: Callable[..., None], *arguments: object) -> None:
        """Add an undo step to the running transaction."""
        ...


class FreeAges:
    """Each block's age, and the releases oldest first.

    Args:
        num_blocks: Blocks of the class.
        pool: The class pool: its reference counts and hashes are read,
            never changed, and its transaction records the undo steps.
    """

    __slots__ = ("_head", "_order", "_pool", "freed_at")

    def __init__(self, num_blocks: int, pool: BlockState) -> None:
        #: The clock when each block was last freed.
        self.freed_at = [0] * num_blocks
        self._pool = pool
        # (clock, block) per release, in release order (clocks never
        # decrease along it); those before _head are dropped.
        self._order: list[tuple[int, int]] = []
        self._head = 0

    def stamp(self, blocks: Sequence[int], clock: int) -> None:
        """``blocks`` were freed by the release numbered ``clock``."""
        freed_at = self.freed_at
        record = self._pool.record
        record(self._unstamp, blocks, list(map(freed_at.__getitem__, blocks)))
        deque(map(freed_at.__setitem__, blocks, repeat(clock)), maxlen=0)
        order = self._order
        record(self._truncate, order, len(order))
        order.extend(zip(repeat(clock), blocks))
        if len(order) - self._head > 2 * len(self.freed_at) + _SLACK:
            self._rebuild()

    def _unstamp(self, blocks: Sequence[int], ages: list[int]) -> None:
        deque(map(self.freed_at.__setitem__, blocks, ages), maxlen=0)

    def _truncate(self, order: list[tuple[int, int]], length: int) -> None:
        del order[length:]

    def _live(self) -> Callable[[int, int], bool]:
        """Whether an entry is a free block's latest release and the block still caches."""
        ref, hashes, freed_at = self._pool._ref, self._pool._hash, self.freed_at
        return lambda clock, block: (
            not ref[block] and hashes[block] is not None and freed_at[block] == clock
        )

    def _rebuild(self) -> None:
        self._pool.record(self._restore, self._order, self._head)
        live = self._live()
        self._order = [entry for entry in self._order[self._head :] if live(*entry)]
        self._head = 0

    def _restore(self, order: list[tuple[int, int]], head: int) -> None:
        self._order = order
        self._head = head

    def stalest(self, left_out: Container[int]) -> Iterator[int | None]:
        """A cursor: each ``next`` is the age of the stalest cached free block not in ``left_out``.

        ``left_out`` may grow between the calls (the blocks a plan has
        counted as taken so far), nothing else may change; ``None``: no such
        block. Entries dead for good at the head are dropped first.
        """
        order = self._order
        head = self._head
        live = self._live()
        while head < len(order) and not live(*order[head]):
            head += 1
        if head != self._head:
            self._pool.record(self._restore, order, self._head)
            self._head = head
        position = head
        while True:
            while position < len(order):
                clock, block = order[position]
                if block not in left_out and live(clock, block):
                    break
                position += 1
            yield order[position][0] if position < len(order) else None
