"""How the cluster index follows each engine: incarnations, order, gaps, refusals.

A :class:`Follower` takes every engine's batches as they arrive, validates
them (:class:`~kvcore.cluster._validate.EventChecker`), holds those ahead of
a gap, tells restarts from replays by the engines' incarnations, refuses an
id two live incarnations share, and queues the batches that are due, in
order, as :class:`~kvcore.cluster.ReadyBatch` es for the index to apply.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Final

from kvcore.cluster._backend import ReadyBatch
from kvcore.cluster._engine_state import EngineState, Held
from kvcore.cluster._errors import EngineConflictError, InvalidConfigError, InvalidEventError
from kvcore.cluster._results import IndexStats, SubmitResult
from kvcore.cluster._validate import EventChecker, Ops, check_engine_id, check_incarnation

__all__ = ["MARKER_BYTES", "Follower", "bare_reset", "ops_bytes"]

#: Bytes a bare reset (a batch reduced to "drop the engine's entries") is counted for.
MARKER_BYTES: Final = 64
# Sequence numbers stay below 2**53: Redis's scripts hold them as doubles.
_SEQ_END: Final = 2**53


def ops_bytes(ops: Ops) -> int:
    """What a held or queued batch is counted for: 64 bytes, 64 an operation, its hashes' sizes.

    A hash counts 8 bytes (an integer) or its length (a digest).
    """
    size = MARKER_BYTES * (1 + len(ops))
    for _, _, hashes in ops:
        if hashes:
            first = hashes[0]
            size += len(hashes) * (len(first) if type(first) is bytes else 8)
    return size


def bare_reset(batch: ReadyBatch) -> ReadyBatch:
    """``batch`` reduced to dropping its engine's entries (its own events are lost)."""
    return ReadyBatch(
        batch.engine, batch.seq, batch.ts, (), True, batch.incarnation, batch.max_blocks
    )


def _finite(value: object) -> bool:
    return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type]


