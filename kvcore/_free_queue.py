"""The free-block queue: the one place that decides which free block goes next.

Free blocks wait in a queue; allocation takes them from the head. A free block
that still carries a prefix-cache hash can be revived by a cache hit, which
takes it out of the queue wherever it is. So the queue order *is* the eviction
order, and it decides which cached prefixes survive. Everything about that
order lives in the policy class below. It is the default eviction policy
(``"lru"``) and implements :class:`kvcore.eviction.EvictionPolicy`
(``take`` = :meth:`~LRUFreeQueue.pop_n`, ``release`` =
:meth:`~LRUFreeQueue.push`, ``revive`` = :meth:`~LRUFreeQueue.remove`; what
is cached or hit does not matter to it). The block pool drives this class
through its own fast path and every other policy through the protocol; a
test checks both give the same blocks.

The default policy reproduces the reference implementation exactly (block ids
and cache-hit lengths depend on it):

- the queue starts in block-id order;
- allocation takes from the head;
- freed blocks are appended at the tail in the order given (a request is freed
  last block first, so its tail is evicted before its head);
- a cache hit removes its block from wherever it is.

Undo: while the pool runs a transaction it hands the queue an undo log, and
every change appends how to reverse it. Undoing the entries newest first
restores the exact order (see :mod:`kvcore._undo`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from itertools import chain
from operator import length_hint
from typing import Any, ClassVar

from kvcore.errors import OutOfBlocksError
from kvcore.eviction import PoolInfo

__all__ = ["LRUFreeQueue", "count_down", "lru_policy"]


class LRUFreeQueue:
    """Least-recently-freed-first queue of free block ids, O(1) amortised per block.

    The queue is a Python list of block ids read from a head index: freeing
    appends a table's blocks with one list extend and allocation takes a
    slice, so neither links blocks one by one. A cache hit does not take its
    block out of the list: the block's entry becomes *stale* and is skipped
    when the head reaches it. ``_stale[block]`` counts a block's stale entries
    still ahead of the head; because the head always meets a block's entries
    oldest first, an entry is stale exactly when that count is above 0 (a free
    block's live entry is its newest). Stale entries are dropped when taken
    and, once there are more of them than blocks in the pool, by a
    compaction that sweeps the list a step per revive call (see
    :meth:`_compact`). A long hit whose blocks wait as one run
    of the list (a freed request's blocks do, last first) is cut out of it
    instead (see :meth:`revive_table`).

    Blocks that have never been allocated are not in the list: they form a
    *fresh* run ``[_fresh_start, num_blocks)`` that logically precedes it.
    Nothing is ever inserted ahead of them (frees go to the tail), so keeping
    them as a counter is exact and makes a pool of a million blocks cost a few
    list allocations to build. A never-allocated block taken out of the middle
    of the run (a pool's ``touch`` of a block nobody allocated) is remembered
    in ``_holes`` and skipped.

    Args:
        num_blocks: Block ids are ``0 .. num_blocks - 1``; all start free, in
            id order.
    """

    __slots__ = (
        "_compact_above",
        "_fresh_end",
        "_fresh_start",
        "_head",
        "_holes",
        "_log",
        "_num_stale",
        "_queue",
        "_stale",
        "_swept",
        "_swept_head",
        "num_free",
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

    def __init__(self, num_blocks: int) -> None:
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
        self._fresh_start = 0
        self._fresh_end = num_blocks
        # Never-allocated blocks inside [_fresh_start, _fresh_end) that are not
        # free (taken by remove()); _fresh_start itself is never one of them.
        self._holes: set[int] = set()
        # The pool's undo log while a transaction runs, else None.
        self._log: list[tuple[Callable[..., None], Any]] | None = None
        #: Number of blocks in the queue.
        self.num_free = num_blocks

    def pop_n(self, n: int) -> list[int]:
        """Remove and return the first ``n`` blocks of the queue, head first.

        Raises:
            OutOfBlocksError: fewer than ``n`` blocks are free; the queue is
                left unchanged.
        """
        if n > self.num_free:
            msg = f"cannot take {n} blocks: only {self.num_free} are free"
            raise OutOfBlocksError(msg)
        start = self._fresh_start
        if self._holes:
            out, consumed = self._pop_fresh_around_holes(n)
        else:
            consumed = None
            fresh = min(n, self._fresh_end - start)
            out = list(range(start, start + fresh)) if fresh else []
            self._fresh_start = start + fresh
        num_fresh = len(out)
        self.num_free -= n
        n -= num_fresh
        if n and self._swept is not None:
            n = self._take_swept(out, n)
        head = self._head
        dropped: list[int] | None = None
        if n:
            queue = self._queue
            end = head + n
            taken = queue[head:end]
            if self._num_stale and any(map(self._stale.__getitem__, taken)):
                end, dropped = self._take_past_stale(out, n)
            elif out:
                out += taken
            else:
                out = taken
            self._head = end
        if self._log is not None:
            self._log.append((self._undo_pop, (out, num_fresh, start, consumed, head, dropped)))
        if self._head > self.TRIM_AFTER and 2 * self._head > len(self._queue):
            self._trim()
        return out

    def _take_past_stale(self, out: list[int], n: int) -> tuple[int, list[int]]:
        """Append the next ``n`` live entries to ``out``.

        Returns:
            The new head, and the stale entries passed (their counts dropped).
        """
        queue = self._queue
        position, _, dropped = _take_live(queue, self._head, len(queue), n, self._stale, out)
        self._num_stale -= len(dropped)
        return position, dropped

    def _take_swept(self, out: list[int], n: int) -> int:
        """Append up to ``n`` live entries of the swept list to ``out``.

        Returns:
            How many of the ``n`` are still to take (from the list proper).
        """
        swept = self._swept
        assert swept is not None  # only called while a sweep runs
        old_head = self._swept_head
        end = len(swept)
        head, n, dropped = _take_live(swept, old_head, end, n, self._stale, out)
        self._num_stale -= len(dropped)
        self._swept_head = head
        if self._log is not None:
            self._log.append((self._undo_take_swept, (old_head, dropped)))
        if head > self.TRIM_AFTER and 2 * head > end:
            # A sweep that the frees keep ahead of may run long: its
            # consumed part is dropped as the list's is.
            self._swept = swept[head:]
            self._swept_head = 0
            if self._log is not None:
                self._log.append((self._undo_trim_swept, (swept, head)))
        return n

    def _trim(self) -> None:
        """Drop the consumed entries before the head (a new list; the old one serves the undo)."""
        old, head = self._queue, self._head
        self._queue = old[head:]
        self._head = 0
        if self._log is not None:
            self._log.append((self._undo_trim, (old, head)))

    def _pop_fresh_around_holes(self, n: int) -> tuple[list[int], list[int]]:
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

    def push(self, blocks: Sequence[int]) -> None:
        """Append ``blocks`` at the tail, in the given order (first evicted first)."""
        queue = self._queue
        if self._log is not None:
            self._log.append((self._undo_push, (len(queue), len(blocks))))
        queue += blocks
        self.num_free += len(blocks)

    def release_table(self, ref: list[int], table: Sequence[int]) -> int | None:
        """Drop one count in ``ref`` per block of ``table``, last first; queue the blocks at 0.

        The block pool's free of a manager's block table, fused into one pass:
        each block's count is decremented and the blocks reaching 0 are
        appended at the tail in one step, the table's tail first (so it is
        evicted before its head), as :meth:`push` of the released blocks in
        that order would. The caller guarantees no block appears twice and
        sets the null block's count high enough that it is never released.
        While a transaction runs, the undo restores the queue (the counts'
        undo is the caller's).

        Returns:
            ``None``, or a block whose count was already 0 (a double free):
            then every count is restored and nothing changed.
        """
        remaining = reversed(table)
        # The common case first: a block only this table holds (count 1).
        # The first block that is not (a shared head, a null block, an error)
        # hands the rest of the table to the general loop below.
        for first_other in remaining:
            if ref[first_other] != 1:
                break
            ref[first_other] = 0
        else:
            # push(table[::-1]), inlined: a window's one-block release is the
            # most frequent free of all.
            queue = self._queue
            if self._log is not None:
                self._log.append((self._undo_push, (len(queue), len(table))))
            queue += table[::-1]
            self.num_free += len(table)
            return None
        # The blocks after first_other in the table were released.
        num_done = len(table) - 1 - length_hint(remaining)
        released = list(table[len(table) - num_done :])
        released.reverse()
        double_freed = count_down(ref, chain((first_other,), remaining), released, table)
        if double_freed is not None:
            return double_freed
        if released:
            self.push(released)
        return None

    def remove(self, block: int) -> None:
        """Take ``block`` out of the queue, wherever it is (a cache hit revived it).

        The caller guarantees ``block`` is in the queue (it is free). A block
        never allocated is taken out of the fresh run.
        """
        self.remove_blocks((block,))

    def remove_blocks(self, blocks: Sequence[int]) -> None:
        """Take each of ``blocks`` out of the queue, in order (see :meth:`remove`)."""
        stale = self._stale
        fresh_start = self._fresh_start
        holes = self._holes
        staled: list[int] = []
        if self._log is not None:
            self._log.append((self._undo_stale, (staled,)))
        for block in blocks:
            # A hole is a block taken out of the fresh run: if it is free
            # again, it waits in the list like any freed block.
            if block >= fresh_start and block not in holes:
                self._remove_fresh(block)
                fresh_start = self._fresh_start
            else:
                stale[block] += 1
                staled.append(block)
        self._num_stale += len(staled)
        self.num_free -= len(blocks)
        if self._swept is not None or self._num_stale > self._compact_above:
            self._compact(len(blocks))

    def revive_table(self, ref: list[int], blocks: Sequence[int]) -> None:
        """Add one count in ``ref`` per block; take the blocks at 0 out of the queue.

        The block pool's adoption of a cache hit, fused into one pass (what
        :meth:`remove_blocks` of the blocks at 0, in order, then the
        increments would do). The caller guarantees no block of ``blocks``
        with a count of 0 appears twice and the null block's count is high
        enough that it is never taken for a free block.
        """
        num_blocks = len(blocks)
        if (
            num_blocks >= self.CUT_MIN_BLOCKS
            and self.CUT_SEARCH_PER_BLOCK * num_blocks >= len(self._queue) - self._head
            and not ref[blocks[0]]
            and not ref[blocks[-1]]
        ):
            # A long hit in a list not much longer than it: it may wait as
            # one run, last block first (as a freed request's blocks do).
            # Cutting the run out of the list is a C-level search and
            # memmove over at most CUT_SEARCH_PER_BLOCK entries a block,
            # cheaper than leaving a stale entry per block.
            run = self._find_run(ref, blocks)
            if run >= 0:
                removed = self._queue[run : run + num_blocks]
                del self._queue[run : run + num_blocks]
                if self._log is not None:
                    self._log.append((self._undo_cut, (run, removed)))
                for block in blocks:
                    ref[block] = 1
                self.num_free -= num_blocks
                return
        stale = self._stale
        fresh_start = self._fresh_start
        holes = self._holes
        staled: list[int] = []
        if self._log is not None:
            self._log.append((self._undo_stale, (staled,)))
        num_revived = 0
        for block in blocks:
            count = ref[block]
            if not count:
                num_revived += 1
                if block >= fresh_start and block not in holes:
                    self._remove_fresh(block)
                    fresh_start = self._fresh_start
                else:
                    stale[block] += 1
                    staled.append(block)
            ref[block] = count + 1
        self._num_stale += len(staled)
        self.num_free -= num_revived
        if self._swept is not None or self._num_stale > self._compact_above:
            self._compact(len(blocks))

    def _find_run(self, ref: list[int], blocks: Sequence[int]) -> int:
        """Where free ``blocks``, reversed, are consecutive entries of the list; else -1.

        An entry found may be a stale one of its block: cutting it instead
        of the live one leaves the block (revived, so all its entries are
        stale now) with as many entries as its stale count says.
        """
        queue = self._queue
        try:
            start = queue.index(blocks[-1], self._head)
        except ValueError:
            return -1
        if queue[start : start + len(blocks)] != blocks[::-1] or any(map(ref.__getitem__, blocks)):
            return -1
        return start

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
            if self._log is not None:
                self._log.append((self._undo_sweep_start, ()))
        swept = self._swept
        queue = self._queue
        head = self._head
        end = min(head + self.SWEEP_STEP + self.SWEEP_PER_BLOCK * num_revived, len(queue))
        length = len(swept)
        # Every live entry of the step is kept: n is the step's length.
        _, _, dropped = _take_live(queue, head, end, end - head, self._stale, swept)
        self._num_stale -= len(dropped)
        self._head = end
        if self._log is not None:
            self._log.append((self._undo_sweep, (head, length, dropped)))
        if end == len(queue):
            # Swept to the tail: the new list takes over.
            self._queue = swept
            self._head = self._swept_head
            self._swept = None
            self._swept_head = 0
            if self._log is not None:
                self._log.append((self._undo_sweep_end, (queue, end)))

    def _remove_fresh(self, block: int) -> None:
        """Take a never-allocated block out of the fresh run (``num_free`` is the caller's)."""
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
        if self._log is not None:
            self._log.append((self._undo_remove_fresh, (block, consumed)))

    # -- the eviction-policy protocol (kvcore.eviction) --------------------------------

    #: The queue records its own exact undo in the pool's log (:attr:`undo_log`).
    exact_undo: ClassVar[bool] = True

    @property
    def undo_log(self) -> list[tuple[Callable[..., None], Any]] | None:
        """The pool's undo log while a transaction runs, else ``None``."""
        return self._log

    @undo_log.setter
    def undo_log(self, log: list[tuple[Callable[..., None], Any]] | None) -> None:
        self._log = log

    def take(self, n: int) -> list[int]:
        """:meth:`pop_n`: the first ``n`` blocks of the queue."""
        return self.pop_n(n)

    def release(self, blocks: Sequence[int]) -> None:
        """:meth:`push`: freed blocks join the tail in the given order."""
        self.push(blocks)

    def revive(self, block: int) -> None:
        """:meth:`remove`: a hit took ``block`` out of the queue."""
        self.remove(block)

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
        """LRU ignores hits on blocks in use (a revived block is re-queued when freed)."""

    def forget(self, blocks: Sequence[int] | None) -> None:
        """A block that lost its hash keeps its place, as in the reference engine."""

    def __iter__(self) -> Iterator[int]:
        """Yield the free blocks from head (next to be taken) to tail."""
        holes = self._holes
        for block in range(self._fresh_start, self._fresh_end):
            if block not in holes:
                yield block
        stale = self._stale
        passed: dict[int, int] = {}
        swept = self._swept[self._swept_head :] if self._swept is not None else []
        for block in chain(swept, self._queue[self._head :]):
            count = passed.get(block, stale[block])
            if count:
                passed[block] = count - 1
            else:
                yield block

    def __len__(self) -> int:
        return self.num_free

    def was_ever_taken(self, block: int) -> bool:
        """Whether ``block`` has left the fresh run (been allocated at least once)."""
        return block < self._fresh_start or block in self._holes

    # -- undo (entries are replayed newest first by the pool's rollback) -----------------

    def _undo_pop(
        self,
        out: list[int],
        num_fresh: int,
        fresh_start: int,
        consumed: list[int] | None,
        head: int,
        dropped: list[int] | None,
    ) -> None:
        self._head = head
        if dropped:
            self._restore_stale(dropped)
        self._fresh_start = fresh_start
        if consumed:
            self._holes.update(consumed)
        self.num_free += len(out)

    def _restore_stale(self, dropped: list[int]) -> None:
        """Count again the stale entries a take or a sweep dropped (undo of ``_take_live``)."""
        stale = self._stale
        for block in dropped:
            stale[block] += 1
        self._num_stale += len(dropped)

    def _undo_trim(self, queue: list[int], head: int) -> None:
        self._queue = queue
        self._head = head

    def _undo_push(self, length: int, count: int) -> None:
        del self._queue[length:]
        self.num_free -= count

    def _undo_stale(self, staled: list[int]) -> None:
        stale = self._stale
        for block in staled:
            stale[block] -= 1
        self._num_stale -= len(staled)
        self.num_free += len(staled)

    def _undo_cut(self, start: int, removed: list[int]) -> None:
        self._queue[start:start] = removed
        self.num_free += len(removed)

    def _undo_take_swept(self, head: int, dropped: list[int]) -> None:
        self._restore_stale(dropped)
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
        del swept[length:]
        self._restore_stale(dropped)
        self._head = head

    def _undo_sweep_end(self, queue: list[int], head: int) -> None:
        self._swept = self._queue
        self._swept_head = self._head
        self._queue = queue
        self._head = head

    def _undo_remove_fresh(self, block: int, consumed: list[int]) -> None:
        if block == self._fresh_start - 1 - len(consumed):
            self._fresh_start = block
            self._holes.update(consumed)
        else:
            self._holes.discard(block)
        self.num_free += 1


def _take_live(
    entries: list[int], position: int, end: int, n: int, stale: list[int], out: list[int]
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


def count_down(
    ref: list[int], blocks: Iterable[int], released: list[int], table: Sequence[int]
) -> int | None:
    """Drop one count in ``ref`` per block of ``blocks``; append those reaching 0 to ``released``.

    ``table`` holds every block counted down in this free, ``blocks``
    included. A block whose count was already 0 is a double free: then one
    count is given back to each block of ``table``, so no count changed.

    Returns:
        ``None``, or the (last) block that was freed twice.
    """
    double_freed = None
    for block in blocks:
        count = ref[block] - 1
        ref[block] = count
        if not count:
            released.append(block)
        elif count < 0:
            double_freed = block
    if double_freed is not None:
        for block in table:
            ref[block] += 1
    return double_freed


def lru_policy(info: PoolInfo) -> LRUFreeQueue:
    """Least recently freed first, a request's tail before its head: vLLM 0.14's order."""
    return LRUFreeQueue(info.num_blocks)
