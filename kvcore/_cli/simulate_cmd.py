"""``kvcore simulate``: replay a workload through a continuous-batching scheduler."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

import attrs

from kvcore._cli.fleet_options import add_fleet_options, reject_fleet_options, run_fleet
from kvcore._cli.plugins_cmd import (
    add_plan_option_argument,
    add_selection_options,
    plan_options_from_args,
    registry_from_args,
)
from kvcore._cli.pool_options import add_pool_options
from kvcore._hashing import HASH_ALGORITHMS
from kvcore._sim.report import format_report
from kvcore._sim.scheduler import ARRIVAL_MODES, SchedulerConfig
from kvcore._sim.simulate import DEFAULT_MODEL, SimulationOptions, simulate
from kvcore._sim.workload import DEFAULT_NUM_REQUESTS, load_workload
from kvcore.errors import InvalidConfigError

if TYPE_CHECKING:
    from kvcore._exec.report import ExecutionReport
    from kvcore._registry import Registry
    from kvcore._sim.report import SimulationReport
    from kvcore._sim.workload import Workload

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Register the ``simulate`` subcommand."""
    parser = subparsers.add_parser(
        "simulate",
        help="replay a request trace (or the built-in workload) through the KV cache manager",
        description=(
            "Plan MODEL's KV cache, then replay a workload through a continuous-batching "
            "scheduler (FCFS, chunked prefill under a token budget, one decode token per "
            "running request per step, prefix-cache lookup on admission, preemption by "
            "recompute when the pool is full) that drives kvcore's KVCacheManager as an "
            "engine would. Reports the prefix-hit rate next to the workload's "
            "unbounded-cache ceiling, preemptions, block use per group, steps and the "
            "time spent in kvcore per step and per operation. Without --trace, replays "
            f"the built-in workload ({DEFAULT_NUM_REQUESTS} requests of multi-turn "
            "conversations, see 'kvcore workload')."
        ),
    )
    parser.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        metavar="MODEL",
        help=f"a shipped model name or a path to a config.json (default: {DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--trace",
        metavar="PATH",
        help="JSONL workload: Mooncake lines (hash_ids) or explicit prompt_token_ids "
        "(default: the built-in workload)",
    )
    parser.add_argument(
        "--memory", default="80GiB", help="KV cache memory, e.g. 80GiB or 512MiB (default: 80GiB)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="longest request in tokens, prompt plus output (default: the model's)",
    )
    parser.add_argument(
        "--block-size", type=int, metavar="N", help="tokens per block (default: the planner's)"
    )
    parser.add_argument(
        "--dtype",
        metavar="NAME",
        help="KV cache dtype: a plain dtype such as fp8, or a KV format a plugin declares "
        "('kvcore plugins' lists them) (default: the model's)",
    )
    parser.add_argument(
        "--no-hybrid",
        action="store_true",
        help="plan the layers of local attention types (windows, chunks) for every token, "
        "in one block table, as engines without the hybrid manager do",
    )
    add_pool_options(parser)
    add_plan_option_argument(parser)
    add_selection_options(parser)
    defaults = SchedulerConfig()
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=defaults.max_num_batched_tokens,
        metavar="N",
        help="token budget of one step: prefill chunks plus decode tokens "
        f"(default: {defaults.max_num_batched_tokens})",
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=defaults.max_num_seqs,
        metavar="N",
        help=f"most requests running at once (default: {defaults.max_num_seqs})",
    )
    parser.add_argument(
        "--arrival",
        choices=ARRIVAL_MODES,
        default=defaults.arrival,
        help="'timestamp': requests arrive at their trace time on a simulated clock; "
        "'asap': all are waiting from the start (default: timestamp)",
    )
    parser.add_argument(
        "--step-ms",
        type=float,
        default=defaults.step_ms,
        metavar="MS",
        help=f"simulated fixed cost of a step in ms (default: {defaults.step_ms:g})",
    )
    parser.add_argument(
        "--token-us",
        type=float,
        default=defaults.token_us,
        metavar="US",
        help=f"simulated cost per scheduled token in µs (default: {defaults.token_us:g})",
    )
    parser.add_argument(
        "--hash",
        choices=HASH_ALGORITHMS,
        default="fast",
        help="block hash: 'fast' (Python's hash; same hits, cheaper; the default for "
        "simulation), 'sha256' (what a multi-process engine uses) or 'xxh3_128' (stable "
        "across processes, about twice as fast as sha256; needs the xxhash package)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="turn prefix caching off: every prompt is computed in full (the ceiling is "
        "still reported); needed for models with layers that are never prefix-cached",
    )
    parser.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="seed of the built-in workload (default: 0); not with --trace",
    )
    parser.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="replay the first N requests of the trace (built-in workload: generate N; "
        f"default {DEFAULT_NUM_REQUESTS})",
    )
    parser.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip malformed trace lines and count them in the report "
        "(default: stop at the first, naming file, line and reason)",
    )
    parser.add_argument(
        "--execute",
        action="store_true",
        help="also run a tiny model through the cache, step by step, and check every output "
        "against the same model run with no cache (CUDA if available, else CPU; for tiny "
        "models such as tiny-hybrid, see kvcore.executor, with a small --memory)",
    )
    add_fleet_options(parser)
    parser.add_argument(
        "--eviction",
        default="lru",
        metavar="NAME",
        help="eviction policy of the block pool: lru (default, the reference engine's), "
        "admit, frequency, cost, a plugin's policy, or belady (the offline optimum, "
        "which knows the trace's future)",
    )
    parser.add_argument(
        "--with-belady",
        action="store_true",
        help="replay the workload a second time with the offline optimum (belady) and "
        "report its hit rate next to the policy's",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw block use and hit rate over time into a PNG (needs matplotlib: "
        "pip install 'kvcore[plot]')",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the simulation and print its report."""
    if args.engines is not None:
        workload, options, registry = _inputs(args)
        return run_fleet(args, workload, options, registry)
    report, execution = simulate_from_args(args)
    if args.json:
        data = report.to_dict()
        if execution is not None:
            data["execution"] = execution.to_dict()
        print(json.dumps(data, indent=2))
    else:
        print(format_report(report))
        if args.plot is not None:
            print(f"  plot         {args.plot}")
        if execution is not None:
            from kvcore._exec.report import format_execution

            print(format_execution(execution))
    return 0


def _inputs(args: argparse.Namespace) -> tuple[Workload, SimulationOptions, Registry]:
    """The workload, the simulation options and the registry the arguments ask for."""
    if args.plot is not None:
        if not args.plot.lower().endswith(".png"):
            msg = f"--plot writes a PNG image; give a file name ending in .png, not {args.plot!r}"
            raise InvalidConfigError(msg)
        from kvcore._sim.plot import _pyplot

        _pyplot()  # fail before a long run, not after it
    scheduler = SchedulerConfig(
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_seqs=args.max_num_seqs,
        arrival=args.arrival,
        step_ms=args.step_ms,
        token_us=args.token_us,
    )
    options = SimulationOptions(
        model=args.model,
        memory=args.memory,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        dtype=args.dtype,
        hybrid=not args.no_hybrid,
        hash_algorithm=args.hash,
        enable_caching=not args.no_prefix_caching,
        scheduler=scheduler,
        eviction=args.eviction,
        with_belady=args.with_belady,
        pool=args.pool,
        mamba_checkpoint=args.mamba_checkpoint,
        plan_options=plan_options_from_args(args),
    )
    workload = load_workload(
        args.trace, limit=args.limit, seed=args.seed, skip_bad_lines=args.skip_bad_lines
    )
    return workload, options, registry_from_args(args)


def simulate_from_args(
    args: argparse.Namespace,
) -> tuple[SimulationReport, ExecutionReport | None]:
    """One engine's simulation as the arguments ask: ``(report, execution or None)``.

    Draws the ``--plot`` if asked; prints nothing but progress. The benchmarks
    that record the docs' runs call it to keep the report's figures.
    """
    from kvcore._sim.progress import progress_printer

    workload, options, registry = _inputs(args)
    reject_fleet_options(args)
    executor = None
    if args.execute:
        from kvcore._exec.simulate import SimulationExecutor, resolve_model

        executor = SimulationExecutor()
        options = attrs.evolve(options, model=resolve_model(args.model))
    report = simulate(
        workload,
        options,
        registry=registry,
        progress=progress_printer(),
        attach=executor.attach if executor is not None else None,
    )
    execution = executor.report() if executor is not None else None
    if args.plot is not None:
        from kvcore._sim.plot import plot_report

        plot_report(report, args.plot)
    return report, execution