class Follower:
    """Follows every engine's batches for one index and queues those that are due.

    Args:
        checker: Validates batches against the layout.
        stats: The index's counters (updated in place).
        clock: The index's clock.
        heartbeat_timeout_s: Silence after which an incarnation no longer
            claims an engine id.
        max_pending: Held batches per engine, and queued batches in all, at most.
        max_pending_bytes: The same bound in bytes.
        max_engine_blocks: The default (and largest) pool of an engine.
        forget: Drops an engine's entries in the backend.
        relieve: Called when the queue is over its bounds (the index applies
            it, or drops it with :meth:`drop_queue`).
    """

    def __init__(
        self,
        checker: EventChecker,
        stats: IndexStats,
        clock: Callable[[], float],
        *,
        heartbeat_timeout_s: float,
        max_pending: int,
        max_pending_bytes: int,
        max_engine_blocks: int,
        forget: Callable[[str], None],
        relieve: Callable[[], None],
    ) -> None:
        self.checker = checker
        self.stats = stats
        self.clock = clock
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_engine_blocks = max_engine_blocks
        self._forget = forget
        self._relieve = relieve
        self.states: dict[str, EngineState] = {}
        self.ready: list[ReadyBatch] = []
        self.ready_bytes = 0

    def submit(
        self,
        engine: str,
        seq: int,
        ts: float,
        events: Sequence[Any],
        *,
        incarnation: str | None = None,
        num_blocks: int | None = None,
    ) -> str:
        """Take one batch (see :meth:`ClusterIndex.submit`).

        Args:
            engine: The engine's id.
            seq: The batch's sequence number (consecutive per incarnation).
            ts: The batch's time, in seconds (the engine's clock).
            events: Its KV events, oldest first.
            incarnation: The publishing incarnation's id (kvcore's publisher
                sends one; ``None`` for one that does not).
            num_blocks: The engine's pool size, if it announces it (at most
                ``max_engine_blocks``); it bounds the engine's entries.

        Raises:
            InvalidConfigError: ``engine`` is not an id (1-200 printable
                ASCII characters without spaces), or ``seq`` not an integer
                in ``[0, 2**53)``; nothing changes.
            InvalidEventError: the batch is refused whole (the message names
                the event and field); the engine's entries are dropped and it
                is followed again from its next batch.
            EngineConflictError: another live incarnation publishes under
                ``engine``; the id is refused.
        """
        if type(engine) is not str or engine not in self.states:
            check_engine_id(engine)  # checked once per engine
        if type(seq) is not int or not 0 <= seq < _SEQ_END:
            msg = f"seq must be an integer >= 0 and below 2**53, got {seq!r}"
            raise InvalidConfigError(msg)
        try:
            inc = check_incarnation(incarnation)
        except InvalidEventError:
            self.stats.rejected += 1
            raise
        now = self.clock()
        state = self.states.get(engine)
        if state is None:
            state = self.states[engine] = EngineState(now, inc, self.max_engine_blocks)
        state.last_seen = now
        if state.conflict is not None:
            return self._submit_in_conflict(engine, state, inc, seq, ts, events, num_blocks, now)
        result = SubmitResult.APPLIED
        if not state.followed:
            state.incarnation = inc  # known from heartbeats only: nothing to replace
            state.followed = True
        if inc != state.incarnation:
            replaced_at = state.retired.get(inc)
            if replaced_at is not None and seq < replaced_at:
                self.stats.stale += 1
                return SubmitResult.STALE
            if replaced_at is not None:
                self._start_conflict(engine, state, inc, now)
            self.stats.restarts += 1
            state.replace(inc)
            result = SubmitResult.RESTARTED
        elif seq < state.expected:
            if inc or not (_finite(ts) and ts > state.last_ts):
                self.stats.duplicates += 1
                return SubmitResult.DUPLICATE
            # No incarnation, numbering started over at a later time: a restart.
            self.stats.restarts += 1
            state.drop_pending()
            state.expected = seq
            state.need_reset = True
            result = SubmitResult.RESTARTED
        state.batch_seen = now
        return self._take(engine, state, seq, ts, events, num_blocks, result)

    def _take(
        self,
        engine: str,
        state: EngineState,
        seq: int,
        ts: Any,
        events: Sequence[Any],
        num_blocks: int | None,
        result: str,
    ) -> str:
        """Validate a batch at or past ``state.expected`` and queue or hold it."""
        if seq > state.expected and seq in state.pending:
            self.stats.duplicates += 1
            return SubmitResult.DUPLICATE
        try:
            when = self.checker.check_ts(ts)
            cap = self._announced_cap(state, num_blocks)
            ops = self.checker.ops(events, cap)
        except InvalidEventError:
            self.stats.rejected += 1
            self._lost(engine, state, seq, ts if _finite(ts) else 0.0)
            raise
        state.cap = cap
        self.stats.events += len(events)
        held = Held(when, ops, ops_bytes(ops))
        if seq > state.expected:
            if self._hold(engine, state, seq, held):
                return result
            return SubmitResult.BUFFERED if result == SubmitResult.APPLIED else result
        self._release(engine, state, seq, held)
        return result

    def _hold(self, engine: str, state: EngineState, seq: int, held: Held) -> bool:
        """Hold ``held`` behind the gap; past the bounds, resync (``True``)."""
        state.hold(seq, held)
        if len(state.pending) > self.max_pending or state.pending_bytes > self.max_pending_bytes:
            self.resync(engine)
            return True
        return False

    def _announced_cap(self, state: EngineState, num_blocks: object) -> int:
        if num_blocks is None:
            return state.cap
        if type(num_blocks) is not int or not 1 <= num_blocks <= self.max_engine_blocks:
            msg = (
                f"num_blocks (the engine's announced pool) must be an integer from 1 to the "
                f"index's max_engine_blocks ({self.max_engine_blocks}), got {num_blocks!r:.40}"
            )
            raise InvalidEventError(msg)
        return num_blocks

    def _lost(self, engine: str, state: EngineState, seq: int, ts: float) -> None:
        """Batch ``seq`` was refused: treat it as lost (the entries are dropped when it is due)."""
        if seq < state.expected:
            return
        held = Held(float(ts), (), MARKER_BYTES, lost=True)
        if seq > state.expected:
            self._hold(engine, state, seq, held)
            return
        self._release(engine, state, seq, held)

    def _release(self, engine: str, state: EngineState, seq: int, held: Held) -> None:
        self._queue(engine, state, seq, held)
        while state.expected in state.pending:
            seq = state.expected
            self._queue(engine, state, seq, state.take(seq))

    def _queue(self, engine: str, state: EngineState, seq: int, held: Held) -> None:
        if held.lost:
            state.need_reset = True
        batch = ReadyBatch(
            engine, seq, held.ts, held.ops, state.need_reset, state.incarnation, state.cap
        )
        self.ready.append(batch)
        self.ready_bytes += held.size
        state.need_reset = False
        state.expected = seq + 1
        state.last_ts = max(state.last_ts, held.ts)
        if len(self.ready) > self.max_pending or self.ready_bytes > self.max_pending_bytes:
            self._relieve()

    def _start_conflict(self, engine: str, state: EngineState, inc: str, now: float) -> None:
        """A replaced incarnation publishes on: two engines share the id. Refuse it."""
        state.conflict = {state.incarnation: state.batch_seen, inc: now}
        state.drop_pending()
        self.discard(engine)
        self._forget(engine)
        self.stats.conflicts += 1
        raise EngineConflictError(self._conflict_message(engine, state))

    def _submit_in_conflict(
        self,
        engine: str,
        state: EngineState,
        inc: str,
        seq: int,
        ts: Any,
        events: Sequence[Any],
        num_blocks: int | None,
        now: float,
    ) -> str:
        seen = state.conflict
        assert seen is not None
        seen[inc] = now
        deadline = now - self.heartbeat_timeout_s
        if any(last >= deadline for other, last in seen.items() if other != inc):
            self.stats.conflicts += 1
            raise EngineConflictError(self._conflict_message(engine, state))
        # The others have been silent for the timeout: follow this one, onto
        # empty entries; should one of them publish again, that is a conflict.
        state.conflict = None
        state.retired = dict.fromkeys((other for other in seen if other != inc), 0)
        state.incarnation = inc
        state.expected = seq
        state.last_ts = float("-inf")
        state.need_reset = True
        state.batch_seen = now
        return self._take(engine, state, seq, ts, events, num_blocks, SubmitResult.APPLIED)

    def _conflict_message(self, engine: str, state: EngineState) -> str:
        incarnations = ", ".join(repr(i or "(none)") for i in sorted(state.conflict or ()))
        return (
            f"two engines publish as {engine!r} (incarnations {incarnations}): the id is "
            f"refused until all but one have been silent for {self.heartbeat_timeout_s:g} s; "
            "give every engine its own id"
        )

    def discard(self, engine: str) -> None:
        """Drop ``engine``'s queued batches."""
        self.ready = [batch for batch in self.ready if batch.engine != engine]
        self.ready_bytes = sum(ops_bytes(batch.ops) for batch in self.ready)

    def missing(self, engine: str) -> int | None:
        """The first sequence number of ``engine`` the index waits for, if it is held up.

        A subscriber asks the publisher's replay endpoint for batches from
        there; if the publisher no longer has them, call :meth:`resync`.
        """
        state = self.states.get(engine)
        if state is None or not state.pending:
            return None
        return state.expected

    def resync(self, engine: str) -> None:
        """Give up on ``engine``'s missing batches: drop its entries, continue after the gap.

        The held batches are then applied from the first one on, onto an empty
        entry set: what the lost batches stored is missing (an
        under-estimate), nothing removed in them lingers.
        """
        state = self.states.get(engine)
        if state is None:
            return
        self.stats.resyncs += 1
        state.need_reset = True
        if state.pending:
            first = min(state.pending)
            state.expected = first
            self._release(engine, state, first, state.take(first))

    def heartbeat(self, engine: str) -> None:
        """``engine`` is alive (see :meth:`ClusterIndex.heartbeat`)."""
        check_engine_id(engine)
        now = self.clock()
        state = self.states.get(engine)
        if state is None:
            self.states[engine] = EngineState(now, "", self.max_engine_blocks)
        else:
            state.last_seen = now

    def drop_queue(self) -> None:
        """Drop the queued batches: each engine concerned keeps one bare reset (resynced)."""
        last: dict[str, ReadyBatch] = {batch.engine: batch for batch in self.ready}
        self.stats.dropped += len(self.ready)
        self.stats.resyncs += len(last)
        self.ready = [bare_reset(batch) for batch in last.values()]
        self.ready_bytes = MARKER_BYTES * len(self.ready)

    def set_ready(self, ready: list[ReadyBatch]) -> None:
        """Replace the queue (what a flush left to send again)."""
        self.ready = ready
        self.ready_bytes = sum(ops_bytes(batch.ops) for batch in ready)

    def expire(self, deadline: float) -> list[str]:
        """Stop following the engines last heard from before ``deadline``; their ids."""
        gone = [e for e, s in self.states.items() if s.last_seen < deadline]
        for engine in gone:
            del self.states[engine]
            self.discard(engine)
        return gone

    def live(self) -> list[str]:
        """Followed engines, in id order, but those two incarnations claim."""
        return sorted(e for e, s in self.states.items() if s.conflict is None)
