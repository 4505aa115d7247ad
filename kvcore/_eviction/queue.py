"""The free-queue interface: the one way the block pool reaches its free blocks.

The pool keeps reference counts, the prefix-cache map and the number of free
blocks. Which free block goes next is the free queue's alone. Every
implementation (the ``lru`` queue, the value policies, and the driver in
front of a third party's :class:`~kvcore.eviction.EvictionPolicy`) provides
exactly the methods below, and the pool calls nothing else: it never asks
what kind of queue it holds.

The pool's guarantees to a queue:

- ``take(n)`` only with ``0 < n <=`` the number of free blocks;
- ``release`` only with blocks that are not free, each once, never the null
  block;
- ``revive`` only with free blocks, each once, never the null block (a
  hit; the blocks may carry no hash where an engine touched blocks nobody
  allocated);
- ``withdraw`` only with free blocks, each once, never the null block, and
  only in a page class of a two-level pool: their large page leaves the
  class (they may carry a hash, which the pool drops right after);
- the notices (``cached``, ``hit``, ``forget``) after the pool's own change.

Undo: while the pool runs a transaction, ``journal`` is its undo log (else
``None``). A queue appends ``(callable, arguments)`` steps that, replayed
newest first, restore what it changed, so that a failed operation leaves the
queue as it was (the ``lru`` queue restores its exact order; a queue that
only restores which blocks are free says so in its documentation). A queue
that raises part-way through a call first undoes what that call changed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from kvcore._blocks import UndoLog

__all__ = ["FreeQueue"]


@runtime_checkable
class FreeQueue(Protocol):
    """The free blocks of a pool, in the order they are to be taken.

    Attributes:
        journal: The pool's undo log while a transaction runs, else ``None``
            (set by the pool; see the module documentation).
    """

    journal: UndoLog | None

    def take(self, n: int) -> list[int]:
        """Remove the ``n`` blocks due first and return them, first due first.

        A fresh queue hands out blocks ``0, 1, 2, ...`` in id order (never
        allocated blocks hold nothing; the pool takes block 0, the null block,
        first and keeps it).
        """
        ...

    def release(self, blocks: Sequence[int]) -> None:
        """``blocks`` became free, in the order the manager prefers them taken."""
        ...

    def revive(self, blocks: Sequence[int]) -> None:
        """A cache hit took these free blocks back, in order; they are no longer free."""
        ...

    def withdraw(self, blocks: Sequence[int]) -> None:
        """Free ``blocks`` leave for good without a hit (their large page leaves the class)."""
        ...

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """``blocks[start:stop]`` of a request's table in ``group`` entered the cache.

        The arguments are those of :meth:`kvcore.eviction.EvictionPolicy.cached`.
        """
        ...

    def hit(self, blocks: Sequence[int]) -> None:
        """A request adopted ``blocks`` from the cache (after any :meth:`revive`)."""
        ...

    def forget(self, blocks: Sequence[int] | None) -> None:
        """``blocks`` lost their hash but stay where they are; ``None``: every block."""
        ...

    def __iter__(self) -> Iterator[int]:
        """The free blocks, next to be taken first (for inspection and tests; O(free))."""
        ...
