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

from collections.abc import Callable, Hashable, Iterator, Sequence
from itertools import chain
from typing import Any, ClassVar

from kvcore.errors import OutOfBlocksError
from kvcore.eviction import PoolInfo

__all__ = ["LRUFreeQueue", "lru_policy"]


class LRUFreeQueue:
    """Least-recently-freed-first queue of free block ids, O(1) per operation.

    A doubly linked list threaded through two Python lists indexed by block id
    (``_next``/``_prev``), with one sentinel slot at index ``num_blocks`` that
    is both head and tail. Blocks that have never been allocated are not
    linked: they form a *fresh* run ``[_fresh_start, num_blocks)`` that
    logically precedes the list. Nothing is ever inserted ahead of them (frees
    go to the tail), so keeping them as a counter is exact and makes a pool of
    a million blocks cost a few list allocations to build. A never-allocated
    block taken out of the middle of the run (a pool's ``touch`` of a block
    nobody allocated) is remembered in ``_holes`` and skipped.

    Args:
        num_blocks: Block ids are ``0 .. num_blocks - 1``; all start free, in
            id order.
    """

    __slots__ = (
        "_fresh_end",
        "_fresh_start",
        "_holes",
        "_log",
        "_next",
        "_prev",
        "_sentinel",
        "num_free",
    )

    def __init__(self, num_blocks: int) -> None:
        self._sentinel = num_blocks
        self._next: list[int] = [num_blocks] * (num_blocks + 1)
        self._prev: list[int] = [num_blocks] * (num_blocks + 1)
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
        if self._log is not None:
            self._log.append((self._undo_pop, (out, num_fresh, start, consumed)))
        n -= num_fresh
        if not n:
            return out
        nxt = self._next
        sentinel = self._sentinel
        block = nxt[sentinel]
        append = out.append
        for _ in range(n):
            append(block)
            block = nxt[block]
        nxt[sentinel] = block
        self._prev[block] = sentinel
        return out

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
        nxt = self._next
        prv = self._prev
        sentinel = self._sentinel
        tail = prv[sentinel]
        if self._log is not None:
            self._log.append((self._undo_push, (tail, len(blocks))))
        for block in blocks:
            nxt[tail] = block
            prv[block] = tail
            tail = block
        nxt[tail] = sentinel
        prv[sentinel] = tail
        self.num_free += len(blocks)

    def release_table(self, ref: list[int], table: Sequence[int]) -> int | None:
        """Drop one count in ``ref`` per block of ``table``, last first; queue the blocks at 0.

        The block pool's free of a manager's block table, fused into one pass:
        each block's count is decremented and, when it reaches 0, the block is
        linked at the tail right away, so the table's tail is queued (and
        evicted) before its head, as :meth:`push` of the released blocks in
        that order would. The caller guarantees no block appears twice and
        sets the null block's count high enough that it is never released.
        While a transaction runs, the undo restores the queue (the counts'
        undo is the caller's).

        Returns:
            ``None``, or a block whose count was already 0 (a double free):
            then every count and link is restored and nothing changed.
        """
        nxt = self._next
        prv = self._prev
        sentinel = self._sentinel
        tail = old_tail = prv[sentinel]
        remaining = reversed(table)
        # The common case first: a block only this table holds (count 1).
        # The first block that is not (a shared head, a null block, an error)
        # hands the rest of the table to the general loop below.
        for block in remaining:
            if ref[block] != 1:
                rest = chain((block,), remaining)
                break
            ref[block] = 0
            nxt[tail] = block
            prv[block] = tail
            tail = block
        else:
            rest = None
        kept = 0
        if rest is not None:
            double_freed = None
            for block in rest:
                count = ref[block] - 1
                ref[block] = count
                if not count:
                    nxt[tail] = block
                    prv[block] = tail
                    tail = block
                else:
                    kept += 1
                    if count < 0:
                        double_freed = block
            if double_freed is not None:
                for block in table:
                    ref[block] += 1
                nxt[old_tail] = sentinel
                return double_freed
        released = len(table) - kept
        if released:
            nxt[tail] = sentinel
            prv[sentinel] = tail
            self.num_free += released
            if self._log is not None:
                self._log.append((self._undo_push, (old_tail, released)))
        return None

    def remove(self, block: int) -> None:
        """Take ``block`` out of the queue, wherever it is (a cache hit revived it).

        The caller guarantees ``block`` is in the queue (its reference count
        is 0). A block never allocated is taken out of the fresh run.
        """
        self.remove_blocks((block,))

    def remove_blocks(self, blocks: Sequence[int]) -> None:
        """Take each of ``blocks`` out of the queue, in order (see :meth:`remove`)."""
        nxt = self._next
        prv = self._prev
        log = self._log
        # (block, before, after) of each unlinked block, flattened, for the undo.
        unlinked: list[int] | None = [] if log is not None else None
        if unlinked is not None:
            log.append((self._undo_remove_blocks, (unlinked,)))  # type: ignore[union-attr]
        fresh_start = self._fresh_start
        holes = self._holes
        for block in blocks:
            # A hole is a block taken out of the fresh run: if it is free
            # again, it is linked like any freed block.
            if block >= fresh_start and block not in holes:
                self._remove_fresh(block)
                fresh_start = self._fresh_start
                if unlinked is not None:
                    # Later unlinks must be undone before this one.
                    unlinked = []
                    log.append((self._undo_remove_blocks, (unlinked,)))  # type: ignore[union-attr]
                continue
            before = prv[block]
            after = nxt[block]
            nxt[before] = after
            prv[after] = before
            if unlinked is not None:
                unlinked += (block, before, after)
        self.num_free -= len(blocks)

    def revive_table(self, ref: list[int], blocks: Sequence[int]) -> None:
        """Add one count in ``ref`` per block; take the blocks at 0 out of the queue.

        The block pool's adoption of a cache hit, fused into one pass (what
        :meth:`remove_blocks` of the blocks at 0, in order, then the
        increments would do). The caller guarantees no block of ``blocks``
        with a count of 0 appears twice and the null block's count is high
        enough that it is never taken for a free block.
        """
        nxt = self._next
        prv = self._prev
        log = self._log
        num_blocks = len(blocks)
        if (
            num_blocks > 2
            and list(map(nxt.__getitem__, blocks[1:])) == list(blocks[:-1])
            and not max(map(ref.__getitem__, blocks))
        ):
            # The hit is one run of the queue, last block first: how a freed
            # request's blocks wait (see release_table). The blocks are linked
            # (a never-allocated block is no block's successor) and free:
            # unlink the run in one step.
            first = blocks[-1]
            last = blocks[0]
            before = prv[first]
            after = nxt[last]
            nxt[before] = after
            prv[after] = before
            if log is not None:
                log.append((self._undo_unlink_run, (first, last, before, after, num_blocks)))
            for block in blocks:
                ref[block] = 1
            self.num_free -= num_blocks
            return
        fresh_start = self._fresh_start
        holes = self._holes
        # (block, before, after) of each unlinked block, flattened, for the undo.
        unlinked: list[int] = []
        if log is not None:
            log.append((self._undo_remove_blocks, (unlinked,)))
        num_revived = 0
        for block in blocks:
            count = ref[block]
            if not count:
                num_revived += 1
                if block >= fresh_start and block not in holes:
                    self._remove_fresh(block)
                    fresh_start = self._fresh_start
                    if log is not None:
                        # Later unlinks must be undone before this one.
                        unlinked = []
                        log.append((self._undo_remove_blocks, (unlinked,)))
                else:
                    before = prv[block]
                    after = nxt[block]
                    nxt[before] = after
                    prv[after] = before
                    unlinked += (block, before, after)
            ref[block] = count + 1
        self.num_free -= num_revived

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
        nxt = self._next
        block = nxt[self._sentinel]
        while block != self._sentinel:
            yield block
            block = nxt[block]

    def __len__(self) -> int:
        return self.num_free

    def was_ever_taken(self, block: int) -> bool:
        """Whether ``block`` has left the fresh run (been allocated at least once)."""
        return block < self._fresh_start or block in self._holes

    # -- undo (entries are replayed newest first by the pool's rollback) -----------------

    def _undo_pop(
        self, out: list[int], num_fresh: int, fresh_start: int, consumed: list[int] | None
    ) -> None:
        linked = out[num_fresh:]
        if linked:
            nxt = self._next
            prv = self._prev
            sentinel = self._sentinel
            head = nxt[sentinel]
            previous = sentinel
            for block in linked:
                nxt[previous] = block
                prv[block] = previous
                previous = block
            nxt[previous] = head
            prv[head] = previous
        self._fresh_start = fresh_start
        if consumed:
            self._holes.update(consumed)
        self.num_free += len(out)

    def _undo_push(self, old_tail: int, count: int) -> None:
        sentinel = self._sentinel
        self._next[old_tail] = sentinel
        self._prev[sentinel] = old_tail
        self.num_free -= count

    def _undo_remove_blocks(self, unlinked: list[int]) -> None:
        nxt = self._next
        prv = self._prev
        for index in range(len(unlinked) - 3, -1, -3):
            block, before, after = unlinked[index : index + 3]
            nxt[before] = block
            prv[block] = before
            nxt[block] = after
            prv[after] = block
        self.num_free += len(unlinked) // 3

    def _undo_unlink_run(self, first: int, last: int, before: int, after: int, count: int) -> None:
        nxt = self._next
        prv = self._prev
        nxt[before] = first
        prv[first] = before
        nxt[last] = after
        prv[after] = last
        self.num_free += count

    def _undo_remove_fresh(self, block: int, consumed: list[int]) -> None:
        if block == self._fresh_start - 1 - len(consumed):
            self._fresh_start = block
            self._holes.update(consumed)
        else:
            self._holes.discard(block)
        self.num_free += 1


def lru_policy(info: PoolInfo) -> LRUFreeQueue:
    """Least recently freed first, a request's tail before its head: vLLM 0.14's order."""
    return LRUFreeQueue(info.num_blocks)
