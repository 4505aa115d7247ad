"""What the cluster index hands its backends: ordered batches of block operations."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Final, Protocol

import attrs

__all__ = ["CLEAR", "REMOVE", "STORE", "Backend", "NotFetchedError", "ReadyBatch", "Snapshot"]

#: Operation codes of :attr:`ReadyBatch.ops`.
STORE: Final = 1
REMOVE: Final = -1
CLEAR: Final = 0


@attrs.frozen
class ReadyBatch:
    """One engine's event batch, in order, reduced to block operations.

    Attributes:
        engine: The publishing engine's id.
        seq: Its sequence number (consecutive per engine).
        ts: Its timestamp, in seconds.
        ops: ``(op, group, block_hashes)`` in event order; ``op`` is
            ``STORE`` (1), ``REMOVE`` (-1) or ``CLEAR`` (0, group and hashes
            unused).
        reset: Forget the engine's entries before applying (it restarted, or
            events were lost), whatever sequence number the backend has.
    """

    engine: str
    seq: int
    ts: float
    ops: tuple[tuple[int, int, Sequence[Hashable]], ...]
    reset: bool = False


class NotFetchedError(Exception):
    """A snapshot was asked about a block it has not fetched yet (see :class:`Snapshot`)."""


class Snapshot:
    """Which engines hold which block hashes of one request, per group.

    ``holds(position, group, block_hash)``: whether the engine at
    ``position`` of the list the snapshot was taken for caches
    ``block_hash`` in ``group`` (a hash of the request at the group's block
    size; any other hash is not held).

    A remote backend may fetch only the first blocks of every engine at
    first; ``holds`` then raises :class:`NotFetchedError` for a later block,
    and the caller asks :meth:`complete` for the rest of those engines' blocks
    (one more round trip) and searches again.
    """

    __slots__ = ("_complete", "holds")

    def __init__(
        self,
        holds: Callable[[int, int, Hashable], bool],
        complete: Callable[[Sequence[int]], None] | None = None,
    ) -> None:
        self.holds = holds
        self._complete = complete

    def complete(self, positions: Sequence[int]) -> None:
        """Fetch every block of the engines at ``positions`` (no-op when all are fetched)."""
        if self._complete is not None:
            self._complete(positions)


class Backend(Protocol):
    """Where the cluster index keeps block membership (in-process, or Redis)."""

    name: str

    def apply(self, batches: Sequence[ReadyBatch]) -> list[bool]:
        """Apply batches in order; ``False`` for one whose sequence number was applied already."""
        ...

    def forget(self, engine: str) -> None:
        """Drop every entry and the sequence number of ``engine``."""
        ...

    def heartbeat(self, engines: Sequence[str]) -> None:
        """Keep the entries of live ``engines`` from expiring."""
        ...

    def engines(self) -> list[str]:
        """Engines the backend has entries or a sequence number for."""
        ...

    def snapshot(
        self, engines: Sequence[str], group_hashes: Sequence[Sequence[Hashable]]
    ) -> Snapshot:
        """Membership of the request's hashes (per group) for ``engines``."""
        ...

    def cached_blocks(self, engine: str) -> int:
        """Block entries held for ``engine``."""
        ...

    def last_seq(self, engine: str) -> int | None:
        """The last sequence number applied for ``engine``."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
