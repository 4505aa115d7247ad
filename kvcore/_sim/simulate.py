"""Plan a model, build a manager, replay a workload through the scheduler, report."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from kvcore._eviction.registry import select_policy
from kvcore._hashing import HASH_ALGORITHMS
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._planning.plan import KVCachePlan
from kvcore._planning.plan import plan as make_plan
from kvcore._planning.pool_choice import PoolChoice, check_pool
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._sim.belady import BeladyPolicy, FutureUses
from kvcore._sim.ceiling import prefix_reuse_hits
from kvcore._sim.metrics import OP_KINDS, Sample, percentile
from kvcore._sim.report import (
    BlockUse,
    ClassUse,
    EvictionResult,
    GroupPlan,
    GroupUse,
    ManagerTime,
    PlanSummary,
    Preemptions,
    PrefixCacheResult,
    SchedulerSummary,
    SimulationReport,
    StepStats,
    Timing,
    WorkloadSummary,
)
from kvcore._sim.scheduler import Scheduler, SchedulerConfig, SimRequest
from kvcore._sim.workload import Workload
from kvcore.errors import InvalidConfigError
from kvcore.eviction import EvictionPolicyFactory, GroupInfo, PoolInfo

__all__ = ["DEFAULT_MODEL", "SimulationOptions", "plan_for", "simulate"]

#: The model of ``kvcore simulate`` without arguments: hybrid (sliding window + full).
DEFAULT_MODEL = "gpt-oss-20b"
#: The offline eviction oracle, available in the simulator only.
BELADY = "belady"


def _pool(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    check_pool(value)


def _hash_algorithm(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in HASH_ALGORITHMS:
        msg = f"hash algorithm must be one of {', '.join(HASH_ALGORITHMS)}, got {value!r}"
        raise InvalidConfigError(msg)


def _plan_options(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        msg = (
            f"plan_options must be a mapping of plan options to values, "
            f"{{'PLUGIN.NAME': 'VALUE'}}, got {value!r}"
        )
        raise InvalidConfigError(msg)
    return dict(value)


@attrs.frozen(kw_only=True)
class SimulationOptions:
    """What to simulate, besides the workload.

    Attributes:
        model: A shipped model name or a path to a ``config.json``.
        memory: KV cache memory, e.g. ``"80GiB"``.
        max_model_len: Longest request (default: the model's).
        block_size: Tokens per block (default: the planner's choice).
        dtype: KV cache dtype (default: the model's).
        hybrid: ``False``: plan sliding-window and chunked layers as full
            attention, as engines without the hybrid manager do.
        hash_algorithm: ``"fast"`` (default: cheaper, fine for simulation),
            ``"sha256"`` (what a multi-process engine uses) or ``"xxh3_128"``
            (stable across processes, cheaper than ``"sha256"``).
        enable_caching: Prefix caching on (off: every prompt is computed in
            full; the ceiling is still reported).
        scheduler: Scheduler limits and step cost.
        eviction: The pool's eviction policy: a name (``"belady"``: the
            offline oracle, here only) or a factory.
        with_belady: Also replay with the offline oracle and report its hit
            rate next to the policy's (twice the time).
        pool: ``"auto"`` (default), ``"shared"`` or ``"two-level"``: the pool
            design the plan is for (see :func:`kvcore.plan`).
        mamba_checkpoint: Tokens between two cached states of a state group
            (see :func:`kvcore.plan`); default the planner's.
        plan_options: Plugins' plan options, ``{"PLUGIN.NAME": "VALUE"}``
            (see :func:`kvcore.plan`); default each option's default.
    """

    model: str = DEFAULT_MODEL
    memory: str = "80GiB"
    max_model_len: int | None = None
    block_size: int | None = None
    dtype: str | None = None
    hybrid: bool = True
    hash_algorithm: str = attrs.field(default="fast", validator=_hash_algorithm)
    enable_caching: bool = True
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    eviction: str | EvictionPolicyFactory = "lru"
    with_belady: bool = False
    pool: PoolChoice = attrs.field(default="auto", validator=_pool)
    mamba_checkpoint: int | None = None
    plan_options: Mapping[str, str] = attrs.field(factory=dict, converter=_plan_options)


def _group_plans(config: Any, registry: Registry) -> tuple[GroupPlan, ...]:
    pool = config.page_pool
    return tuple(
        GroupPlan(
            kind=group.kv_cache_spec.kind,
            spec=type(group.kv_cache_spec).__name__,
            layers=len(group.layer_names),
            block_size=group.kv_cache_spec.block_size,
            page_size_bytes=group.kv_cache_spec.page_size_bytes,
            prefix_cached=registry.manager_class(group.kv_cache_spec).is_prefix_cacheable(
                group.kv_cache_spec
            ),
            page_class=None if pool is None else pool.group_classes[index],
            pages_per_large_page=(
                1 if pool is None else pool.pages_per_large_page(pool.group_classes[index])
            ),
        )
        for index, group in enumerate(config.kv_cache_groups)
    )


@attrs.frozen
class _Ceilings:
    """The unbounded-cache hits per request at the hit grid, and the total at the finest grid."""

    hits: list[int]
    block_size: int
    fine_tokens: int
    fine_block_size: int


def _ceilings(
    plan: KVCachePlan, groups: Sequence[GroupPlan], accepted: list[SimRequest]
) -> _Ceilings:
    """The ceiling at the hit alignment (lcm of the cached groups' blocks) and at the finest block.

    The finest block is the smallest block size of the model's layers as
    built, before the planner raised one or put states on a checkpoint grid.
    """
    cacheable = [g.block_size for g in groups if g.prefix_cached]
    granularity = math.lcm(*cacheable) if cacheable else 1
    traces = [r.trace for r in accepted]
    hits = prefix_reuse_hits(traces, granularity)
    fine = min((spec.block_size for spec in plan.layer_specs.values()), default=granularity)
    fine_tokens = sum(hits) if fine == granularity else sum(prefix_reuse_hits(traces, fine))
    return _Ceilings(hits, granularity, fine_tokens, fine)


@attrs.frozen
class _Replay:
    """One replay's manager and scheduler, after the run."""

    manager: KVCacheManager
    scheduler: Scheduler


def _replay(
    plan: KVCachePlan,
    registry: Registry,
    options: SimulationOptions,
    accepted: list[SimRequest],
    ceiling_hits: list[int],
    eviction: str | EvictionPolicyFactory,
    progress: Callable[[Scheduler], None] | None,
    attach: Callable[[KVCachePlan, KVCacheManager], Callable[..., None]] | None = None,
) -> _Replay:
    """Build a manager with ``eviction`` and run the scheduler over ``accepted``."""
    oracle: list[BeladyPolicy] = []
    if eviction == BELADY:

        def eviction(info: PoolInfo) -> BeladyPolicy:
            oracle.append(BeladyPolicy(info))
            return oracle[-1]

    manager = KVCacheManager(
        plan.kv_cache_config,
        plan.max_model_len,
        registry=registry,
        hash_algorithm=options.hash_algorithm,
        enable_caching=options.enable_caching,
        eviction=eviction,
    )
    on_lookup = None
    if oracle:
        uses = FutureUses(
            [r.trace for r in accepted],
            ceiling_hits,
            _oracle_groups(oracle),
            manager.hash_block_size,
            options.hash_algorithm,
        )
        for belady in oracle:
            belady.uses = uses

        def on_lookup(entry: SimRequest) -> None:
            uses.now = max(uses.now, entry.index)

    fresh = [SimRequest(r.trace, r.output_target, r.index) for r in accepted]
    on_step = attach(plan, manager) if attach is not None else None
    scheduler = Scheduler(manager, options.scheduler, fresh, on_lookup=on_lookup, on_step=on_step)
    scheduler.run(progress)
    return _Replay(manager, scheduler)


def _oracle_groups(oracles: Sequence[BeladyPolicy]) -> list[GroupInfo]:
    """Every group as the oracle of the pool holding its blocks sees it.

    A shared pool builds one oracle; a two-level pool one per page class,
    each told that the other classes' groups cache nothing in it. The
    oracles share one :class:`FutureUses`, keyed by group, so each group is
    taken from the oracle that caches it.
    """
    groups = list(oracles[0].groups)
    for belady in oracles[1:]:
        for index, info in enumerate(belady.groups):
            if info.prefix_cached:
                groups[index] = info
    return groups


def plan_for(options: SimulationOptions, registry: Registry) -> KVCachePlan:
    """The KV cache plan ``options`` asks for (model, memory, lengths, dtype, budget, pool).

    Raises:
        KVCoreError: an unknown model or a plan that cannot be made.
    """
    return make_plan(
        options.model,
        memory=options.memory,
        max_model_len=options.max_model_len,
        block_size=options.block_size,
        dtype=options.dtype,
        hybrid=options.hybrid,
        registry=registry,
        max_num_batched_tokens=options.scheduler.max_num_batched_tokens,
        pool=options.pool,
        mamba_checkpoint=options.mamba_checkpoint,
        options=options.plan_options,
    )


def simulate(
    workload: Workload,
    options: SimulationOptions | None = None,
    *,
    registry: Registry | None = None,
    progress: Callable[[Scheduler], None] | None = None,
    attach: Callable[[KVCachePlan, KVCacheManager], Callable[..., None]] | None = None,
) -> SimulationReport:
    """Replay ``workload`` on the planned KV cache of ``options.model``.

    Requests whose prompt does not leave room for one output token within
    ``max_model_len`` are rejected (counted, not replayed), as an engine's
    input validation would; outputs are capped at ``max_model_len``.

    Args:
        workload: The requests.
        options: Model, memory, scheduler and eviction policy (default
            :class:`SimulationOptions()`).
        registry: Plugins to serve the groups, and to provide eviction
            policies (default: every installed plugin).
        progress: Called periodically with the scheduler (progress display).
        attach: Called with the plan and the manager before the replay; the
            callable it returns gets every step's scheduled requests (how
            ``--execute`` runs the steps). Not attached to the oracle's
            replay (``with_belady``).

    Raises:
        KVCoreError: an unknown model or eviction policy, memory below one
            ``max_model_len`` request, no request short enough for
            ``max_model_len``, a request the pool cannot hold.
    """
    options = options or SimulationOptions()
    started = time.perf_counter()
    registry = registry if registry is not None else load_registry()
    eviction = options.eviction
    if eviction != BELADY:
        # An unknown name is refused before the plan and the ceiling are worked out.
        eviction = select_policy(eviction, registry.eviction_policies)
    plan = plan_for(options, registry)
    groups = _group_plans(plan.kv_cache_config, registry)
    _check_cacheable(options, groups)
    admitted = admissible(workload, plan.max_model_len)
    ceilings = _ceilings(plan, groups, admitted.accepted)
    ceiling_hits = ceilings.hits
    setup_s = time.perf_counter() - started

    replay_started = time.perf_counter()
    accepted = admitted.accepted
    run = _replay(plan, registry, options, accepted, ceiling_hits, eviction, progress, attach)
    replay_s = time.perf_counter() - replay_started
    belady_hit_tokens = None
    if options.with_belady and options.enable_caching:
        oracle = run if eviction == BELADY else _replay(
            plan, registry, options, accepted, ceiling_hits, BELADY, progress
        )  # fmt: skip
        belady_hit_tokens = oracle.scheduler.hit_tokens
    scheduler = run.scheduler
    manager = _manager_time(scheduler)
    return SimulationReport(
        model=options.model,
        workload=admitted.summary(workload),
        plan=_plan_summary(options, plan, groups),
        scheduler=SchedulerSummary(
            **attrs.asdict(options.scheduler),
            hash_algorithm=options.hash_algorithm,
            prefix_caching=options.enable_caching,
        ),
        eviction=EvictionResult(
            policy=_policy_name(options.eviction),
            evicted_blocks=run.manager.block_pool.num_evicted,
            belady_hit_tokens=belady_hit_tokens,
        ),
        finished=scheduler.num_finished,
        prefix_cache=PrefixCacheResult(
            hit_tokens=scheduler.hit_tokens,
            prompt_tokens=scheduler.prompt_tokens,
            ceiling_tokens=sum(ceiling_hits),
            ceiling_block_size=ceilings.block_size,
            fine_ceiling_tokens=ceilings.fine_tokens,
            fine_block_size=ceilings.fine_block_size,
        ),
        preemptions=Preemptions(
            count=scheduler.num_preemptions,
            requests=len(scheduler.preempted_ids),
            lost_tokens=scheduler.lost_tokens,
            resume_hit_tokens=scheduler.resume_hit_tokens,
        ),
        blocks=_block_use(scheduler, groups, plan),
        steps=_step_stats(scheduler),
        manager=manager,
        timing=Timing(
            total_s=time.perf_counter() - started,
            setup_s=setup_s,
            replay_s=replay_s,
            simulator_overhead_s=replay_s - manager.total_s,
            timer_overhead_ns=scheduler.timer_overhead_ns,
        ),
        samples=tuple(scheduler.sampler.samples),
    )


def _plan_summary(
    options: SimulationOptions, plan: KVCachePlan, groups: tuple[GroupPlan, ...]
) -> PlanSummary:
    return PlanSummary(
        memory=options.memory,
        num_blocks=plan.kv_cache_config.num_blocks,
        max_model_len=plan.max_model_len,
        groups=groups,
        pool=plan.pool,
    )


def _check_cacheable(options: SimulationOptions, groups: Sequence[GroupPlan]) -> None:
    never_cached = sorted({g.kind for g in groups if not g.prefix_cached})
    if options.enable_caching and never_cached:
        msg = (
            f"{options.model} has KV cache groups that are never prefix-cached "
            f"({', '.join(never_cached)}), and the other groups depend on them; "
            "simulate it with prefix caching off (--no-prefix-caching)"
        )
        raise InvalidConfigError(msg)


@attrs.frozen
class Admitted:
    """The requests of a workload an engine accepts, as :func:`admissible` sorted them."""

    accepted: list[SimRequest]
    rejected: int  # prompts leaving no room for one output token
    capped: int  # outputs cut to fit max_model_len

    def summary(self, workload: Workload) -> WorkloadSummary:
        """The workload part of a report."""
        return WorkloadSummary(
            name=workload.name,
            seed=workload.seed,
            requests=len(workload.requests),
            bad_lines=len(workload.bad_lines),
            rejected_too_long=self.rejected,
            output_capped=self.capped,
            prompt_tokens=sum(r.trace.input_length for r in self.accepted),
            output_tokens=sum(r.output_target for r in self.accepted),
        )


def admissible(workload: Workload, max_model_len: int) -> Admitted:
    """The requests of ``workload`` an engine accepts, outputs capped at ``max_model_len``.

    A prompt that leaves no room for one output token is rejected, as an
    engine's input validation would.

    Raises:
        InvalidConfigError: the workload has requests but none is short enough.
    """
    accepted: list[SimRequest] = []
    rejected = capped = 0
    for trace in workload.requests:
        room = max_model_len - trace.input_length
        if room < 1:
            rejected += 1
            continue
        if trace.output_length > room:
            capped += 1
        accepted.append(SimRequest(trace, min(trace.output_length, room), len(accepted)))
    if workload.requests and not accepted:
        longest = max(r.input_length for r in workload.requests)
        msg = (
            f"every request of {workload.name} is too long for max_model_len={max_model_len} "
            f"(the longest prompt has {longest} tokens, and one output token needs room); "
            "raise --max-model-len, or --memory if max_model_len was lowered to fit it"
        )
        raise InvalidConfigError(msg)
    return Admitted(accepted, rejected, capped)


def _policy_name(eviction: object) -> str:
    if isinstance(eviction, str):
        return eviction
    return getattr(eviction, "__name__", type(eviction).__name__)


def _peak_and_mean(values: Sequence[int]) -> tuple[int, float]:
    return max(values, default=0), sum(values) / len(values) if values else 0.0


def _class_use(samples: Sequence[Sample], plan: KVCachePlan) -> tuple[ClassUse, ...]:
    pool = plan.kv_cache_config.page_pool
    if pool is None:
        return ()
    out = []
    for klass in range(pool.num_classes):
        peak, mean = _peak_and_mean([s.class_pages[klass] for s in samples])
        members = tuple(g for g, c in enumerate(pool.group_classes) if c == klass)
        out.append(
            ClassUse(
                page_class=klass,
                page_size_bytes=pool.class_page_bytes[klass],
                groups=members,
                peak=peak,
                mean=mean,
            )
        )
    return tuple(out)


def _block_use(scheduler: Scheduler, groups: Sequence[GroupPlan], plan: KVCachePlan) -> BlockUse:
    samples = scheduler.sampler.samples
    group_use = []
    for index, group in enumerate(groups):
        peak, mean = _peak_and_mean([s.group_blocks[index] for s in samples])
        group_use.append(GroupUse(group=index, kind=group.kind, peak=peak, mean=mean))
    steps = scheduler.step_count
    return BlockUse(
        usable=scheduler.usable_blocks,
        peak=scheduler.peak_used_blocks,
        mean=scheduler.sum_used_blocks / steps if steps else 0.0,
        groups=tuple(group_use),
        samples=len(samples),
        sample_interval_steps=scheduler.sampler.interval,
        unit=scheduler.pool_unit,
        peak_memory_usage=scheduler.peak_memory_usage,
        mean_memory_usage=scheduler.sum_memory_usage / steps if steps else 0.0,
        classes=_class_use(samples, plan),
    )


def _step_stats(scheduler: Scheduler) -> StepStats:
    steps = scheduler.step_count
    return StepStats(
        count=steps,
        with_prefill=scheduler.prefill_steps,
        scheduled_tokens=scheduler.scheduled_tokens,
        simulated_s=scheduler.clock_ms / 1000.0,
        mean_running=scheduler.sum_running / steps if steps else 0.0,
        peak_running=scheduler.peak_running,
    )


def _manager_time(scheduler: Scheduler) -> ManagerTime:
    manager_ns = sum(sum(t.durations) for t in scheduler.op_times)
    per_step = sorted(scheduler.step_manager_ns)
    steps = scheduler.step_count
    decode_steps = scheduler.decode_steps
    return ManagerTime(
        total_s=manager_ns / 1e9,
        per_step_mean_us=manager_ns / steps / 1e3 if steps else 0.0,
        per_step_p50_us=percentile(per_step, 0.50) / 1e3,
        per_step_p99_us=percentile(per_step, 0.99) / 1e3,
        decode_steps=decode_steps,
        per_decode_step_mean_us=(
            scheduler.decode_step_ns / decode_steps / 1e3 if decode_steps else 0.0
        ),
        ops={kind: t.summary() for kind, t in zip(OP_KINDS, scheduler.op_times, strict=True)},
    )
