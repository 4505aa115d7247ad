"""The free queue in front of a third party's eviction policy.

A policy written against the public protocol (:class:`kvcore.eviction.EvictionPolicy`)
revives one block per call and may or may not record its own undo. The
:class:`PolicyDriver` gives it the free-queue interface the pool drives
(:mod:`kvcore._eviction.queue`) and makes every change undoable.

Undo: a policy whose class sets ``exact_undo = True`` is handed the pool's
journal (its ``undo_log`` attribute) and records its own exact undo. For any
other policy the driver records compensating calls: a take is undone by
releasing the blocks, a release by reviving them, a revival by releasing the
block, a ``cached`` by a ``forget``. After a rollback the free set is exactly
as before; only the policy's internal order (and what it learned from hits)
may differ.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence

from kvcore._blocks import UndoLog
from kvcore.eviction import EvictionPolicy

__all__ = ["PolicyDriver"]


class PolicyDriver:
    """The free-queue interface over an :class:`~kvcore.eviction.EvictionPolicy`.

    Args:
        policy: The policy; it holds every block ``0 .. num_blocks - 1`` as
            free at the start.
    """

    __slots__ = ("_exact", "_journal", "policy")

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self._exact = getattr(type(policy), "exact_undo", False) is True
        self._journal: UndoLog | None = None

    @property
    def journal(self) -> UndoLog | None:
        """The pool's undo log while a transaction runs (shared with an exact policy)."""
        return self._journal

    @journal.setter
    def journal(self, journal: UndoLog | None) -> None:
        self._journal = journal
        if self._exact:
            self.policy.undo_log = journal  # type: ignore[attr-defined]

    def take(self, n: int) -> list[int]:
        """The ``n`` blocks the policy hands out."""
        blocks = self.policy.take(n)
        if self._journal is not None and not self._exact:
            self._journal.append((self.policy.release, (blocks,)))
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """The policy learns that ``blocks`` became free (a list of its own to keep)."""
        self.policy.release(list(blocks))
        if self._journal is not None and not self._exact:
            self._journal.append((self._revive_each, (blocks[::-1],)))

    def revive(self, blocks: Sequence[int]) -> None:
        """The policy learns, block by block, that a hit took ``blocks`` back.

        If the policy raises part-way, the blocks it already revived are
        released again before the error goes on, so the free
        set is as it was.
        """
        self._each(self.policy.revive, blocks)

    def withdraw(self, blocks: Sequence[int]) -> None:
        """The policy learns, block by block, that ``blocks`` left for good (no hit).

        Undone, and undone on a raise part-way, as :meth:`revive` is.
        """
        self._each(self.policy.withdraw, blocks)

    def _each(self, call: Callable[[int], None], blocks: Sequence[int]) -> None:
        """``call`` each of the free ``blocks``, which leave the free set (see :meth:`revive`)."""
        done = 0
        try:
            for block in blocks:
                call(block)
                done += 1
        except BaseException:
            if done and not self._exact:
                self.policy.release(blocks[:done])
            raise
        if self._journal is not None and not self._exact:
            self._journal.append((self.policy.release, (blocks,)))

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """Tell the policy what was cached (undone by ``forget`` of those blocks)."""
        self.policy.cached(group, blocks, start, stop, block_hashes, num_prompt_tokens)
        if self._journal is not None and not self._exact:
            cached = [block for block in blocks[start:stop] if block]
            self._journal.append((self.policy.forget, (cached,)))

    def hit(self, blocks: Sequence[int]) -> None:
        """Tell the policy about an adopted hit (not undone: a policy cannot unlearn it)."""
        self.policy.hit(blocks)

    def forget(self, blocks: Sequence[int] | None) -> None:
        """Tell the policy that blocks lost their hash (not undone)."""
        self.policy.forget(blocks)

    def __iter__(self) -> Iterator[int]:
        """The free blocks in the policy's order, next to be taken first."""
        return iter(self.policy)

    def _revive_each(self, blocks: Sequence[int]) -> None:
        revive = self.policy.revive
        for block in blocks:
            revive(block)
