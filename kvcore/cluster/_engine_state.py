"""What the cluster index knows of one engine: its incarnation, its order, its held batches."""

from __future__ import annotations

from typing import Final

from kvcore.cluster._validate import Ops

__all__ = ["RETIRED_FOLLOWED", "EngineState", "Held"]

#: Replaced incarnations an index remembers per engine.
RETIRED_FOLLOWED: Final = 8


class Held:
    """A validated batch waiting for the ones before it (or a refused one, ``lost``)."""

    __slots__ = ("lost", "ops", "size", "ts")

    def __init__(self, ts: float, ops: Ops, size: int, *, lost: bool = False) -> None:
        self.ts = ts
        self.ops = ops
        self.size = size
        self.lost = lost


class EngineState:
    """One engine as the index follows it.

    Attributes:
        incarnation: The incarnation followed (``""``: the publisher
            announces none).
        expected: The next sequence number to apply.
        last_ts: The latest batch time seen from this incarnation.
        last_seen: When the engine was last heard from (a batch or a
            heartbeat), on the index's clock.
        batch_seen: When the followed incarnation last sent a batch.
        pending: Batches ahead of a gap, by sequence number.
        pending_bytes: Their size.
        need_reset: The next batch applied drops the engine's entries first.
        retired: Replaced incarnations → the sequence number each had reached
            (a later batch of theirs is stale, one past it means the
            replaced engine is still alive).
        conflict: While two incarnations claim the id: each one's last batch
            time; ``None`` otherwise.
        cap: The most entries the engine may hold (its pool).
        followed: A batch has been taken (until then, heartbeats only, the
            first batch's incarnation is adopted, not a restart).
    """

    __slots__ = (
        "batch_seen",
        "cap",
        "conflict",
        "expected",
        "followed",
        "incarnation",
        "last_seen",
        "last_ts",
        "need_reset",
        "pending",
        "pending_bytes",
        "retired",
    )

    def __init__(self, now: float, incarnation: str, cap: int) -> None:
        self.incarnation = incarnation
        self.expected = 0
        self.last_ts = float("-inf")
        self.last_seen = now
        self.batch_seen = now
        self.pending: dict[int, Held] = {}
        self.pending_bytes = 0
        self.need_reset = False
        self.retired: dict[str, int] = {}
        self.conflict: dict[str, float] | None = None
        self.cap = cap
        self.followed = False

    def hold(self, seq: int, held: Held) -> None:
        """Keep ``held`` until the batches before ``seq`` arrive."""
        previous = self.pending.get(seq)
        if previous is not None:
            self.pending_bytes -= previous.size
        self.pending[seq] = held
        self.pending_bytes += held.size

    def take(self, seq: int) -> Held:
        """Remove and return the held batch ``seq``."""
        held = self.pending.pop(seq)
        self.pending_bytes -= held.size
        return held

    def drop_pending(self) -> None:
        """Forget every held batch."""
        self.pending.clear()
        self.pending_bytes = 0

    def replace(self, incarnation: str) -> None:
        """Follow a new incarnation from its sequence number 0, onto empty entries."""
        self.retired[self.incarnation] = self.expected
        while len(self.retired) > RETIRED_FOLLOWED:
            del self.retired[next(iter(self.retired))]
        self.retired.pop(incarnation, None)
        self.incarnation = incarnation
        self.expected = 0
        self.last_ts = float("-inf")
        self.drop_pending()
        self.need_reset = True
