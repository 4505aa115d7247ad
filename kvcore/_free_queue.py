"""The free-block queue: the one place that decides which free block goes next.

Free blocks wait in a queue; allocation takes them from the head. A free block
that still carries a prefix-cache hash can be revived by a cache hit, which
takes it out of the queue wherever it is. So the queue order *is* the eviction
order, and it decides which cached prefixes survive. Everything about that
order lives in the policy class below; the block pool calls only
:meth:`LRUFreeQueue.pop_n`, :meth:`~LRUFreeQueue.push`,
:meth:`~LRUFreeQueue.remove` and reads ``num_free``, so another eviction
policy can replace this one without touching the pool or any manager.

The default policy reproduces the reference implementation exactly (block ids
and cache-hit lengths depend on it):

- the queue starts in block-id order;
- allocation takes from the head;
- freed blocks are appended at the tail in the order given (a request is freed
  last block first, so its tail is evicted before its head);
- a cache hit removes its block from wherever it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvcore.errors import OutOfBlocksError

__all__ = ["LRUFreeQueue"]


class LRUFreeQueue:
    """Least-recently-freed-first queue of free block ids, O(1) per operation.

    A doubly linked list threaded through two Python lists indexed by block id
    (``_next``/``_prev``), with one sentinel slot at index ``num_blocks`` that
    is both head and tail. Blocks that have never been allocated are not
    linked: they form a *fresh* run ``[_fresh_start, num_blocks)`` that
    logically precedes the list. Nothing is ever inserted ahead of them (frees
    go to the tail, and a never-allocated block carries no hash, so no cache
    hit can remove it), so keeping them as a counter is exact and makes a
    pool of a million blocks cost a few list allocations to build.

    Args:
        num_blocks: Block ids are ``0 .. num_blocks - 1``; all start free, in
            id order.
    """

    __slots__ = ("_fresh_end", "_fresh_start", "_next", "_prev", "_sentinel", "num_free")

    def __init__(self, num_blocks: int) -> None:
        self._sentinel = num_blocks
        self._next: list[int] = [num_blocks] * (num_blocks + 1)
        self._prev: list[int] = [num_blocks] * (num_blocks + 1)
        self._fresh_start = 0
        self._fresh_end = num_blocks
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
        self.num_free -= n
        fresh = min(n, self._fresh_end - self._fresh_start)
        if fresh:
            start = self._fresh_start
            self._fresh_start = start + fresh
            if fresh == n:
                return list(range(start, start + fresh))
            out = list(range(start, start + fresh))
            n -= fresh
        else:
            out = []
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

    def push(self, blocks: Sequence[int]) -> None:
        """Append ``blocks`` at the tail, in the given order (first evicted first)."""
        nxt = self._next
        prv = self._prev
        sentinel = self._sentinel
        tail = prv[sentinel]
        for block in blocks:
            nxt[tail] = block
            prv[block] = tail
            tail = block
        nxt[tail] = sentinel
        prv[sentinel] = tail
        self.num_free += len(blocks)

    def remove(self, block: int) -> None:
        """Take ``block`` out of the queue, wherever it is (a cache hit revived it).

        The caller guarantees ``block`` is in the queue and has been allocated
        at least once (only such blocks carry a hash and can be hit).
        """
        nxt = self._next
        prv = self._prev
        before = prv[block]
        after = nxt[block]
        nxt[before] = after
        prv[after] = before
        self.num_free -= 1

    def __iter__(self) -> Iterator[int]:
        """Yield the free blocks from head (next to be taken) to tail."""
        yield from range(self._fresh_start, self._fresh_end)
        nxt = self._next
        block = nxt[self._sentinel]
        while block != self._sentinel:
            yield block
            block = nxt[block]

    def __len__(self) -> int:
        return self.num_free

    def was_ever_taken(self, block: int) -> bool:
        """Whether ``block`` has left the fresh run (been allocated at least once)."""
        return block < self._fresh_start
