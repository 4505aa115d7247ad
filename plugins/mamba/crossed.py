"""The prompt boundaries prefills have crossed: where a selective Mamba group sees reuse.

A selective group (``MambaSpec.prefill_states="selective"``) keeps a state
inside a prompt only where a later request is likely to resume: the prompt's
last boundary, and a boundary that an earlier prompt also crossed (two
prompts agree up to there, so a third may too). The second needs memory of
boundaries whose states were not kept: :class:`CrossedBoundaries`, a set of
prefix hashes bounded first in, first out.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

__all__ = ["CrossedBoundaries"]

#: Records an undo step: ``record(undo, *arguments)`` (``BlockPool.record``).
Record = Callable[..., None]


class CrossedBoundaries:
    """Prefix hashes of block boundaries crossed by prefills, the oldest forgotten first.

    Args:
        capacity: Most hashes remembered (at least 1).
    """

    __slots__ = ("_capacity", "_order")

    def __init__(self, capacity: int) -> None:
        if capacity.__class__ is not int or capacity < 1:
            msg = f"capacity must be an integer >= 1, got {capacity!r}"
            raise ValueError(msg)
        self._capacity = capacity
        # A dict keeps insertion order: the first key is the oldest.
        self._order: dict[Hashable, None] = {}

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._order

    def __len__(self) -> int:
        return len(self._order)

    def add(self, block_hashes: Sequence[Hashable], record: Record) -> None:
        """Remember ``block_hashes``, forgetting the oldest beyond the capacity.

        A hash already remembered keeps its place. The change is undone by
        the undo step given to ``record`` (a rollback of the transaction).
        """
        order = self._order
        added = [h for h in dict.fromkeys(block_hashes) if h not in order]
        if not added:
            return
        order.update(dict.fromkeys(added))
        evicted: list[Hashable] = []
        excess = len(order) - self._capacity
        if excess > 0:
            oldest = iter(order)
            evicted = [next(oldest) for _ in range(excess)]
            for block_hash in evicted:
                del order[block_hash]
            # Only hashes remembered before come back on an undo.
            new = set(added)
            evicted = [h for h in evicted if h not in new]
        record(self._undo_add, added, evicted)

    def _undo_add(self, added: list[Hashable], evicted: list[Hashable]) -> None:
        order = self._order
        for block_hash in added:
            order.pop(block_hash, None)
        if evicted:
            # The forgotten hashes were the oldest: they go back in front.
            restored: dict[Hashable, Any] = dict.fromkeys(evicted)
            restored.update(order)
            self._order = restored
