"""A fleet of simulated engines behind a router, fed by a cluster prefix index.

Every engine is what ``kvcore simulate`` runs for one: its own
:class:`~kvcore.KVCacheManager` (events on) driven by the same
:class:`~kvcore._sim.scheduler.Scheduler`. The fleet replays a workload on a
shared simulated clock:

* a request is routed when it arrives: the router reads each engine's load
  (running and waiting requests, prefill tokens ahead, free blocks) and, for
  ``prefix``, asks the cluster index how many tokens each engine would hit;
* otherwise the engine with the earliest clock runs its next step; after the
  step its KV events are published as one batch (encoded to vLLM's wire
  format and decoded again, with a sequence number), and the index takes it,
  as a subscriber would. The index applies queued batches before it answers
  a query (one round trip for Redis). Only the ``prefix`` router reads the
  index, so with the other policies the engines publish no events and the
  index figures are zero.

Reported: per engine and in total, the prompt tokens hit at first admission,
the running requests (sampled at every arrival, which samples time without
bias), preemptions; load imbalance as the busiest engine's mean running over
the fleet's mean; the index's event and query throughput against the event
rate the simulation produced.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable

import attrs

from kvcore._hashing import BlockHasher
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore._sim.ceiling import prefix_reuse_ceiling
from kvcore._sim.fleet_report import (
    RATE_WINDOW_S,
    EngineResult,
    FleetOptions,
    FleetReport,
    IndexResult,
    format_fleet_report,
)
from kvcore._sim.scheduler import Scheduler, SimRequest
from kvcore._sim.simulate import BELADY, SimulationOptions, admissible, plan_for
from kvcore._sim.workload import Workload
from kvcore.cluster import ClusterIndex, EngineLoad, FleetLayout, Router
from kvcore.cluster._backend import Backend
from kvcore.errors import InvalidConfigError

__all__ = [
    "EngineResult",
    "FleetOptions",
    "FleetReport",
    "IndexResult",
    "fleet_progress_printer",
    "format_fleet_report",
    "simulate_fleet",
]


def fleet_progress_printer() -> Callable[[int, int], None] | None:
    """A progress callback on stderr (requests routed), or ``None`` when it is not a TTY."""
    if not sys.stderr.isatty():
        return None
    started = time.monotonic()

    def show(done: int, total: int) -> None:
        if done >= total:
            sys.stderr.write("\r\x1b[2K")
        else:
            sys.stderr.write(
                f"\r\x1b[2Ksimulating the fleet: {done:,}/{total:,} requests routed, "
                f"{time.monotonic() - started:.0f} s"
            )
        sys.stderr.flush()

    return show


def _make_backend(fleet: FleetOptions, num_groups: int) -> Backend | None:
    if fleet.index is None:
        return None
    from kvcore.cluster._redis import RedisBackend

    # A namespace of its own: runs sharing one Redis do not see each other.
    return RedisBackend(fleet.index, num_groups, namespace=f"kvcore-sim-{uuid.uuid4().hex[:12]}")


def _load(engine: str, scheduler: Scheduler) -> EngineLoad:
    pending_tokens = 0
    for entry in scheduler.running:
        request = entry.request
        if request is not None:
            left = request.num_tokens - request.num_computed_tokens
            if left > 1:
                pending_tokens += left
    for entry in scheduler.waiting:
        pending_tokens += entry.trace.input_length
    for entry in scheduler.pending:
        pending_tokens += entry.trace.input_length
    pool = scheduler.manager.block_pool
    return EngineLoad(
        engine=engine,
        running=len(scheduler.running),
        waiting=len(scheduler.waiting) + len(scheduler.pending),
        pending_tokens=pending_tokens,
        free_blocks=pool.get_num_free_blocks(),
        total_blocks=pool.num_blocks - 1,
    )


def _check_options(options: SimulationOptions, fleet: FleetOptions) -> None:
    if options.scheduler.arrival != "timestamp":
        msg = "a fleet routes requests when they arrive: use --arrival timestamp"
        raise InvalidConfigError(msg)
    if not options.enable_caching:
        msg = "a fleet simulation routes by cached prefixes: drop --no-prefix-caching"
        raise InvalidConfigError(msg)
    if options.eviction == BELADY or options.with_belady:
        msg = (
            "the offline optimum (--eviction belady, --with-belady) replays one engine; "
            "a fleet's engines take an online policy (--eviction lru, admit, frequency, cost "
            "or a plugin's)"
        )
        raise InvalidConfigError(msg)


def _time_scaled(requests: Iterable[SimRequest], time_scale: float) -> deque[SimRequest]:
    """The requests with arrival times divided by ``time_scale`` (1: as given)."""
    if time_scale == 1.0:
        return deque(requests)
    return deque(
        SimRequest(
            attrs.evolve(r.trace, arrival_ms=r.trace.arrival_ms / time_scale),
            r.output_target,
            r.index,
        )
        for r in requests
    )


class _FleetRun:
    """One replay: the engines, the cluster index and the router on one simulated clock.

    :meth:`replay` interleaves arrivals (routed at once) with engine steps
    (the engine with the earliest clock runs next; its events reach the
    index as one wire batch). :meth:`close` releases the index and, for
    Redis, the run's namespace; call it whatever happened.
    """

    def __init__(self, options: SimulationOptions, fleet: FleetOptions, registry: Registry) -> None:
        plan = plan_for(options, registry)
        self.config = config = plan.kv_cache_config
        self.max_model_len = plan.max_model_len
        self.hybrid_aware = fleet.hybrid_aware
        self.names = [f"e{i}" for i in range(fleet.engines)]
        self.managers = [
            KVCacheManager(
                config,
                self.max_model_len,
                registry=registry,
                hash_algorithm=options.hash_algorithm,
                eviction=options.eviction,
                # Only the prefix router reads the index: the others run without events.
                enable_kv_cache_events=fleet.router == "prefix",
            )
            for _ in self.names
        ]
        self.schedulers = [Scheduler(m, options.scheduler, []) for m in self.managers]
        layout = FleetLayout(
            config=config, registry=registry, hash_algorithm=options.hash_algorithm
        )
        self.backend = _make_backend(fleet, len(config.kv_cache_groups))
        self.now_s = 0.0
        self.index = ClusterIndex(
            layout,
            self.backend,
            hybrid_aware=fleet.hybrid_aware,
            heartbeat_timeout_s=3600.0 * 24,
            clock=lambda: self.now_s,
        )
        index = self.index if fleet.router == "prefix" else None
        self.router = Router(
            fleet.router, index, balance_slack=fleet.balance_slack, seed=fleet.seed
        )
        self.hasher = BlockHasher(self.index.hash_block_size, options.hash_algorithm)
        self.seqs = [0] * len(self.names)
        self.routed = [0] * len(self.names)
        self.running_sum = [0] * len(self.names)
        self.samples = 0
        self.window_ops: dict[int, int] = {}

    def replay(
        self, accepted: deque[SimRequest], progress: Callable[[int, int], None] | None
    ) -> None:
        """Route every request of ``accepted`` and run the engines until all are done."""
        schedulers, total = self.schedulers, len(accepted)
        for name in self.names:
            self.index.heartbeat(name)
        next_progress = time.monotonic()
        while True:
            busy = [i for i, s in enumerate(schedulers) if s.pending or s.waiting or s.running]
            engine_clock = min((schedulers[i].clock_ms for i in busy), default=float("inf"))
            if accepted and accepted[0].trace.arrival_ms <= engine_clock:
                self._route(accepted.popleft())
                if progress is not None and time.monotonic() >= next_progress:
                    progress(total - len(accepted), total)
                    next_progress = time.monotonic() + 0.2
                continue
            if not busy:
                break
            self._step(min(busy, key=lambda j: schedulers[j].clock_ms))
        self.index.flush()
        if progress is not None:
            progress(total, total)

    def _route(self, entry: SimRequest) -> None:
        trace = entry.trace
        self.now_s = trace.arrival_ms / 1000.0
        request = Request(trace.request_id, trace.prompt_token_ids)
        self.hasher.update(request)
        entry.request = request
        loads = [_load(name, s) for name, s in zip(self.names, self.schedulers, strict=True)]
        for i, load in enumerate(loads):
            self.running_sum[i] += load.running
        self.samples += 1
        for name in self.names:
            self.index.heartbeat(name)
        route = self.router.route(request.block_hashes, request.num_tokens, loads)
        target = self.names.index(route.engine)
        self.schedulers[target].pending.append(entry)
        self.routed[target] += 1

    def _step(self, i: int) -> None:
        from kvcore.cluster._wire import EventBatch, decode_batch, encode_batch, merge_removals

        scheduler = self.schedulers[i]
        scheduler.step()
        events = self.managers[i].take_events()
        if not events:
            return
        self.now_s = scheduler.clock_ms / 1000.0
        # Through the wire format and back, as a subscriber receives it.
        batch = decode_batch(encode_batch(EventBatch(self.now_s, merge_removals(events))))
        self.index.submit(self.names[i], self.seqs[i], batch.ts, batch.events)
        self.seqs[i] += 1
        window = int(self.now_s // RATE_WINDOW_S)
        ops = sum(len(e.block_hashes) for e in batch.events if hasattr(e, "block_hashes"))
        self.window_ops[window] = self.window_ops.get(window, 0) + ops

    @property
    def simulated_s(self) -> float:
        """Simulated seconds until the last engine finished."""
        return max(s.clock_ms for s in self.schedulers) / 1000.0

    def engine_results(self) -> tuple[EngineResult, ...]:
        """Each engine's requests, hits, mean running requests and preemptions."""
        return tuple(
            EngineResult(
                engine=name,
                requests=self.routed[i],
                prompt_tokens=s.prompt_tokens,
                hit_tokens=s.hit_tokens,
                mean_running=self.running_sum[i] / self.samples if self.samples else 0.0,
                preemptions=s.num_preemptions,
                steps=s.step_count,
            )
            for i, (name, s) in enumerate(zip(self.names, self.schedulers, strict=True))
        )

    def index_result(self) -> IndexResult:
        """The index's event and query throughput against the rate the fleet produced."""
        stats = self.index.stats
        return IndexResult(
            backend=self.index.backend.name,
            hybrid_aware=self.hybrid_aware,
            batches=stats.batches,
            events=stats.events,
            block_ops=stats.block_ops,
            apply_s=stats.apply_s,
            queries=stats.queries,
            query_s=stats.query_s,
            simulated_s=self.simulated_s,
            peak_block_ops_per_s=max(self.window_ops.values(), default=0) / RATE_WINDOW_S,
            degraded_routes=self.router.degraded_routes,
        )

    def close(self) -> None:
        """Close the index and clear a Redis run's namespace (a lost server is ignored)."""
        if self.backend is not None:
            clear = getattr(self.backend, "clear_namespace", None)
            if clear is not None:
                with contextlib.suppress(ConnectionError):
                    clear()
        self.index.close()


