"""Eviction policies written against the public protocol, for tests of the pool's seam.

:class:`ReferenceLRU` is vLLM 0.14's free order written from its description
alone (a plain list: never-used blocks first in id order, freed blocks at the
tail, a hit takes its block out wherever it is), with an exact undo. It is an
independent check of the built-in ``lru`` queue, whose list-with-stale-entries
representation it does not share.

:class:`ThroughTheProtocol` puts a built-in free queue behind the public
protocol, so that the pool drives it the way it drives a third party's policy
(through the policy driver) instead of directly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Hashable, Iterator, Sequence
from typing import Any


class ReferenceLRU:
    """Least recently freed first, as a list; records its own exact undo."""

    exact_undo = True

    def __init__(self, num_blocks: int, *, free_at_start: bool = True) -> None:
        self.free = list(range(num_blocks)) if free_at_start else []
        self.undo_log: list[tuple[Any, tuple[Any, ...]]] | None = None

    def _record(self, undo: Any, *arguments: Any) -> None:
        if self.undo_log is not None:
            self.undo_log.append((undo, arguments))

    def take(self, n: int) -> list[int]:
        taken = self.free[:n]
        del self.free[:n]
        self._record(self._put_back_front, taken)
        return taken

    def release(self, blocks: Sequence[int]) -> None:
        self._record(self._truncate, len(self.free))
        self.free.extend(blocks)

    def revive(self, block: int) -> None:
        self._remove(block)

    def withdraw(self, block: int) -> None:
        self._remove(block)

    def _remove(self, block: int) -> None:
        position = self.free.index(block)
        del self.free[position]
        self._record(self._insert, position, block)

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        pass

    def hit(self, blocks: Sequence[int]) -> None:
        pass

    def forget(self, blocks: Sequence[int] | None) -> None:
        pass

    def __iter__(self) -> Iterator[int]:
        return iter(list(self.free))

    def _put_back_front(self, blocks: list[int]) -> None:
        self.free[:0] = blocks

    def _truncate(self, length: int) -> None:
        del self.free[length:]

    def _insert(self, position: int, block: int) -> None:
        self.free.insert(position, block)


class ContractCheckedLRU(ReferenceLRU):
    """:class:`ReferenceLRU` asserting what the protocol guarantees a policy, per call.

    Built by a factory (``ContractCheckedLRU``, given ``PoolInfo``). Keeps
    the calls that take free blocks out without a ``take`` in ``left``:
    ``("revive" | "withdraw", block, whether it carried a hash)``.
    """

    def __init__(self, info: Any) -> None:
        super().__init__(info.num_blocks, free_at_start=info.free_at_start)
        self.view = info.view
        self.free_at_start = info.free_at_start
        self.left: list[tuple[str, int, bool]] = []

    def take(self, n: int) -> list[int]:
        assert 0 < n <= len(self.free), f"take({n}) with {len(self.free)} free"
        return super().take(n)

    def release(self, blocks: Sequence[int]) -> None:
        assert 0 not in blocks, f"release of the null block: {blocks}"
        assert not set(blocks) & set(self.free), f"release of free blocks: {blocks}"
        super().release(blocks)

    def revive(self, block: int) -> None:
        hashed = self.view.block_hash(block) is not None
        assert block in self.free, f"revive of block {block}, which is not free"
        assert hashed, f"revive of block {block}, which carries no hash"
        self.left.append(("revive", block, hashed))
        super().revive(block)

    def withdraw(self, block: int) -> None:
        assert not self.free_at_start, "withdraw from a pool whose blocks start free"
        assert block, "withdraw of the null block"
        assert block in self.free, f"withdraw of block {block}, which is not free"
        self.left.append(("withdraw", block, self.view.block_hash(block) is not None))
        super().withdraw(block)


class ThroughTheProtocol:
    """A built-in free queue (``lru``, ``admit``, ...) behind the public protocol."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    @property
    def undo_log(self) -> Any:
        return self.queue.journal

    @undo_log.setter
    def undo_log(self, log: Any) -> None:
        self.queue.journal = log

    def take(self, n: int) -> list[int]:
        return self.queue.take(n)

    def release(self, blocks: Sequence[int]) -> None:
        self.queue.release(blocks)

    def revive(self, block: int) -> None:
        self.queue.revive([block])

    def withdraw(self, block: int) -> None:
        self.queue.withdraw([block])

    def cached(self, *arguments: Any) -> None:
        self.queue.cached(*arguments)

    def hit(self, blocks: Sequence[int]) -> None:
        self.queue.hit(blocks)

    def forget(self, blocks: Sequence[int] | None) -> None:
        self.queue.forget(blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self.queue)


class ExactThroughTheProtocol(ThroughTheProtocol):
    """:class:`ThroughTheProtocol` for a queue that records its own exact undo (``lru``)."""

    exact_undo = True


class _Abandon(Exception):
    """Raised at the end of a :func:`rolled_back` block."""


@contextlib.contextmanager
def rolled_back(pool: Any) -> Iterator[None]:
    """Run the ``with`` body in a transaction of ``pool``, then roll it back."""
    with contextlib.suppress(_Abandon), pool.transaction():
        yield
        raise _Abandon
