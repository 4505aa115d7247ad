"""How the block pool drives an eviction policy other than its built-in ones.

The pool talks to its free blocks through four calls (``pop_n``, ``push``,
``remove_blocks``, iteration) and reads ``num_free``; the built-in policies
(:class:`~kvcore._free_queue.LRUFreeQueue` and the credit-queue
:class:`~kvcore._eviction.policies.ValuePolicy`) answer them themselves, on
the pool's fast path. Any other policy sits behind a :class:`PolicyDriver`,
which turns them into protocol calls, counts the free blocks (so capacity checks never
depend on a policy) and makes them undoable.

Undo: while the pool runs a transaction, the driver holds its undo log. A
policy whose class sets ``exact_undo = True`` is handed the log (its
``undo_log`` attribute) and records its own exact undo. For any other policy
the driver records compensating calls: a take is undone by releasing the
blocks, a release by reviving them, a revival by releasing the block. After a
rollback the free set and every count are exactly as before; only the
policy's internal order (and what it learned from hits) may differ.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvcore.errors import OutOfBlocksError
from kvcore.eviction import EvictionPolicy

__all__ = ["PolicyDriver"]

UndoLog = list[tuple[Callable[..., None], Any]]


class PolicyDriver:
    """The pool's free-block interface over an :class:`~kvcore.eviction.EvictionPolicy`.

    Args:
        policy: The policy; it holds every block ``0 .. num_blocks - 1`` as
            free at the start.
        num_blocks: Blocks in the pool (all free at the start).
    """

    __slots__ = ("_exact", "_undo_log", "num_free", "policy")

    def __init__(self, policy: EvictionPolicy, num_blocks: int) -> None:
        self.policy = policy
        self._exact = getattr(type(policy), "exact_undo", False) is True
        self._undo_log: UndoLog | None = None
        #: Blocks the policy holds as free.
        self.num_free = num_blocks

    @property
    def _log(self) -> UndoLog | None:
        """The pool's undo log while a transaction runs (shared with exact policies)."""
        return self._undo_log

    @_log.setter
    def _log(self, log: UndoLog | None) -> None:
        self._undo_log = log
        if self._exact:
            self.policy.undo_log = log  # type: ignore[attr-defined]

    def pop_n(self, n: int) -> list[int]:
        """Take ``n`` free blocks, chosen by the policy.

        Raises:
            OutOfBlocksError: fewer than ``n`` blocks are free; nothing
                changes.
        """
        if n > self.num_free:
            msg = f"cannot take {n} blocks: only {self.num_free} are free"
            raise OutOfBlocksError(msg)
        blocks = self.policy.take(n)
        self.num_free -= n
        if self._undo_log is not None:
            self._undo_log.append((self._undo_take, (blocks,)))
        return blocks

    def push(self, blocks: Sequence[int]) -> None:
        """Blocks became free, first to evict first."""
        self.policy.release(blocks)
        self.num_free += len(blocks)
        if self._undo_log is not None:
            self._undo_log.append((self._undo_release, (blocks,)))

    def remove_blocks(self, blocks: Sequence[int]) -> None:
        """Cache hits took these free blocks back, in order."""
        revive = self.policy.revive
        for block in blocks:
            revive(block)
        self.num_free -= len(blocks)
        if self._undo_log is not None:
            self._undo_log.append((self._undo_revive, (blocks,)))

    def __iter__(self) -> Iterator[int]:
        """The free blocks in the policy's order, next to be taken first."""
        return iter(self.policy)

    def __len__(self) -> int:
        return self.num_free

    # -- undo (replayed newest first by the pool's rollback) ----------------------------

    def _undo_take(self, blocks: list[int]) -> None:
        if not self._exact:
            self.policy.release(blocks)
        self.num_free += len(blocks)

    def _undo_release(self, blocks: Sequence[int]) -> None:
        if not self._exact:
            revive = self.policy.revive
            for block in reversed(blocks):
                revive(block)
        self.num_free -= len(blocks)

    def _undo_revive(self, blocks: Sequence[int]) -> None:
        if not self._exact:
            self.policy.release(blocks)
        self.num_free += len(blocks)
