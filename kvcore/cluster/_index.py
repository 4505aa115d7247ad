"""The cluster prefix index: which engine holds which blocks, fed by their KV events."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Final, TypeVar

import attrs

from kvcore.cluster._backend import ApplyResult, Backend, NotFetchedError, ReadyBatch
from kvcore.cluster._embedded import EmbeddedBackend
from kvcore.cluster._errors import IndexUnavailableError, InvalidConfigError, InvalidEventError
from kvcore.cluster._following import Follower, bare_reset
from kvcore.cluster._hit_rule import EngineView, FleetLayout, longest_hit
from kvcore.cluster._results import IndexStats, SubmitResult
from kvcore.cluster._validate import EventChecker, check_engine_id
from kvcore.errors import InvalidRequestError

__all__ = ["ClusterIndex", "IndexStats", "SubmitResult"]

logger = logging.getLogger("kvcore.cluster")

# Wall seconds between refreshes of heartbeated engines' expiry in the backend.
_KEEPALIVE_S = 1.0
# Rounds of a flush: a refused batch is sent again onto empty entries, then as
# a bare reset if it still does not fit.
_APPLY_ROUNDS: Final = 3

_T = TypeVar("_T")


class ClusterIndex:
    """Block hash → engines holding it, per KV cache group, fed by the engines' KV events.

    Answers the router's question, *how many tokens of this request would
    engine E hit?*, with each group's own hit rule (see
    :class:`FleetLayout`): the answer equals the engine's own
    ``get_computed_blocks`` for the blocks the index has seen.

    Every batch is validated before anything changes (see
    :class:`InvalidEventError`): a bad batch is refused whole, counted, and
    the engine's entries are dropped and rebuilt from its next batches; no
    other engine is affected. An engine holds at most its pool's worth of
    entries (``num_blocks`` it announces, else ``max_engine_blocks``).

    Event batches carry per-engine sequence numbers (as on the ZMQ wire) and,
    from kvcore's publisher, the engine's *incarnation* (a random id chosen
    when it starts). The index applies each incarnation's batches exactly
    once and in order:

    * a batch already applied (a replay, or a duplicate) is ignored;
    * a batch ahead of a gap is held until the missing ones arrive (from the
      publisher's replay endpoint); :meth:`missing` says which to ask for, and
      :meth:`resync` gives up on them (the engine's entries are dropped, so the
      index under-estimates until new events arrive, but never over-estimates);
      more than ``max_pending`` held batches, or ``max_pending_bytes``,
      resync on their own;
    * a new incarnation is a restarted engine, whatever the clocks say: its
      old entries are dropped and it is followed from its sequence number 0;
      a late batch of the old one is ignored (``STALE``). A publisher that
      announces no incarnation (vLLM's) is taken for restarted when its
      numbering starts over with a later timestamp. ``AllBlocksCleared``
      drops the entries too;
    * two incarnations publishing at once under one engine id (two engines
      given one id) raise :class:`EngineConflictError`: the id is refused
      until one of them has been silent for ``heartbeat_timeout_s``.

    An engine that sends neither a batch nor a :meth:`heartbeat` for
    ``heartbeat_timeout_s`` is taken for crashed: it is no longer scored and
    its entries are dropped.

    Batches queue for the backend until the next :meth:`flush` (queries flush
    first). While the backend is unreachable they stay queued, up to
    ``max_pending`` batches or ``max_pending_bytes``; past that they are
    dropped and each engine concerned is resynced.

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
        max_pending: Batches held behind one engine's gap, and batches
            queued for the backend, before giving up on them.
        max_pending_bytes: The same bound in bytes (block hashes at 8 bytes
            an integer or their digest size, plus 64 per event).
        max_engine_blocks: The most entries one engine may hold, and the
            largest pool an engine may announce (default: the layout
            config's ``num_blocks``).
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
        max_pending_bytes: int = 64 << 20,
        max_engine_blocks: int | None = None,
    ) -> None:
        if not heartbeat_timeout_s > 0:
            msg = f"heartbeat_timeout_s must be > 0 seconds, got {heartbeat_timeout_s!r}"
            raise InvalidConfigError(msg)
        for name, value in (("max_pending", max_pending), ("max_pending_bytes", max_pending_bytes)):
            if type(value) is not int or value < 1:
                msg = f"{name} must be a positive integer, got {value!r}"
                raise InvalidConfigError(msg)
        if max_engine_blocks is None:
            max_engine_blocks = layout.config.num_blocks
        if type(max_engine_blocks) is not int or max_engine_blocks < 1:
            msg = f"max_engine_blocks must be a positive integer, got {max_engine_blocks!r}"
            raise InvalidConfigError(msg)
        self.layout = layout
        num_groups = len(layout.config.kv_cache_groups)
        self.backend: Backend = backend if backend is not None else EmbeddedBackend(num_groups)
        self.hybrid_aware = hybrid_aware
        self.heartbeat_timeout_s = float(heartbeat_timeout_s)
        self.clock = clock
        self.max_pending = max_pending
        self.max_pending_bytes = max_pending_bytes
        self.max_engine_blocks = max_engine_blocks
        self.stats = IndexStats()
        self._hit_rule = layout._hit_rule(hybrid_aware=hybrid_aware)
        self.hash_block_size = self._hit_rule.hash_block_size
        self._checker = EventChecker(layout)
        self._follower = Follower(
            self._checker,
            self.stats,
            clock,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
            max_pending=max_pending,
            max_pending_bytes=max_pending_bytes,
            max_engine_blocks=max_engine_blocks,
            forget=self._forget,
            relieve=self._relieve_queue,
        )
        self._forget_later: set[str] = set()
        self._searchers: list[EngineView] = []
        self._beats: set[str] = set()
        self._last_keepalive = float("-inf")

    # -- events -----------------------------------------------------------------------

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
        """Take one batch of ``engine``'s events; returns a :class:`SubmitResult` constant.

        In-order batches are queued for the backend and applied by
        :meth:`flush` (queries flush first), so many batches share one round
        trip.

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
        return self._follower.submit(
            engine, seq, ts, events, incarnation=incarnation, num_blocks=num_blocks
        )

    def _relieve_queue(self) -> None:
        """Apply the queue now; if the backend is down, drop it (each engine resynced)."""
        try:
            self.flush()
        except IndexUnavailableError:
            self._follower.drop_queue()

    def _forget(self, engine: str) -> None:
        """Drop ``engine`` from the backend now, or at the next flush if it is unreachable."""
        try:
            self._backend_call(self.backend.forget, engine)
        except IndexUnavailableError:
            self._forget_later.add(engine)
        else:
            self._forget_later.discard(engine)

    def missing(self, engine: str) -> int | None:
        """The first sequence number of ``engine`` the index waits for, if it is held up.

        A subscriber asks the publisher's replay endpoint for batches from
        there; if the publisher no longer has them, call :meth:`resync`.

        Raises:
            InvalidConfigError: ``engine`` is not an engine id.
        """
        return self._follower.missing(check_engine_id(engine))

    def resync(self, engine: str) -> None:
        """Give up on ``engine``'s missing batches: drop its entries, continue after the gap.

        The held batches are then applied from the first one on, onto an empty
        entry set: what the lost batches stored is missing (an
        under-estimate), nothing removed in them lingers.

        Raises:
            InvalidConfigError: ``engine`` is not an engine id.
        """
        self._follower.resync(check_engine_id(engine))

    def heartbeat(self, engine: str) -> None:
        """``engine`` is alive (it has no events to send).

        Raises:
            InvalidConfigError: ``engine`` is not an engine id.
        """
        self._follower.heartbeat(engine)
        self._beats.add(engine)

    @property
    def queued_batches(self) -> int:
        """Batches waiting for the next :meth:`flush` (about ``max_pending`` at most)."""
        return len(self._follower.ready)

    def _backend_call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` with a failing backend as :class:`IndexUnavailableError`, counted."""
        try:
            return fn(*args)
        except IndexUnavailableError:
            self.stats.unavailable += 1
            raise
        except ConnectionError as exc:
            self.stats.unavailable += 1
            msg = f"the cluster index's {self.backend.name} backend is unreachable: {exc}"
            raise IndexUnavailableError(msg) from exc

    def flush(self) -> None:
        """Apply the queued batches in the backend (one round trip for Redis).

        A batch the backend refuses (over the engine's pool, broken keys) is
        sent again onto the engine's emptied entries, in the same call.

        Raises:
            IndexUnavailableError: the backend failed; the batches stay
                queued and are sent again by a later call (a batch the
                backend had applied meanwhile is then a duplicate).
        """
        for engine in sorted(self._forget_later):
            self._backend_call(self.backend.forget, engine)
            self._forget_later.discard(engine)
        if self._beats and time.monotonic() - self._last_keepalive >= _KEEPALIVE_S:
            self._backend_call(self.backend.heartbeat, sorted(self._beats))
            self._beats.clear()
            self._last_keepalive = time.monotonic()
        follower = self._follower
        if not follower.ready:
            return
        start = time.perf_counter()
        refused: set[tuple[str, int]] = set()
        try:
            for _ in range(_APPLY_ROUNDS):
                ready = follower.ready
                results = self._backend_call(self.backend.apply, ready)
                follower.set_ready(self._settle(ready, results, refused))
                if not follower.ready:
                    break
        finally:
            self.stats.apply_s += time.perf_counter() - start

    def _settle(
        self, ready: list[ReadyBatch], results: list[str], refused: set[tuple[str, int]]
    ) -> list[ReadyBatch]:
        """Count what was applied; return the batches to send again, in order."""
        stats = self.stats
        again: list[ReadyBatch] = []
        resent: set[str] = set()
        for batch, result in zip(ready, results, strict=True):
            if result == ApplyResult.APPLIED:
                stats.batches += 1
                stats.block_ops += sum(len(hashes) for _, _, hashes in batch.ops)
            elif result == ApplyResult.DUPLICATE:
                stats.duplicates += 1
            elif result == ApplyResult.STALE:
                stats.stale += 1
            elif batch.engine in resent:
                again.append(batch)  # behind the engine's batch sent again
            else:
                resent.add(batch.engine)
                again.append(self._resend(batch, result, refused))
        return again

    def _resend(self, batch: ReadyBatch, result: str, refused: set[tuple[str, int]]) -> ReadyBatch:
        """What to send instead of a batch the backend did not apply."""
        if result != ApplyResult.OUT_OF_ORDER and (batch.engine, batch.seq) not in refused:
            refused.add((batch.engine, batch.seq))
            self.stats.rejected += 1
            logger.warning(
                "kvcore cluster index: the %s backend refused batch %d of engine %r (%s); "
                "the engine's entries are dropped and rebuilt from there",
                self.backend.name,
                batch.seq,
                batch.engine,
                result,
            )
        if result == ApplyResult.INVALID or (batch.reset and result == ApplyResult.OVER_CAPACITY):
            return bare_reset(batch)
        return attrs.evolve(batch, reset=True)

    # -- engines ----------------------------------------------------------------------

    def live_engines(self) -> list[str]:
        """Engines heard from (a batch or a heartbeat) within the timeout, in id order.

        Engines silent for longer are dropped from the index (entries and
        sequence state): a crashed engine's blocks must not attract requests.
        An engine id two incarnations claim (see :class:`EngineConflictError`)
        is not listed.
        """
        for engine in self._follower.expire(self.clock() - self.heartbeat_timeout_s):
            self._forget(engine)
            self.stats.expired += 1
        return self._follower.live()

    def cached_blocks(self, engine: str) -> int:
        """Block entries held for ``engine`` (after applying queued batches).

        Raises:
            InvalidConfigError: ``engine`` is not an engine id.
            IndexUnavailableError: the backend cannot be reached.
        """
        check_engine_id(engine)
        self.flush()
        return self._backend_call(self.backend.cached_blocks, engine)

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
            InvalidRequestError: ``block_hashes`` are not hashes of the
                layout's algorithm.
            InvalidConfigError: an entry of ``engines`` is not an engine id.
            IndexUnavailableError: the backend cannot be reached.
        """
        block_hashes = self._query_hashes(block_hashes)
        self.flush()
        if engines is None:
            engines = self.live_engines()
        else:
            engines = [check_engine_id(engine) for engine in engines]
        start = time.perf_counter()
        group_hashes = self.layout.group_hashes(block_hashes, self.hash_block_size)
        snapshot = self._backend_call(self.backend.snapshot, engines, group_hashes)
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
            self._backend_call(snapshot.complete, unfinished)
            for position in unfinished:
                view = self._searcher(position)
                out[engines[position]] = longest_hit(rule, view, block_hashes, max_length)
        self.stats.queries += 1
        self.stats.query_s += time.perf_counter() - start
        return out

    def _query_hashes(self, block_hashes: Sequence[Hashable]) -> Sequence[Hashable]:
        try:
            return self._checker.request_hashes(block_hashes)
        except InvalidEventError as exc:
            raise InvalidRequestError(str(exc)) from None

    def close(self) -> None:
        """Release the backend's connections."""
        self.backend.close()

    def describe(self) -> dict[str, Any]:
        """Backend name and scoring mode, for reports."""
        return {"backend": self.backend.name, "hybrid_aware": self.hybrid_aware}