def simulate_fleet(
    workload: Workload,
    options: SimulationOptions | None = None,
    fleet: FleetOptions | None = None,
    *,
    registry: Registry | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> FleetReport:
    """Replay ``workload`` on a fleet of engines of ``options.model`` behind a router.

    Args:
        workload: The requests (replayed by arrival time). A prompt leaving
            no room for one output token is rejected, an output capped to
            ``max_model_len``, as ``kvcore simulate`` does for one engine.
        options: Model, memory per engine, scheduler (``arrival`` must be
            ``"timestamp"``: requests are routed when they arrive).
        fleet: Engines, router, index.
        registry: Plugins (default: every installed plugin).
        progress: Called now and then with (requests routed, requests).

    Every engine's pool uses ``options.eviction`` (an online policy; the
    offline ``belady`` is refused).

    Raises:
        KVCoreError: an unknown model or eviction policy, too little memory,
            prefix caching impossible for the model, every request too long,
            a Redis index that cannot be reached.
    """
    options = options or SimulationOptions()
    fleet = fleet or FleetOptions()
    _check_options(options, fleet)
    started = time.perf_counter()
    run = _FleetRun(options, fleet, registry if registry is not None else load_registry())
    try:
        admitted = admissible(workload, run.max_model_len)
        accepted = _time_scaled(admitted.accepted, fleet.time_scale)
        block_size = run.config.kv_cache_groups[0].kv_cache_spec.block_size
        ceiling = prefix_reuse_ceiling([r.trace for r in accepted], block_size)
        run.replay(accepted, progress)
        engines, index = run.engine_results(), run.index_result()
    finally:
        run.close()
    return FleetReport(
        model=options.model,
        workload=workload.name,
        options=fleet,
        memory=options.memory,
        num_blocks=run.config.num_blocks,
        requests=len(admitted.accepted),
        rejected=admitted.rejected,
        engines=engines,
        ceiling_rate=ceiling.rate,
        simulated_s=run.simulated_s,
        wall_s=time.perf_counter() - started,
        index=index,
    )
