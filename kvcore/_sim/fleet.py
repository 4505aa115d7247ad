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
from collections.abc import Callable
from typing import Any

import attrs

from kvcore._hashing import BlockHasher
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore._sim.ceiling import prefix_reuse_ceiling
from kvcore._sim.scheduler import Scheduler, SimRequest
from kvcore._sim.simulate import BELADY, SimulationOptions, plan_for
from kvcore._sim.workload import Workload
from kvcore.cluster import ROUTER_POLICIES, ClusterIndex, EngineLoad, FleetLayout, Router
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

# Width of the windows over which the peak event rate is measured, simulated seconds.
_RATE_WINDOW_S = 10.0


def _engines(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or not 1 <= value <= 1024:
        msg = f"--engines must be an integer from 1 to 1024, got {value!r}"
        raise InvalidConfigError(msg)


def _router(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in ROUTER_POLICIES:
        msg = f"--router must be one of {', '.join(ROUTER_POLICIES)}, got {value!r}"
        raise InvalidConfigError(msg)


def _index_url(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    schemes = ("redis://", "rediss://", "unix://")
    if value is not None and not (isinstance(value, str) and value.startswith(schemes)):
        msg = (
            "--index takes redis://[USER:PASSWORD@]HOST:PORT, rediss://... (TLS) or "
            f"unix://PATH (default: the in-process index), got {value!r}"
        )
        raise InvalidConfigError(msg)


def _time_scale(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value < 1e6:
        msg = f"--time-scale must be a number > 0 (1: the trace's own pace), got {value!r}"
        raise InvalidConfigError(msg)


@attrs.frozen(kw_only=True)
class FleetOptions:
    """The fleet around the engines.

    Attributes:
        engines: Number of engines (each with the memory of the simulation
            options).
        router: Routing policy (see :class:`~kvcore.cluster.Router`).
        index: ``None`` for the in-process index, or a Redis URL
            (``redis://``, ``rediss://`` for TLS, ``unix://``).
        hybrid_aware: Score each group with its own hit rule (``False``: every
            group as full attention, as type-unaware indexes do).
        balance_slack: The prefix router's load guard.
        seed: Seed of the ``random`` router.
        time_scale: Replay arrivals this many times faster than the trace's
            timestamps (a bigger fleet for a busier service); 1.0 keeps them.
    """

    engines: int = attrs.field(default=4, validator=_engines)
    router: str = attrs.field(default="prefix", validator=_router)
    index: str | None = attrs.field(default=None, validator=_index_url)
    hybrid_aware: bool = True
    balance_slack: float = 1.25
    seed: int = 0
    time_scale: float = attrs.field(default=1.0, validator=_time_scale)


@attrs.frozen(kw_only=True)
class EngineResult:
    """One engine's share of the run.

    Attributes:
        engine: Its id.
        requests: Requests routed to it.
        prompt_tokens: Their prompt tokens (first admissions).
        hit_tokens: Of those, found in its prefix cache.
        mean_running: Running requests, averaged over the arrivals.
        preemptions: Requests it preempted.
        steps: Steps it ran.
    """

    engine: str
    requests: int
    prompt_tokens: int
    hit_tokens: int
    mean_running: float
    preemptions: int
    steps: int

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens`` (0.0 with no prompt)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@attrs.frozen(kw_only=True)
class IndexResult:
    """The cluster index over the run.

    Attributes:
        backend: ``"embedded"`` or ``"redis"``.
        hybrid_aware: Whether groups were scored by their own rules.
        batches: Event batches applied.
        events: KV events in them.
        block_ops: Block stores and removals in them.
        apply_s: Wall time the backend spent applying them.
        queries: Hit queries answered.
        query_s: Wall time spent answering them.
        simulated_s: Simulated time of the run (the rate the events were made at).
        peak_block_ops_per_s: The highest block-op rate over a
            10-simulated-second window.
        degraded_routes: Requests routed by load only (index unreachable).
    """

    backend: str
    hybrid_aware: bool
    batches: int
    events: int
    block_ops: int
    apply_s: float
    queries: int
    query_s: float
    simulated_s: float
    peak_block_ops_per_s: float
    degraded_routes: int

    @property
    def applied_block_ops_per_s(self) -> float:
        """What the index applied per second of its own time (its capacity, measured)."""
        return self.block_ops / self.apply_s if self.apply_s else 0.0

    @property
    def produced_block_ops_per_s(self) -> float:
        """What the fleet produced per simulated second, on average."""
        return self.block_ops / self.simulated_s if self.simulated_s else 0.0

    @property
    def queries_per_s(self) -> float:
        """Queries answered per second of query time."""
        return self.queries / self.query_s if self.query_s else 0.0


@attrs.frozen(kw_only=True)
class FleetReport:
    """Everything a fleet simulation measured.

    Attributes:
        model: The model simulated.
        workload: The workload's name.
        options: The fleet options.
        memory: KV cache memory per engine.
        num_blocks: Blocks per engine.
        requests: Requests replayed (rejected ones excluded).
        rejected: Requests whose prompt leaves no room for an output token.
        engines: Per engine results.
        ceiling_rate: The unbounded single-cache ceiling of the workload.
        simulated_s: Simulated time until the last request finished.
        wall_s: Wall time of the run.
        index: The index's figures.
    """

    model: str
    workload: str
    options: FleetOptions
    memory: str
    num_blocks: int
    requests: int
    rejected: int
    engines: tuple[EngineResult, ...]
    ceiling_rate: float
    simulated_s: float
    wall_s: float
    index: IndexResult

    @property
    def hit_tokens(self) -> int:
        """Prompt tokens hit over the fleet."""
        return sum(e.hit_tokens for e in self.engines)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens over the fleet."""
        return sum(e.prompt_tokens for e in self.engines)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens hit / prompt tokens, over the fleet."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def imbalance(self) -> float:
        """The busiest engine's mean running requests over the fleet's mean (1.0: even)."""
        means = [e.mean_running for e in self.engines]
        mean = sum(means) / len(means)
        return max(means) / mean if mean else 1.0

    @property
    def preemptions(self) -> int:
        """Preemptions over the fleet."""
        return sum(e.preemptions for e in self.engines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the fields plus the derived figures."""
        index = attrs.asdict(self.index)
        index.update(
            applied_block_ops_per_s=self.index.applied_block_ops_per_s,
            produced_block_ops_per_s=self.index.produced_block_ops_per_s,
            queries_per_s=self.index.queries_per_s,
        )
        return {
            "model": self.model,
            "workload": self.workload,
            "fleet": attrs.asdict(self.options),
            "memory_per_engine": self.memory,
            "num_blocks_per_engine": self.num_blocks,
            "requests": self.requests,
            "rejected_too_long": self.rejected,
            "hit_rate": self.hit_rate,
            "hit_tokens": self.hit_tokens,
            "prompt_tokens": self.prompt_tokens,
            "ceiling_rate": self.ceiling_rate,
            "imbalance": self.imbalance,
            "preemptions": self.preemptions,
            "simulated_s": self.simulated_s,
            "wall_s": self.wall_s,
            "engines": [{**attrs.asdict(e), "hit_rate": e.hit_rate} for e in self.engines],
            "index": index,
        }


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def format_fleet_report(report: FleetReport) -> str:
    """The report as aligned lines of text, for a terminal."""
    opts, index = report.options, report.index
    scoring = "hybrid-aware" if index.hybrid_aware else "all blocks alike"
    lines = [
        f"kvcore simulate: {report.model} on {report.workload}",
        f"  fleet        {opts.engines} engines x {report.memory} ({report.num_blocks:,} blocks "
        f"each), router {opts.router}, index {index.backend} ({scoring})",
        f"  requests     {report.requests:,} routed, {report.rejected} rejected (prompt >= "
        f"max_model_len); arrivals {opts.time_scale:g}x the trace's pace; "
        f"{report.simulated_s:,.1f} s simulated",
        f"  prefix hits  {_pct(report.hit_rate)} of prompt tokens ({report.hit_tokens:,} of "
        f"{report.prompt_tokens:,}); unbounded single-cache ceiling {_pct(report.ceiling_rate)}",
        f"  load         imbalance {report.imbalance:.2f} (busiest engine's mean running / "
        f"fleet mean); {report.preemptions:,} preemptions",
        "  engine       requests   hit rate   mean running   preemptions",
    ]
    lines.extend(
        f"    {e.engine:<10} {e.requests:>8,}   {_pct(e.hit_rate):>8}   {e.mean_running:>12.2f}"
        f"   {e.preemptions:>11,}"
        for e in report.engines
    )
    if opts.router == "prefix":
        lines += [
            f"  index        {index.batches:,} batches, {index.events:,} events, "
            f"{index.block_ops:,} block ops; applied at {index.applied_block_ops_per_s:,.0f} "
            f"block ops/s against {index.produced_block_ops_per_s:,.0f}/s produced "
            f"(peak {index.peak_block_ops_per_s:,.0f}/s over {_RATE_WINDOW_S:g} s)",
            f"               {index.queries:,} queries at {index.queries_per_s:,.0f}/s"
            + (f"; {index.degraded_routes:,} routed by load only" if index.degraded_routes else ""),
        ]
    else:
        lines.append(f"  index        not consulted by the {opts.router} router")
    lines += [
        f"  wall time    {report.wall_s:.2f} s",
    ]
    return "\n".join(lines)


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
        workload: The requests (replayed by arrival time).
        options: Model, memory per engine, scheduler (``arrival`` must be
            ``"timestamp"``: requests are routed when they arrive).
        fleet: Engines, router, index.
        registry: Plugins (default: every installed plugin).
        progress: Called now and then with (requests routed, requests).

    Every engine's pool uses ``options.eviction`` (an online policy; the
    offline ``belady`` is refused).

    Raises:
        KVCoreError: an unknown model or eviction policy, too little memory,
            prefix caching impossible for the model, a Redis index that
            cannot be reached.
    """
    options = options or SimulationOptions()
    fleet = fleet or FleetOptions()
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
    started = time.perf_counter()
    registry = registry if registry is not None else load_registry()
    plan = plan_for(options, registry)
    config = plan.kv_cache_config
    max_model_len = plan.max_model_len
    names = [f"e{i}" for i in range(fleet.engines)]
    managers = [
        KVCacheManager(
            config,
            max_model_len,
            registry=registry,
            hash_algorithm=options.hash_algorithm,
            eviction=options.eviction,
            # Only the prefix router reads the index: the others run without events.
            enable_kv_cache_events=fleet.router == "prefix",
        )
        for _ in names
    ]
    schedulers = [Scheduler(manager, options.scheduler, []) for manager in managers]
    layout = FleetLayout(config=config, registry=registry, hash_algorithm=options.hash_algorithm)
    backend = _make_backend(fleet, len(config.kv_cache_groups))
    now_s = [0.0]
    index = ClusterIndex(
        layout,
        backend,
        hybrid_aware=fleet.hybrid_aware,
        heartbeat_timeout_s=3600.0 * 24,
        clock=lambda: now_s[0],
    )
    router = Router(
        fleet.router,
        index if fleet.router == "prefix" else None,
        balance_slack=fleet.balance_slack,
        seed=fleet.seed,
    )
    from kvcore.cluster._wire import EventBatch, decode_batch, encode_batch, merge_removals

    try:
        accepted: deque[SimRequest] = deque()
        rejected = 0
        for trace in workload.requests:
            room = max_model_len - trace.input_length
            if room < 1:
                rejected += 1
                continue
            if fleet.time_scale != 1.0:
                trace = attrs.evolve(trace, arrival_ms=trace.arrival_ms / fleet.time_scale)
            accepted.append(SimRequest(trace, min(trace.output_length, room)))
        if workload.requests and not accepted:
            msg = f"every request of {workload.name} is too long for max_model_len={max_model_len}"
            raise InvalidConfigError(msg)
        ceiling = prefix_reuse_ceiling(
            [r.trace for r in accepted],
            index.layout.config.kv_cache_groups[0].kv_cache_spec.block_size,
        )
        total = len(accepted)
        hasher = BlockHasher(index.hash_block_size, options.hash_algorithm)
        seqs = [0] * len(names)
        routed = [0] * len(names)
        running_sum = [0] * len(names)
        samples = 0
        window_ops: dict[int, int] = {}
        for name in names:
            index.heartbeat(name)
        next_progress = time.monotonic()
        while True:
            busy = [i for i, s in enumerate(schedulers) if s.pending or s.waiting or s.running]
            engine_clock = min((schedulers[i].clock_ms for i in busy), default=float("inf"))
            if accepted and accepted[0].trace.arrival_ms <= engine_clock:
                entry = accepted.popleft()
                trace = entry.trace
                now_s[0] = trace.arrival_ms / 1000.0
                request = Request(trace.request_id, trace.prompt_token_ids)
                hasher.update(request)
                entry.request = request
                loads = [_load(name, s) for name, s in zip(names, schedulers, strict=True)]
                for i, load in enumerate(loads):
                    running_sum[i] += load.running
                samples += 1
                for name in names:
                    index.heartbeat(name)
                route = router.route(request.block_hashes, request.num_tokens, loads)
                target = names.index(route.engine)
                schedulers[target].pending.append(entry)
                routed[target] += 1
                if progress is not None and time.monotonic() >= next_progress:
                    progress(total - len(accepted), total)
                    next_progress = time.monotonic() + 0.2
                continue
            if not busy:
                break
            i = min(busy, key=lambda j: schedulers[j].clock_ms)
            scheduler = schedulers[i]
            scheduler.step()
            events = managers[i].take_events()
            if events:
                now_s[0] = scheduler.clock_ms / 1000.0
                payload = encode_batch(EventBatch(now_s[0], merge_removals(events)))
                batch = decode_batch(payload)
                index.submit(names[i], seqs[i], batch.ts, batch.events)
                seqs[i] += 1
                window = int(now_s[0] // _RATE_WINDOW_S)
                ops = sum(len(e.block_hashes) for e in batch.events if hasattr(e, "block_hashes"))
                window_ops[window] = window_ops.get(window, 0) + ops
        index.flush()
        if progress is not None:
            progress(total, total)
        simulated_s = max(s.clock_ms for s in schedulers) / 1000.0
        results = tuple(
            EngineResult(
                engine=name,
                requests=routed[i],
                prompt_tokens=s.prompt_tokens,
                hit_tokens=s.hit_tokens,
                mean_running=running_sum[i] / samples if samples else 0.0,
                preemptions=s.num_preemptions,
                steps=s.step_count,
            )
            for i, (name, s) in enumerate(zip(names, schedulers, strict=True))
        )
        stats = index.stats
        index_result = IndexResult(
            backend=index.backend.name,
            hybrid_aware=fleet.hybrid_aware,
            batches=stats.batches,
            events=stats.events,
            block_ops=stats.block_ops,
            apply_s=stats.apply_s,
            queries=stats.queries,
            query_s=stats.query_s,
            simulated_s=simulated_s,
            peak_block_ops_per_s=max(window_ops.values(), default=0) / _RATE_WINDOW_S,
            degraded_routes=router.degraded_routes,
        )
    finally:
        if backend is not None:
            clear = getattr(backend, "clear_namespace", None)
            if clear is not None:
                with contextlib.suppress(ConnectionError):
                    clear()
        index.close()
    return FleetReport(
        model=options.model,
        workload=workload.name,
        options=fleet,
        memory=options.memory,
        num_blocks=config.num_blocks,
        requests=total,
        rejected=rejected,
        engines=results,
        ceiling_rate=ceiling.rate,
        simulated_s=simulated_s,
        wall_s=time.perf_counter() - started,
        index=index_result,
    )
