"""The ``lru`` free queue: least recently freed first, the reference engine's order.

Free blocks wait in a queue; allocation takes them from the head. A free block
that still carries a prefix-cache hash can be revived by a cache hit, which
takes it out of the queue wherever it is. So the queue order *is* the eviction
order, and it decides which cached prefixes survive. This order reproduces
vLLM 0.14 exactly (block ids and cache-hit lengths depend on it):

- the queue starts in block-id order;
- allocation takes from the head;
- freed blocks are appended at the tail in the order given (a request is freed
  last block first, so its tail is evicted before its head);
- a cache hit removes its block from wherever it is.

What is cached or hit does not matter to this order, so the notices of the
free-queue interface (:mod:`kvcore._eviction.queue`) are no-ops here.

Undo: every change appends how to reverse it to :attr:`LRUFreeQueue.journal`
while the pool runs a transaction; replayed newest first, the steps restore
the exact order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterator, MutableSequence, Sequence
from typing import ClassVar

from kvcore._blocks import UndoLog
from kvcore.eviction import PoolInfo

__all__ = ["LRUFreeQueue", "lru_policy"]


class LRUFreeQueue:
    """Least-recently-freed-first queue of free block ids, O(1) amortised per block.

    The queue is a Python list of block ids read from a head index: freeing
    appends blocks with one list extend and allocation takes a slice, so
    neither links blocks one by one. A cache hit does not take its block out
    of the list: the block's entry becomes *stale* and is skipped when the
    head reaches it. ``_stale[block]`` counts a block's stale entries still
    ahead of the head; because the head always meets a block's entries oldest
    first, an entry is stale exactly when that count is above 0 (a free
    block's live entry is its newest). Stale entries are dropped when taken
    and, once there are more of them than blocks in the pool, by a compaction
    that sweeps the list a step per revive (see :meth:`_compact`). While a
    sweep runs, the live entries it has kept wait in a list of their own that
    comes first, and a block whose live entry is there counts its stale
    entries there apart (``_swept_stale``): the sweep must never take a
    later entry of the same block for it. A long hit
    whose blocks wait as one run of the list (a freed request's blocks do,
    last first) is cut out of it instead (see :meth:`_cut_run`).

    Blocks that have never been allocated are not in the list: they form a
    *fresh* run ``[_fresh_start, num_blocks)`` that logically precedes it.
    Nothing is ever inserted ahead of them (frees go to the tail), so keeping
    them as a counter is exact and makes a pool of a million blocks cost a few
    list allocations to build. A never-allocated block revived out of the
    middle of the run (a pool's ``touch`` of a block nobody allocated) is
    remembered in ``_holes`` and skipped.

    Args:
        num_blocks: Block ids are ``0 .. num_blocks - 1``; all start free, in
            id order (none, with ``free_at_start=False``).
        free_at_start: Whether the blocks start free.
    """

    __slots__ = (
        "_compact_above",
        "_fresh_end",
        "_fresh_start",
        "_head",
        "_holes",
        "_num_stale",
        "_queue",
        "_stale",
        "_swept",
        "_swept_head",
        "_swept_live",
        "_swept_stale",
        "journal",
    )

    #: Stale entries tolerated before a compaction, beyond one per block.
    COMPACTION_SLACK: ClassVar[int] = 1024
    #: Entries a compaction sweeps per revive call, plus SWEEP_PER_BLOCK...
    SWEEP_STEP: ClassVar[int] = 1024
    #: ...per revived block (more than the one stale entry a revive makes).
    SWEEP_PER_BLOCK: ClassVar[int] = 4
    #: Consumed entries before the head that trigger a trim of the list (when
    #: they are also the larger part of it).
    TRIM_AFTER: ClassVar[int] = 4096
    #: A revived hit at least this long that waits as one run is cut out of
    #: the list instead of leaving stale entries...
    CUT_MIN_BLOCKS: ClassVar[int] = 9
    #: ...when the list has at most this many entries per block of the hit
    #: (the search for the run is a C-level scan of the list).
    CUT_SEARCH_PER_BLOCK: ClassVar[int] = 8

    def __init__(self, num_blocks: int, *, free_at_start: bool = True) -> None:
        # Freed blocks, oldest first; entries before _head are consumed.
        self._queue: list[int] = []
        self._head = 0
        # Per block: its stale entries in _queue[_head:] (see the class doc).
        self._stale: list[int] = [0] * num_blocks
        self._num_stale = 0
        self._compact_above = num_blocks + self.COMPACTION_SLACK
        # While a compaction runs: the live entries it has swept out of
        # _queue[:_head], which come before _queue[_head:] (else None).
        self._swept: list[int] | None = None
        self._swept_head = 0
        # While a sweep runs: the blocks whose live entry is in the swept
        # list, and the stale entries each block has there.
        self._swept_live: set[int] = set()
        self._swept_stale: Counter[int] = Counter()
        self._fresh_start = 0 if free_at_start else num_blocks
        self._fresh_end = num_blocks
        # Never-allocated blocks inside [_fresh_start, _fresh_end) that are not
        # free (revived); _fresh_start itself is never one of them.
        self._holes: set[int] = set()
        self.journal: UndoLog | None = None

    # -- the free-queue interface ------------------------------------------------------

    def take(self, n: int) -> list[int]:
        """Remove and return the first ``n`` blocks of the queue, head first."""
        if self._fresh_start < self._fresh_end:
            out, n = self._take_fresh(n)
        else:
            out = []  # an aged pool: every block has been used once
        if n and self._swept is not None:
            n = self._take_swept(out, n)
        if n:
            self._take_listed(out, n)
        if self._head > self.TRIM_AFTER and 2 * self._head > len(self._queue):
            self._trim()
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Append ``blocks`` at the tail, in the given order (first evicted first)."""
        queue = self._queue
        if self.journal is not None:
            self.journal.append((self._undo_release, (len(queue),)))
        queue += blocks

    def revive(self, blocks: Sequence[int]) -> None:
        """Take each of the free ``blocks`` out of the queue, wherever it is."""
        if self._cut_run(blocks):
            return
        stale = self._stale
        holes = self._holes
        swept_live = self._swept_live
        staled: list[int] = []
        staled_swept: list[int] = []
        if self.journal is not None:
            self.journal.append((self._undo_stale, (staled, staled_swept)))
        for block in blocks:
            # A hole is a block revived out of the fresh run: if it is free
            # again, it waits in the list like any freed block.
            if block >= self._fresh_start and block not in holes:
                self._remove_fresh(block)
            elif block in swept_live:
                swept_live.remove(block)
                self._swept_stale[block] += 1
                staled_swept.append(block)
            else:
                stale[block] += 1
                staled.append(block)
        self._num_stale += len(staled) + len(staled_swept)
        if self._swept is not None or self._num_stale > self._compact_above:
            self._compact(len(blocks))

    def withdraw(self, blocks: Sequence[int]) -> None:
        """Free ``blocks`` leave for good: taken out of the queue as a hit takes them."""
        self.revive(blocks)

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """LRU ignores what is cached."""

    def hit(self, blocks: Sequence[int]) -> None:
        """LRU ignores hits (a revived block is queued again when it is freed)."""

    def forget(self, blocks: Sequence[int] | None) -> None:
        """A block that lost its hash keeps its place, as in the reference engine."""

    def __iter__(self) -> Iterator[int]:
        """Yield the free blocks from head (next to be taken) to tail."""
        holes = self._holes
        for block in range(self._fresh_start, self._fresh_end):
            if block not in holes:
                yield block
        # Walked by index, not sliced: a caller reading a few blocks from the
        # head (the two-level pool's planner) must not pay for a copy.
        regions: list[tuple[list[int], int, Sequence[int] | Counter[int]]] = [
            (self._queue, self._head, self._stale)
        ]
        if self._swept is not None:
            regions.insert(0, (self._swept, self._swept_head, self._swept_stale))
        for entries, start, stale in regions:
            passed: dict[int, int] = {}
            for index in range(start, len(entries)):
                block = entries[index]
                count = passed.get(block, stale[block])
                if count:
                    passed[block] = count - 1
                else:
                    yield block

    def was_ever_taken(self, block: int) -> bool:
        """Whether ``block`` has left the fresh run (been allocated at least once)."""
        return block < self._fresh_start or block in self._holes

    # -- taking ---------------------------------------------------------------------

    def _take_fresh(self, n: int) -> tuple[list[int], int]:
        """Take up to ``n`` never-allocated blocks; return them and how many are still due."""
        start = self._fresh_start
        consumed: list[int] = []
        if self._holes:
            out, consumed = self._take_fresh_around_holes(n)
        else:
            fresh = min(n, self._fresh_end - start)
            out = list(range(start, start + fresh)) if fresh else []
            self._fresh_start = start + fresh
        if (out or consumed) and self.journal is not None:
            self.journal.append((self._undo_take_fresh, (start, consumed)))
        return out, n - len(out)

    def _take_fresh_around_holes(self, n: int) -> tuple[list[int], list[int]]:
        """Take up to ``n`` fresh blocks, skipping (and forgetting) the holes passed."""
        holes = self._holes
        block, end = self._fresh_start, self._fresh_end
        out: list[int] = []
        consumed: list[int] = []
        while len(out) < n and block < end:
            if block in holes:
                consumed.append(block)
            else:
                out.append(block)
            block += 1
        while block in holes:
            consumed.append(block)
            block += 1
        holes.difference_update(consumed)
        self._fresh_start = block
        return out, consumed

    def _take_swept(self, out: list[int], n: int) -> int:
        """Append up to ``n`` live entries of the swept list to ``out``; return how many are due."""
        swept = self._swept
        assert swept is not None  # only called while a sweep runs
        old_head = self._swept_head
        end = len(swept)
        first = len(out)
        head, n, dropped = _take_live(swept, old_head, end, n, self._swept_stale, out)
        taken = out[first:]
        self._swept_live.difference_update(taken)
        self._num_stale -= len(dropped)
        self._swept_head = head
        if self.journal is not None:
            self.journal.append((self._undo_take_swept, (old_head, dropped, taken)))
        if head > self.TRIM_AFTER and 2 * head > end:
            # A sweep that the frees keep ahead of may run long: its
            # consumed part is dropped as the list's is.
            self._swept = swept[head:]
            self._swept_head = 0
            if self.journal is not None:
                self.journal.append((self._undo_trim_swept, (swept, head)))
        return n

    def _take_listed(self, out: list[int], n: int) -> None:
        """Append the next ``n`` live entries of the list to ``out`` (they exist)."""
        queue = self._queue
        head = self._head
        end = head + n
        taken = queue[head:end]
        dropped: list[int] = []
        if self._num_stale and any(map(self._stale.__getitem__, taken)):
            end, _, dropped = _take_live(queue, head, len(queue), n, self._stale, out)
            self._num_stale -= len(dropped)
        else:
            out += taken
        self._head = end
        if self.journal is not None:
            self.journal.append((self._undo_take_listed, (head, dropped)))

    def _trim(self) -> None:
        """Drop the consumed entries before the head (a new list; the old one serves the undo)."""
        old, head = self._queue, self._head
        self._queue = old[head:]
        self._head = 0
        if self.journal is not None:
            self.journal.append((self._undo_trim, (old, head)))

    # -- reviving -------------------------------------------------------------------

    def _cut_run(self, blocks: Sequence[int]) -> bool:
        """Cut ``blocks`` out of the list if they wait there as one run, last first.

        For a long hit in a list not much longer than it (as a freed
        request's blocks wait): the search and the cut are a C-level scan and
        memmove over at most :attr:`CUT_SEARCH_PER_BLOCK` entries a block,
        cheaper than leaving a stale entry per block.

        Returns:
            Whether the blocks were cut out (else nothing changed).
        """
        num_blocks = len(blocks)
        queue = self._queue
        if (
            num_blocks < self.CUT_MIN_BLOCKS
            or self.CUT_SEARCH_PER_BLOCK * num_blocks < len(queue) - self._head
            or blocks[-1] >= self._fresh_start
            or self._swept is not None  # a block's live entry may be in the swept list
        ):
            return False
        try:
            start = queue.index(blocks[-1], self._head)
        except ValueError:
            return False
        # An entry found may be a stale one of its block: cutting it instead
        # of the live one leaves the block (revived, so all its entries are
        # stale now) with as many entries as its stale count says.
        if queue[start : start + num_blocks] != blocks[::-1]:
            return False
        removed = queue[start : start + num_blocks]
        del queue[start : start + num_blocks]
        if self.journal is not None:
            self.journal.append((self._undo_cut, (start, removed)))
        return True

    def _remove_fresh(self, block: int) -> None:
        """Take a never-allocated block out of the fresh run."""
        start = self._fresh_start
        consumed: list[int] = []
        if block == start:
            start += 1
            holes = self._holes
            while start in holes:
                consumed.append(start)
                start += 1
            holes.difference_update(consumed)
            self._fresh_start = start
        else:
            self._holes.add(block)
        if self.journal is not None:
            self.journal.append((self._undo_remove_fresh, (block, consumed)))

    def _compact(self, num_revived: int) -> None:
        """Sweep the next entries of the list, dropping the stale ones; start a sweep if none runs.

        A compaction starts once more stale entries than blocks have gathered
        (hits on free blocks that no allocation has reached since) and
        sweeps :attr:`SWEEP_STEP` entries, plus :attr:`SWEEP_PER_BLOCK` per
        revived block, in each revive call after that, copying the live ones
        to a new list that then replaces the old one. So no call pays for the
        whole list, the sweep outpaces the stale entries being made, and the
        list stays within a small multiple of the pool.
        """
        if self._swept is None:
            self._swept = []
            self._swept_head = 0
            if self.journal is not None:
                self.journal.append((self._undo_sweep_start, ()))
        swept = self._swept
        queue = self._queue
        head = self._head
        end = min(head + self.SWEEP_STEP + self.SWEEP_PER_BLOCK * num_revived, len(queue))
        length = len(swept)
        # Every live entry of the step is kept: n is the step's length.
        _, _, dropped = _take_live(queue, head, end, end - head, self._stale, swept)
        self._swept_live.update(swept[length:])
        self._num_stale -= len(dropped)
        self._head = end
        if self.journal is not None:
            self.journal.append((self._undo_sweep, (head, length, dropped)))
        if end == len(queue):
            self._end_sweep(queue, end)

    def _end_sweep(self, queue: list[int], end: int) -> None:
        """Swept to the tail: the swept list becomes the list, its stale counts the counts.

        Every stale entry of the old list was passed, so its counts are all 0.
        """
        swept = self._swept
        assert swept is not None
        self._queue = swept
        self._head = self._swept_head
        self._swept = None
        self._swept_head = 0
        swept_stale, swept_live = self._swept_stale, self._swept_live
        stale = self._stale
        for block, count in swept_stale.items():
            stale[block] = count
        self._swept_stale = Counter()
        self._swept_live = set()
        if self.journal is not None:
            self.journal.append((self._undo_sweep_end, (queue, end, swept_stale, swept_live)))

    # -- undo (replayed newest first by the pool's rollback) -----------------------------

    def _undo_take_fresh(self, fresh_start: int, consumed: list[int]) -> None:
        self._fresh_start = fresh_start
        self._holes.update(consumed)

    def _undo_take_listed(self, head: int, dropped: list[int]) -> None:
        self._head = head
        self._restore_stale(dropped)

    def _restore_stale(self, dropped: list[int]) -> None:
        """Count again the stale entries a take or a sweep dropped (undo of ``_take_live``)."""
        stale = self._stale
        for block in dropped:
            stale[block] += 1
        self._num_stale += len(dropped)

    def _undo_trim(self, queue: list[int], head: int) -> None:
        self._queue = queue
        self._head = head

    def _undo_release(self, length: int) -> None:
        del self._queue[length:]

    def _undo_stale(self, staled: list[int], staled_swept: list[int]) -> None:
        stale = self._stale
        for block in staled:
            stale[block] -= 1
        for block in staled_swept:
            self._swept_stale[block] -= 1
            self._swept_live.add(block)
        self._num_stale -= len(staled) + len(staled_swept)

    def _undo_cut(self, start: int, removed: list[int]) -> None:
        self._queue[start:start] = removed

    def _undo_take_swept(self, head: int, dropped: list[int], taken: list[int]) -> None:
        for block in dropped:
            self._swept_stale[block] += 1
        self._num_stale += len(dropped)
        self._swept_live.update(taken)
        self._swept_head = head

    def _undo_trim_swept(self, swept: list[int], head: int) -> None:
        self._swept = swept
        self._swept_head = head

    def _undo_sweep_start(self) -> None:
        self._swept = None
        self._swept_head = 0

    def _undo_sweep(self, head: int, length: int, dropped: list[int]) -> None:
        swept = self._swept
        assert swept is not None  # undone newest first: the sweep runs
        self._swept_live.difference_update(swept[length:])
        del swept[length:]
        self._restore_stale(dropped)
        self._head = head

    def _undo_sweep_end(
        self, queue: list[int], head: int, swept_stale: Counter[int], swept_live: set[int]
    ) -> None:
        self._swept = self._queue
        self._swept_head = self._head
        self._queue = queue
        self._head = head
        stale = self._stale
        for block in swept_stale:
            stale[block] = 0
        self._swept_stale = swept_stale
        self._swept_live = swept_live

    def _undo_remove_fresh(self, block: int, consumed: list[int]) -> None:
        if block == self._fresh_start - 1 - len(consumed):
            self._fresh_start = block
            self._holes.update(consumed)
        else:
            self._holes.discard(block)


def _take_live(
    entries: list[int],
    position: int,
    end: int,
    n: int,
    stale: MutableSequence[int] | Counter[int],
    out: list[int],
) -> tuple[int, int, list[int]]:
    """Append up to ``n`` live entries of ``entries[position:end]`` to ``out``, in order.

    A stale entry passed is dropped: its block's stale count goes down by one.

    Returns:
        The position after the last entry read, how many of the ``n`` are
        left (the range ran out), and the stale entries passed.
    """
    dropped: list[int] = []
    append = out.append
    while n and position < end:
        block = entries[position]
        position += 1
        count = stale[block]
        if count:
            stale[block] = count - 1
            dropped.append(block)
        else:
            append(block)
            n -= 1
    return position, n, dropped


def lru_policy(info: PoolInfo) -> LRUFreeQueue:
    """Least recently freed first, a request's tail before its head: vLLM 0.14's order."""
    return LRUFreeQueue(info.num_blocks, free_at_start=info.free_at_start)
