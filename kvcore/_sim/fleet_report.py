"""What a fleet simulation is asked for and what it reports.

:class:`FleetOptions` (engines, router, index, time scale, each checked when
built), the per-engine and index results, the :class:`FleetReport` that holds
them and its text form. :mod:`kvcore._sim.fleet` runs the replay.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvcore.cluster import ROUTER_POLICIES
from kvcore.errors import InvalidConfigError

__all__ = [
    "EngineResult",
    "FleetOptions",
    "FleetReport",
    "IndexResult",
    "format_fleet_report",
    "RATE_WINDOW_S",
]

#: Width of the windows over which the peak event rate is measured, simulated seconds.
RATE_WINDOW_S = 10.0


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
            f"(peak {index.peak_block_ops_per_s:,.0f}/s over {RATE_WINDOW_S:g} s)",
            f"               {index.queries:,} queries at {index.queries_per_s:,.0f}/s"
            + (f"; {index.degraded_routes:,} routed by load only" if index.degraded_routes else ""),
        ]
    else:
        lines.append(f"  index        not consulted by the {opts.router} router")
    lines += [
        f"  wall time    {report.wall_s:.2f} s",
    ]
    return "\n".join(lines)
