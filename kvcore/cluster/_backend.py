"""What the cluster index hands its backends: ordered batches of block operations."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Final, Protocol

import attrs

__all__ = [
    "CLEAR",
    "REMOVE",
    "RETIRED_KEPT",
    "STORE",
    "ApplyResult",
    "Backend",
    "NotFetchedError",
    "ReadyBatch",
    "Snapshot",
    "sequence_decision",
]

#: Operation codes of :attr:`ReadyBatch.ops`.
STORE: Final = 1
REMOVE: Final = -1
CLEAR: Final = 0

#: Retired incarnations a backend remembers per engine (their late batches are stale).
RETIRED_KEPT: Final = 8


@attrs.frozen
class ReadyBatch:
    """One engine's event batch, in order, reduced to block operations.

    The index has validated it: groups exist, hashes are of the layout's
    type (integers within 64 bits, or digests of one width), and it stores
    no more blocks than ``max_blocks``.

    Attributes:
        engine: The publishing engine's id.
        seq: Its sequence number (consecutive per engine and incarnation).
        ts: Its timestamp, in seconds.
        ops: ``(op, group, block_hashes)`` in event order; ``op`` is
            ``STORE`` (1), ``REMOVE`` (-1) or ``CLEAR`` (0, group and hashes
            unused).
        reset: Forget the engine's entries before applying (events were
            lost, or an engine without incarnations restarted).
        incarnation: The engine incarnation that published it (``""`` for a
            publisher that announces none, such as vLLM's).
        max_blocks: The most block entries the engine may hold once the
            batch is applied (its pool); ``None``: no bound.
    """

    engine: str
    seq: int
    ts: float
    ops: tuple[tuple[int, int, Sequence[Hashable]], ...]
    reset: bool = False
    incarnation: str = ""
    max_blocks: int | None = None


class ApplyResult:
    """What a backend did with one :class:`ReadyBatch` (string constants).

    Only ``APPLIED`` changes anything: every other result leaves the
    engine's entries as they were.
    """

    #: Applied.
    APPLIED = "applied"
    #: Its sequence number was applied already (a replay, another router, a retry).
    DUPLICATE = "duplicate"
    #: It comes from an incarnation the engine has since replaced.
    STALE = "stale"
    #: Applied, it would leave the engine more entries than ``max_blocks``.
    OVER_CAPACITY = "over_capacity"
    #: The engine's stored entries are unusable (a Redis key of another type).
    BROKEN = "broken"
    #: Not the next sequence number after the last applied one (an earlier
    #: batch was not applied, or another router reset the engine meanwhile).
    OUT_OF_ORDER = "out_of_order"
    #: Its operations are malformed (a group out of range, hashes of no
    #: width); the index never sends such a batch.
    INVALID = "invalid"


def sequence_decision(
    batch: ReadyBatch, last_seq: int | None, incarnation: str, retired: Sequence[str]
) -> tuple[str | None, bool]:
    """Whether a backend applies ``batch``, given the engine's stored state.

    Args:
        batch: The batch.
        last_seq: The engine's last applied sequence number (``None``: the
            backend holds nothing for it).
        incarnation: The incarnation that applied it.
        retired: Incarnations the engine has replaced.

    Returns:
        ``(result, reset)``: ``result`` is an :class:`ApplyResult` constant
        when the batch is not to be applied, else ``None``; ``reset`` says
        to drop the engine's entries first. A new incarnation starts from
        empty entries; a reset batch of the same incarnation whose sequence
        number was applied already is a duplicate (a retry, or another router
        got there first), except for publishers without incarnations, whose
        numbering starts over when they restart.
    """
    if last_seq is None:
        return None, True
    if batch.incarnation != incarnation:
        if batch.incarnation in retired:
            return ApplyResult.STALE, False
        return None, True
    if batch.seq <= last_seq:
        if batch.reset and not batch.incarnation:
            return None, True
        return ApplyResult.DUPLICATE, False
    if batch.seq != last_seq + 1 and not batch.reset:
        return ApplyResult.OUT_OF_ORDER, False
    return None, batch.reset


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

    def apply(self, batches: Sequence[ReadyBatch]) -> list[str]:
        """Apply batches in order, each whole or not at all; one :class:`ApplyResult` each.

        A batch is applied when its sequence number and incarnation say so
        (the next number of the engine's incarnation, a reset, or a new
        incarnation; see :class:`ApplyResult`) and it leaves the engine
        within ``max_blocks``; the engine's sequence number, incarnation and
        entries change together.

        Raises:
            IndexUnavailableError: the backend failed; any of the batches
                may have been applied, and sending them again is safe
                (those are duplicates then).
        """
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
