"""The result of a simulation: typed values, their JSON form and a text report.

:class:`SimulationReport` is a tree of frozen attrs classes, one per section
of the report; code reads fields (``report.prefix_cache.hit_rate``), never
string keys. :meth:`SimulationReport.to_dict` gives the JSON printed by
``kvcore simulate --json``: one object per section, with the derived rates
next to the counts they come from (see :doc:`/reference/cli` for the shape).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvcore._sim.metrics import OpSummary, Sample

__all__ = [
    "BlockUse",
    "ClassUse",
    "EvictionResult",
    "GroupPlan",
    "GroupUse",
    "ManagerTime",
    "OpSummary",
    "PlanSummary",
    "Preemptions",
    "PrefixCacheResult",
    "SchedulerSummary",
    "SimulationReport",
    "StepStats",
    "Timing",
    "WorkloadSummary",
    "format_report",
]


def _ratio(numerator: float, denominator: float, empty: float = 0.0) -> float:
    return numerator / denominator if denominator else empty


@attrs.frozen(kw_only=True)
class WorkloadSummary:
    """What was replayed.

    Attributes:
        name: The trace path, or a description of the generated workload.
        seed: The generator's seed (``None`` for a trace).
        requests: Requests in the workload.
        bad_lines: Trace lines skipped as malformed.
        rejected_too_long: Requests whose prompt leaves no room for one output
            token within ``max_model_len`` (not replayed).
        output_capped: Requests whose output was cut to fit ``max_model_len``.
        prompt_tokens: Prompt tokens of the replayed requests.
        output_tokens: Output tokens of the replayed requests.
    """

    name: str
    seed: int | None
    requests: int
    bad_lines: int
    rejected_too_long: int
    output_capped: int
    prompt_tokens: int
    output_tokens: int


@attrs.frozen(kw_only=True)
class GroupPlan:
    """One KV cache group of the plan.

    Attributes:
        kind: The spec's attention kind.
        spec: The spec class name.
        layers: Layers in the group.
        block_size: Tokens per block.
        page_size_bytes: Bytes per block.
        prefix_cached: Whether the group's blocks are prefix-cached.
        page_class: The group's page class in a two-level pool (``None``:
            shared pool).
        pages_per_large_page: Its small pages in one large page (1 in a
            shared pool, where a block is the pool's unit).
    """

    kind: str
    spec: str
    layers: int
    block_size: int
    page_size_bytes: int
    prefix_cached: bool
    page_class: int | None = None
    pages_per_large_page: int = 1


@attrs.frozen(kw_only=True)
class PlanSummary:
    """The planned KV cache.

    Attributes:
        memory: The memory asked for (as given, e.g. ``"80GiB"``).
        num_blocks: Blocks in the pool, the null block included (large pages
            in a two-level pool).
        max_model_len: Longest request.
        groups: The groups, by group id.
        pool: ``"shared"`` or ``"two-level"``.
    """

    memory: str
    num_blocks: int
    max_model_len: int
    groups: tuple[GroupPlan, ...]
    pool: str = "shared"


@attrs.frozen(kw_only=True)
class SchedulerSummary:
    """The scheduler's limits and the manager's options.

    Attributes:
        max_num_batched_tokens: Token budget of a step.
        max_num_seqs: Most running requests.
        arrival: ``"timestamp"`` or ``"asap"``.
        step_ms: Simulated fixed cost of a step.
        token_us: Simulated cost per scheduled token.
        hash_algorithm: The block hash.
        prefix_caching: Whether prefix caching was on.
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    arrival: str
    step_ms: float
    token_us: float
    hash_algorithm: str
    prefix_caching: bool


@attrs.frozen(kw_only=True)
class PrefixCacheResult:
    """Prefix-cache hits at first admission, and the workload's unbounded ceiling.

    Attributes:
        hit_tokens: Prompt tokens found in the cache at first admission.
        prompt_tokens: Prompt tokens of the first admissions.
        ceiling_tokens: Prompt tokens an unbounded cache would serve.
        ceiling_block_size: Granularity of the ceiling (the hit alignment).
        fine_ceiling_tokens: Prompt tokens an unbounded cache would serve at
            :attr:`fine_block_size` (equal to ``ceiling_tokens`` when the two
            granularities agree).
        fine_block_size: The smallest block size of the model's layers as
            planned before any was raised or checkpointed (16 tokens for the
            planner's default): the finest grid a hit could fall on, the
            same for every pool, so that pools are judged alike.
    """

    hit_tokens: int
    prompt_tokens: int
    ceiling_tokens: int
    ceiling_block_size: int
    fine_ceiling_tokens: int
    fine_block_size: int

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / prompt_tokens``."""
        return _ratio(self.hit_tokens, self.prompt_tokens)

    @property
    def ceiling_rate(self) -> float:
        """``ceiling_tokens / prompt_tokens``."""
        return _ratio(self.ceiling_tokens, self.prompt_tokens)

    @property
    def fraction_of_ceiling(self) -> float:
        """``hit_rate / ceiling_rate`` (1.0 when the ceiling is 0)."""
        return _ratio(self.hit_rate, self.ceiling_rate, 1.0)

    @property
    def fine_ceiling_rate(self) -> float:
        """``fine_ceiling_tokens / prompt_tokens``."""
        return _ratio(self.fine_ceiling_tokens, self.prompt_tokens)

    @property
    def fraction_of_fine_ceiling(self) -> float:
        """``hit_rate / fine_ceiling_rate`` (1.0 when that ceiling is 0)."""
        return _ratio(self.hit_rate, self.fine_ceiling_rate, 1.0)


@attrs.frozen(kw_only=True)
class EvictionResult:
    """The eviction policy and what it gave up.

    Attributes:
        policy: The policy's name.
        evicted_blocks: Cached blocks taken for new allocations (their cached
            content lost).
        belady_hit_tokens: Prompt tokens the offline optimum (Belady) hit on
            the same workload and pool, when it was measured too
            (``--with-belady``); else ``None``.
    """

    policy: str
    evicted_blocks: int
    belady_hit_tokens: int | None = None


@attrs.frozen(kw_only=True)
class Preemptions:
    """Requests preempted (blocks freed, recomputed later).

    Attributes:
        count: Preemptions.
        requests: Distinct requests preempted.
        lost_tokens: Computed tokens thrown away.
        resume_hit_tokens: Of those, found again in the cache on resumption.
    """

    count: int
    requests: int
    lost_tokens: int
    resume_hit_tokens: int


@attrs.frozen(kw_only=True)
class GroupUse:
    """Blocks held by requests in one group (sampled).

    Attributes:
        group: The group id.
        kind: Its attention kind.
        peak: Most distinct blocks held at a sample.
        mean: Mean over the samples.
    """

    group: int
    kind: str
    peak: int
    mean: float


@attrs.frozen(kw_only=True)
class ClassUse:
    """The large pages one page class of a two-level pool owned (sampled).

    A class owns a large page from the moment it is carved for it until it
    goes back to the common pool: while any of its small pages is in use or
    still caches a prefix.

    Attributes:
        page_class: The class.
        page_size_bytes: Its small page, in bytes (in one backing run).
        groups: Its groups' ids.
        peak: Most large pages owned at a sample.
        mean: Mean over the samples.
    """

    page_class: int
    page_size_bytes: int
    groups: tuple[int, ...]
    peak: int
    mean: float


@attrs.frozen(kw_only=True)
class BlockUse:
    """Pool use, exact per step (pool) and sampled (groups, classes).

    In a two-level pool the pool's unit is the large page: ``usable``,
    ``peak`` and ``mean`` count large pages of which at least one small page
    is in use (memory no other class can have), while the memory usages
    count the small pages in use by their size.

    Attributes:
        usable: Blocks of the pool but the null block (large pages but large
            page 0 in a two-level pool).
        peak: Most blocks held at the end of a step (large pages with a
            small page in use).
        mean: Mean blocks held per step (the same unit).
        groups: Per group, sampled: distinct blocks (small pages) held.
        samples: Samples taken.
        sample_interval_steps: Steps between samples at the end of the run.
        unit: ``"blocks"`` or ``"large pages"``: what ``usable``, ``peak``
            and ``mean`` count.
        peak_memory_usage: Most memory held by blocks in use at the end of a
            step, as a share of the pool (0.0 to 1.0; ``peak_usage`` in a
            shared pool).
        mean_memory_usage: Its mean per step.
        classes: Per page class, sampled (empty for a shared pool).
    """

    usable: int
    peak: int
    mean: float
    groups: tuple[GroupUse, ...]
    samples: int
    sample_interval_steps: int
    unit: str = "blocks"
    peak_memory_usage: float = 0.0
    mean_memory_usage: float = 0.0
    classes: tuple[ClassUse, ...] = ()

    @property
    def peak_usage(self) -> float:
        """``peak / usable``."""
        return _ratio(self.peak, self.usable)

    @property
    def mean_usage(self) -> float:
        """``mean / usable``."""
        return _ratio(self.mean, self.usable)


@attrs.frozen(kw_only=True)
class StepStats:
    """The steps of the run.

    Attributes:
        count: Steps run.
        with_prefill: Steps that scheduled a prefill chunk.
        scheduled_tokens: Tokens scheduled over all steps.
        simulated_s: Simulated time at the end.
        mean_running: Mean running requests per step.
        peak_running: Most requests running at the end of a step.
    """

    count: int
    with_prefill: int
    scheduled_tokens: int
    simulated_s: float
    mean_running: float
    peak_running: int = 0


@attrs.frozen(kw_only=True)
class ManagerTime:
    """Time spent inside the KV cache manager (varies from run to run).

    Attributes:
        total_s: All manager calls.
        per_step_mean_us: Mean per step.
        per_step_p50_us: Median per step.
        per_step_p99_us: 99th percentile per step.
        decode_steps: Steps in which every scheduled request decoded one
            token (no admission, no prefill chunk): an engine's decode steps,
            with the frees, preemptions and refused admissions (a lookup,
            then an ``allocate_slots`` that found no room) they brought.
        per_decode_step_mean_us: Mean per decode step (0 without any).
        ops: Per kind of call (``lookup``, ``admit``, ``prefill``, ``decode``,
            ``free``, ``preempt``), in that order.
    """

    total_s: float
    per_step_mean_us: float
    per_step_p50_us: float
    per_step_p99_us: float
    decode_steps: int
    per_decode_step_mean_us: float
    ops: Mapping[str, OpSummary]


@attrs.frozen(kw_only=True)
class Timing:
    """Wall-clock time of the run (varies from run to run).

    Attributes:
        total_s: Everything, setup included.
        setup_s: Planning, building the manager and the oracle.
        replay_s: The replay.
        simulator_overhead_s: Replay time outside the manager.
        timer_overhead_ns: Calibrated cost of one timing interval.
    """

    total_s: float
    setup_s: float
    replay_s: float
    simulator_overhead_s: float
    timer_overhead_ns: int


# Derived values written to JSON after each section's fields.
_DERIVED: dict[type, tuple[str, ...]] = {
    PrefixCacheResult: (
        "hit_rate",
        "ceiling_rate",
        "fraction_of_ceiling",
        "fine_ceiling_rate",
        "fraction_of_fine_ceiling",
    ),
    BlockUse: ("peak_usage", "mean_usage"),
}


def _to_json(value: object) -> Any:
    kind: Any = type(value)
    if attrs.has(kind):
        out = {field.name: _to_json(getattr(value, field.name)) for field in attrs.fields(kind)}
        for name in _DERIVED.get(type(value), ()):
            out[name] = getattr(value, name)
        return out
    if isinstance(value, Mapping):
        return {key: _to_json(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return [_to_json(item) for item in value]
    return value


@attrs.frozen(kw_only=True)
class SimulationReport:
    """Everything a simulation measured.

    ``manager`` and ``timing`` vary from run to run; every other field is a
    function of the workload, the plan, the scheduler options and the
    eviction policy.

    Attributes:
        model: The model simulated.
        workload: What was replayed.
        plan: The planned KV cache.
        scheduler: Scheduler limits and manager options.
        eviction: The eviction policy and its figures.
        finished: Requests that finished.
        prefix_cache: Hits and the ceiling.
        preemptions: Preemptions.
        blocks: Pool use.
        steps: The steps.
        manager: Time in the manager.
        timing: Wall-clock time.
        samples: Usage and hit rate over the run (evenly spaced steps).
    """

    model: str
    workload: WorkloadSummary
    plan: PlanSummary
    scheduler: SchedulerSummary
    eviction: EvictionResult
    finished: int
    prefix_cache: PrefixCacheResult
    preemptions: Preemptions
    blocks: BlockUse
    steps: StepStats
    manager: ManagerTime
    timing: Timing
    samples: tuple[Sample, ...] = ()

    @property
    def belady_rate(self) -> float | None:
        """The offline optimum's hit rate on the same run, if measured."""
        tokens = self.eviction.belady_hit_tokens
        return None if tokens is None else _ratio(tokens, self.prefix_cache.prompt_tokens)

    def to_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        """The report as plain JSON-ready values (the ``--json`` output).

        One object per section (``workload``, ``plan``, ``scheduler``,
        ``eviction``, ``prefix_cache``, ``preemptions``, ``blocks``,
        ``steps``, ``manager``, ``timing``) plus ``model`` and ``finished``;
        rates are written next to the counts they derive from.

        Args:
            timeline: Include ``timeline``: one list per field of
                :class:`~kvcore._sim.metrics.Sample`.
        """
        out: dict[str, Any] = {}
        for field in attrs.fields(SimulationReport):
            if field.name != "samples":
                out[field.name] = _to_json(getattr(self, field.name))
        if self.belady_rate is not None:
            out["eviction"]["belady_hit_rate"] = self.belady_rate
        if timeline:
            out["timeline"] = {
                "step": [s.step for s in self.samples],
                "time_s": [round(s.time_s, 3) for s in self.samples],
                "used_blocks": [s.used_blocks for s in self.samples],
                "group_blocks": [list(s.group_blocks) for s in self.samples],
                "class_pages": [list(s.class_pages) for s in self.samples],
                "running": [s.running for s in self.samples],
                "waiting": [s.waiting for s in self.samples],
                "hit_rate": [round(s.hit_rate, 6) for s in self.samples],
            }
        return out


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _hits_line(pc: PrefixCacheResult) -> str:
    line = (
        f"  prefix hits  {_pct(pc.hit_rate)} of prompt tokens ({pc.hit_tokens:,}); "
        f"unbounded-cache ceiling {_pct(pc.ceiling_rate)} at {pc.ceiling_block_size}-token "
        f"blocks ({_pct(pc.fraction_of_ceiling)} of it reached)"
    )
    if pc.fine_block_size != pc.ceiling_block_size:
        line += (
            f", {_pct(pc.fine_ceiling_rate)} at {pc.fine_block_size}-token blocks "
            f"({_pct(pc.fraction_of_fine_ceiling)})"
        )
    return line


def _block_lines(blocks: BlockUse) -> list[str]:
    """The pool's use (in its unit; memory too for a two-level pool), then per group and class."""
    line = (
        f"  blocks       pool of {blocks.usable:,} {blocks.unit}: peak {blocks.peak:,} "
        f"({_pct(blocks.peak_usage)}), mean {blocks.mean:,.0f} ({_pct(blocks.mean_usage)})"
    )
    if blocks.classes:
        line += (
            f" holding a block in use; memory in blocks in use peak "
            f"{_pct(blocks.peak_memory_usage)}, mean {_pct(blocks.mean_memory_usage)}"
        )
    lines = [line]
    lines.extend(
        f"               group {g.group} {g.kind}: peak {g.peak:,}, mean {g.mean:,.0f} blocks held"
        for g in blocks.groups
    )
    lines.extend(
        f"               class {c.page_class} ({_size(c.page_size_bytes)} pages, groups "
        f"{', '.join(map(str, c.groups))}): peak {c.peak:,}, mean {c.mean:,.0f} large pages owned"
        for c in blocks.classes
    )
    return lines


def _size(num_bytes: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes} B"


def format_report(report: SimulationReport) -> str:
    """The report as aligned lines of text, for a terminal."""
    wl, plan, sched = report.workload, report.plan, report.scheduler
    pc, pre, blocks, steps = report.prefix_cache, report.preemptions, report.blocks, report.steps
    mgr, timing, eviction = report.manager, report.timing, report.eviction
    by_kind: dict[str, list[GroupPlan]] = {}
    for g in plan.groups:
        by_kind.setdefault(g.kind, []).append(g)
    groups = ", ".join(
        f"{kind} ({sum(g.layers for g in gs)} layers, {len(gs)} group"
        f"{'s' if len(gs) > 1 else ''}, block {gs[0].block_size})"
        for kind, gs in by_kind.items()
    )
    belady = report.belady_rate
    lines = [
        f"kvcore simulate: {report.model} on {wl.name}",
        f"  plan         {groups}; {plan.num_blocks:,} "
        f"{'large pages (two-level pool)' if plan.pool == 'two-level' else 'blocks'}, "
        f"max_model_len {plan.max_model_len:,}, {plan.memory}",
        f"  scheduler    {sched.max_num_batched_tokens:,} tokens/step, "
        f"<= {sched.max_num_seqs} running, arrivals {sched.arrival}, step cost "
        f"{sched.step_ms:g} ms + {sched.token_us:g} µs/token, "
        + (f"{sched.hash_algorithm} hash" if sched.prefix_caching else "prefix caching off"),
        f"  requests     {report.finished:,} finished of {wl.requests:,}; "
        f"{wl.rejected_too_long} rejected (prompt >= max_model_len), "
        f"{wl.output_capped} outputs capped, {wl.bad_lines} bad lines skipped",
        f"  tokens       {wl.prompt_tokens:,} prompt, {wl.output_tokens:,} output",
        _hits_line(pc),
        f"  eviction     {eviction.policy}: {eviction.evicted_blocks:,} cached blocks evicted"
        + (
            f"; offline optimum (belady) {_pct(belady)}"
            if belady is not None and eviction.policy != "belady"
            else ""
        ),
        f"  preemptions  {pre.count:,} ({pre.requests:,} requests); {pre.lost_tokens:,} "
        f"computed tokens dropped, {pre.resume_hit_tokens:,} found again in the cache",
        *_block_lines(blocks),
    ]
    lines += [
        f"               (per group: {blocks.samples} samples, one every "
        f"{blocks.sample_interval_steps} steps)",
        f"  steps        {steps.count:,} ({steps.with_prefill:,} with prefill), "
        f"{steps.simulated_s:,.1f} s simulated, {steps.mean_running:.1f} running on average, "
        f"{steps.peak_running:,} at most",
        f"  manager      {mgr.total_s:.3f} s in kvcore; per step p50 "
        f"{mgr.per_step_p50_us:.1f} µs, p99 {mgr.per_step_p99_us:.1f} µs, "
        f"mean {mgr.per_step_mean_us:.1f} µs",
        f"               per decode step mean {mgr.per_decode_step_mean_us:.1f} µs "
        f"({mgr.decode_steps:,} steps that only decoded)",
    ]
    for kind, op in mgr.ops.items():
        if op.count:
            lines.append(
                f"               {kind:<8} {op.count:>10,} calls, mean {op.mean_us:8.2f} µs, "
                f"p50 {op.p50_us:8.2f} µs, p99 {op.p99_us:9.2f} µs"
            )
    lines.append(
        f"  wall time    {timing.total_s:.2f} s: setup {timing.setup_s:.2f} s, replay "
        f"{timing.replay_s:.2f} s (kvcore {mgr.total_s:.2f} s, simulator "
        f"{timing.simulator_overhead_s:.2f} s)"
    )
    return "\n".join(lines)
