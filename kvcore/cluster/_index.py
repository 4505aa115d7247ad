"""The cluster prefix index: which engine holds which blocks, fed by their KV events."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import attrs

from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore.cluster._backend import CLEAR, REMOVE, STORE, Backend, NotFetchedError, ReadyBatch
from kvcore.cluster._embedded import EmbeddedBackend
from kvcore.cluster._errors import IndexUnavailableError, InvalidConfigError
from kvcore.cluster._hit_rule import EngineView, FleetLayout, longest_hit

__all__ = ["ClusterIndex", "IndexStats", "SubmitResult"]

# Wall seconds between refreshes of heartbeated engines' expiry in the backend.
_KEEPALIVE_S = 1.0


class SubmitResult:
    """What :meth:`ClusterIndex.submit` did with a batch (string constants)."""

    #: The batch was in order and is queued for the backend, with any held
    #: batches it unblocked.
    APPLIED = "applied"
    #: The batch is ahead of a gap and held until the missing batches arrive.
    BUFFERED = "buffered"
    #: The batch was seen already (a replay) and is ignored.
    DUPLICATE = "duplicate"
    #: An older sequence number with a newer time, so the engine restarted.
    RESTARTED = "restarted"


@attrs.define
class IndexStats:
    """Counters of one index since it was made.

    Attributes:
        batches: Batches applied by the backend.
        events: KV events in those batches.
        block_ops: Block stores and removals in those batches.
        duplicates: Batches ignored as already seen.
        restarts: Engine restarts detected (sequence numbers starting over).
        resyncs: Times an engine's entries were dropped because events were lost.
        expired: Engines dropped for missing heartbeats.
        apply_s: Wall time spent applying batches in the backend, in seconds.
        queries: Hit queries answered.
        query_s: Wall time spent answering them, in seconds.
        unavailable: Backend calls that failed (Redis down).
    """

    batches: int = 0
    events: int = 0
    block_ops: int = 0
    duplicates: int = 0
    restarts: int = 0
    resyncs: int = 0
    expired: int = 0
    apply_s: float = 0.0
    queries: int = 0
    query_s: float = 0.0
    unavailable: int = 0


class _EngineState:
    __slots__ = ("expected", "last_seen", "last_ts", "need_reset", "pending")

    def __init__(self, now: float) -> None:
        self.expected = 0
        self.last_ts = float("-inf")
        self.last_seen = now
        self.pending: dict[int, tuple[float, list[KVCacheEvent]]] = {}
        self.need_reset = False


def _ops(events: Sequence[KVCacheEvent]) -> tuple[tuple[int, int, Sequence[Hashable]], ...]:
    ops: list[tuple[int, int, Sequence[Hashable]]] = []
    for event in events:
        if isinstance(event, BlockStored):
            ops.append((STORE, event.group_idx, event.block_hashes))
        elif isinstance(event, BlockRemoved):
            ops.append((REMOVE, event.group_idx, event.block_hashes))
        elif isinstance(event, AllBlocksCleared):
            ops.append((CLEAR, 0, ()))
    return tuple(ops)


class ClusterIndex:
    """Block hash → engines holding it, per KV cache group, fed by the engines' KV events.

    Answers the router's question, *how many tokens of this request would
    engine E hit?*, with each group's own hit rule (see
    :class:`FleetLayout`): the answer equals the engine's own
    ``get_computed_blocks`` for the blocks the index has seen.

    Event batches carry per-engine sequence numbers (as on the ZMQ wire). The
    index applies each engine's batches exactly once and in order:

    * a batch already applied (a replay, or a duplicate) is ignored;
    * a batch ahead of a gap is held until the missing ones arrive (from the
      publisher's replay endpoint); :meth:`missing` says which to ask for, and
      :meth:`resync` gives up on them (the engine's entries are dropped, so the
      index under-estimates until new events arrive, but never over-estimates);
      more than ``max_pending`` held batches resync on their own;
    * a sequence number that starts over with a newer timestamp is a restarted
      engine: its entries are dropped (its cache is empty) and it is followed
      from there. ``AllBlocksCleared`` drops them too.

    An engine that sends neither a batch nor a :meth:`heartbeat` for
    ``heartbeat_timeout_s`` is taken for crashed: it is no longer scored and
    its entries are dropped.

    Not thread-safe: one thread submits and queries (the subscriber's loop).

    Args:
        layout: The engines' KV cache layout and hashing.
        backend: Where entries live (default: :class:`EmbeddedBackend`).
        hybrid_aware: Score each group with its own hit rule; ``False``
            scores every group with the full-attention prefix rule, as an
            index that knows no attention types does.
        heartbeat_timeout_s: Silence after which an engine is taken for dead.
        clock: Seconds, monotonic (default :func:`time.monotonic`; a
            simulation passes its simulated clock).
        max_pending: Batches held behind a gap before giving up on it.
    """

    def __init__(
        self,
        layout: FleetLayout,
        backend: Backend | None = None,
        *,
        hybrid_aware: bool = True,
        heartbeat_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        max_pending: int = 1024,
    ) -> None:
        if not heartbeat_timeout_s > 0:
            msg = f"heartbeat_timeout_s must be > 0 seconds, got {heartbeat_timeout_s!r}"
            raise InvalidConfigError(msg)
        if type(max_pending) is not int or max_pending < 1:
            msg = f"max_pending must be a positive integer, got {max_pending!r}"
            raise InvalidConfigError(msg)
        self.layout = layout
        self.backend: Backend = backend if backend is not None else EmbeddedBackend()
        self.hybrid_aware = hybrid_aware
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.clock = clock
        self.max_pending = max_pending
        self.stats = IndexStats()
        self._hit_rule = layout._hit_rule(hybrid_aware=hybrid_aware)
        self.hash_block_size = self._hit_rule.hash_block_size
        self._states: dict[str, _EngineState] = {}
        self._ready: list[ReadyBatch] = []
        self._searchers: list[EngineView] = []
        self._beats: set[str] = set()
        self._last_keepalive = float("-inf")

    # -- events -----------------------------------------------------------------------

    def submit(self, engine: str, seq: int, ts: float, events: Sequence[KVCacheEvent]) -> str:
        """Take one batch of ``engine``'s events; returns a :class:`SubmitResult` constant.

        In-order batches are queued for the backend and applied by
        :meth:`flush` (queries flush first), so many batches share one round
        trip.

        Raises:
            InvalidConfigError: ``engine`` is not a non-empty string, or
                ``seq`` not an integer >= 0.
        """
        if not isinstance(engine, str) or not engine:
            msg = f"engine must be a non-empty string id, got {engine!r}"
            raise InvalidConfigError(msg)
        if type(seq) is not int or seq < 0:
            msg = f"seq must be an integer >= 0, got {seq!r}"
            raise InvalidConfigError(msg)
        now = self.clock()
        state = self._states.get(engine)
        if state is None:
            state = self._states[engine] = _EngineState(now)
        state.last_seen = now
        result = SubmitResult.APPLIED
        if seq < state.expected:
            if ts <= state.last_ts:
                self.stats.duplicates += 1
                return SubmitResult.DUPLICATE
            # Numbering started over at a later time: a new incarnation, empty cache.
            self.stats.restarts += 1
            state.pending.clear()
            state.expected = seq
            state.need_reset = True
            result = SubmitResult.RESTARTED
        elif seq > state.expected:
            if seq in state.pending:
                self.stats.duplicates += 1
                return SubmitResult.DUPLICATE
            state.pending[seq] = (ts, list(events))
            if len(state.pending) > self.max_pending:
                self.resync(engine)
                return SubmitResult.APPLIED
            return SubmitResult.BUFFERED
        self._release(engine, state, seq, ts, events)
        return result

    def _release(
        self, engine: str, state: _EngineState, seq: int, ts: float, events: Sequence[KVCacheEvent]
    ) -> None:
        self._queue(engine, state, seq, ts, events)
        pending = state.pending
        while state.expected in pending:
            ts, events = pending.pop(state.expected)
            self._queue(engine, state, state.expected, ts, events)

    def _queue(
        self, engine: str, state: _EngineState, seq: int, ts: float, events: Sequence[KVCacheEvent]
    ) -> None:
        self._ready.append(ReadyBatch(engine, seq, ts, _ops(events), state.need_reset))
        self.stats.events += len(events)
        state.need_reset = False
        state.expected = seq + 1
        state.last_ts = max(state.last_ts, ts)

    def missing(self, engine: str) -> int | None:
        """The first sequence number of ``engine`` the index waits for, if it is held up.

        A subscriber asks the publisher's replay endpoint for batches from
        there; if the publisher no longer has them, call :meth:`resync`.
        """
        state = self._states.get(engine)
        if state is None or not state.pending:
            return None
        return state.expected

    def resync(self, engine: str) -> None:
        """Give up on ``engine``'s missing batches: drop its entries, continue after the gap.

        The held batches are then applied from the first one on, onto an empty
        entry set: what the lost batches stored is missing (an
        under-estimate), nothing removed in them lingers.
        """
        state = self._states.get(engine)
        if state is None:
            return
        self.stats.resyncs += 1
        state.need_reset = True
        if state.pending:
            first = min(state.pending)
            state.expected = first
            ts, events = state.pending.pop(first)
            self._release(engine, state, first, ts, events)

    def heartbeat(self, engine: str) -> None:
        """``engine`` is alive (it has no events to send)."""
        now = self.clock()
        state = self._states.get(engine)
        if state is None:
            self._states[engine] = _EngineState(now)
        else:
            state.last_seen = now
        self._beats.add(engine)

    def flush(self) -> None:
        """Apply the queued batches in the backend (one round trip for Redis).

        Raises:
            IndexUnavailableError: the backend cannot be reached; the batches
                stay queued and are applied by a later call.
        """
        if self._beats and time.monotonic() - self._last_keepalive >= _KEEPALIVE_S:
            try:
                self.backend.heartbeat(sorted(self._beats))
            except ConnectionError as exc:
                self.stats.unavailable += 1
                msg = f"the cluster index's {self.backend.name} backend is unreachable: {exc}"
                raise IndexUnavailableError(msg) from exc
            self._beats.clear()
            self._last_keepalive = time.monotonic()
        ready = self._ready
        if not ready:
            return
        start = time.perf_counter()
        try:
            applied = self.backend.apply(ready)
        except ConnectionError as exc:
            self.stats.unavailable += 1
            msg = f"the cluster index's {self.backend.name} backend is unreachable: {exc}"
            raise IndexUnavailableError(msg) from exc
        self.stats.apply_s += time.perf_counter() - start
        stats = self.stats
        for batch, done in zip(ready, applied, strict=True):
            if done:
                stats.batches += 1
                stats.block_ops += sum(len(hashes) for _, _, hashes in batch.ops)
            else:
                stats.duplicates += 1
        self._ready = []

    # -- engines ----------------------------------------------------------------------

    def live_engines(self) -> list[str]:
        """Engines heard from (a batch or a heartbeat) within the timeout, in id order.

        Engines silent for longer are dropped from the index (entries and
        sequence state): a crashed engine's blocks must not attract requests.
        """
        deadline = self.clock() - self.heartbeat_timeout_s
        for engine in [e for e, s in self._states.items() if s.last_seen < deadline]:
            del self._states[engine]
            self._ready = [b for b in self._ready if b.engine != engine]
            self.backend.forget(engine)
            self.stats.expired += 1
        return sorted(self._states)

    def cached_blocks(self, engine: str) -> int:
        """Block entries held for ``engine`` (after applying queued batches)."""
        self.flush()
        return self.backend.cached_blocks(engine)

    # -- queries ----------------------------------------------------------------------

    def _searcher(self, position: int) -> EngineView:
        searchers = self._searchers
        while len(searchers) <= position:
            searchers.append(EngineView(len(searchers)))
        return searchers[position]

    def hit_tokens(
        self,
        block_hashes: Sequence[Hashable],
        num_tokens: int,
        engines: Sequence[str] | None = None,
    ) -> dict[str, int]:
        """Tokens of a prompt each engine would find cached, by each group's own rule.

        Args:
            block_hashes: The prompt's block hashes, as the engines' managers
                compute them (every ``hash_block_size`` tokens, the layout's
                algorithm).
            num_tokens: The prompt's length (at most ``num_tokens - 1`` tokens
                can hit, as in the engine).
            engines: Engines to score (default: :meth:`live_engines`).

        Raises:
            IndexUnavailableError: the backend cannot be reached.
        """
        self.flush()
        if engines is None:
            engines = self.live_engines()
        start = time.perf_counter()
        group_hashes = self.layout.group_hashes(block_hashes, self.hash_block_size)
        try:
            snapshot = self.backend.snapshot(engines, group_hashes)
        except ConnectionError as exc:
            self.stats.unavailable += 1
            msg = f"the cluster index's {self.backend.name} backend is unreachable: {exc}"
            raise IndexUnavailableError(msg) from exc
        out: dict[str, int] = {}
        max_length = num_tokens - 1
        unfinished = []
        rule = self._hit_rule
        for position, engine in enumerate(engines):
            view = self._searcher(position)
            view.snapshot = snapshot
            try:
                out[engine] = (
                    longest_hit(rule, view, block_hashes, max_length) if max_length > 0 else 0
                )
            except NotFetchedError:
                unfinished.append(position)
        if unfinished:
            # These engines' searches went past the blocks a remote backend fetched first.
            try:
                snapshot.complete(unfinished)
            except ConnectionError as exc:
                self.stats.unavailable += 1
                msg = f"the cluster index's {self.backend.name} backend is unreachable: {exc}"
                raise IndexUnavailableError(msg) from exc
            for position in unfinished:
                view = self._searcher(position)
                out[engines[position]] = longest_hit(rule, view, block_hashes, max_length)
        self.stats.queries += 1
        self.stats.query_s += time.perf_counter() - start
        return out

    def close(self) -> None:
        """Release the backend's connections."""
        self.backend.close()

    def describe(self) -> dict[str, Any]:
        """Backend name and scoring mode, for reports."""
        return {"backend": self.backend.name, "hybrid_aware": self.hybrid_aware}
