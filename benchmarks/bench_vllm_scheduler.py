"""vLLM 0.14's scheduler step time, stock against kvcore's KVCoreScheduler, on Mooncake.

Both schedulers replay the same requests of the Mooncake conversation trace
in one process, step by step (their order alternates every step): each
step's ``schedule()`` and ``update_from_output()`` are timed, the model's
outputs (made by the tests' lockstep driver, a function of request and
position) are not. Every step's decisions are compared; the run stops at the
first difference. Printed: steps, preemptions, the total and median step
time of each, their ratio (kvcore / stock), and in a second replay of kvcore
alone, what mirroring vLLM's requests costs (the time in the mirror's sync,
measured with a timer around it).

    VENV/bin/python benchmarks/bench_vllm_scheduler.py [--requests 500]
        [--blocks 16384] [--config {full,sliding_window,mamba,eagle} ...] [--record]

``--config`` takes one or more setups, measured one after the other in the
same process; ``--record`` writes them all to
``benchmarks/results/bench-vllm-scheduler.json`` (see ``record``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

from _common import CONVERSATION_TRACE, REPO, positive_int, print_load
from _record import Recorder, command_line, percent, ratio, span, table

#: The tests' lockstep driver (vLLM's requests from the trace, the model's outputs).
LOCKSTEP = REPO / "tests" / "integrations" / "in_vllm"

CONFIGS = ("full", "sliding_window", "mamba", "eagle")
RECORD = "bench-vllm-scheduler"


def setup_for(lockstep: Any, args: argparse.Namespace, config: str) -> Any:
    """The lockstep setup of ``config`` (one of :data:`CONFIGS`) at ``args``' pool size."""
    block = 16
    specs = {
        "full": (lockstep.full_spec(block),),
        "sliding_window": (lockstep.window_spec(block, 128), lockstep.full_spec(block)),
        "mamba": (lockstep.mamba_spec(block), lockstep.full_spec(block)),
        "eagle": (lockstep.full_spec(block),),
    }[config]
    return lockstep.Setup(
        specs=specs,
        num_blocks=args.blocks,
        block_size=block,
        # The longest request must fit in half the pool, or it would wait for ever.
        max_model_len=min(131072, args.blocks * block // 2),
        max_num_batched_tokens=8192,
        num_speculative_tokens=2 if config == "eagle" else 0,
    )


def timed_step(
    lockstep: Any, scheduler: Any, setup: Any, step: int
) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    output = scheduler.schedule()
    scheduled = time.perf_counter()
    result = lockstep.model_output(output, scheduler, step)
    before_update = time.perf_counter()
    scheduler.update_from_output(output, result)
    done = time.perf_counter()
    if setup.num_speculative_tokens:
        lockstep.propose_drafts(scheduler, output, setup.num_speculative_tokens)
    return (scheduled - start) + (done - before_update), lockstep.step_record(output, scheduler)


def replay(
    lockstep: Any,
    schedulers: list[Any],
    requests: list[Any],
    setup: Any,
    on_step: Callable[..., Any],
) -> tuple[list[list[float]], int]:
    """Step the schedulers together; per scheduler, the time of every step."""
    times: list[list[float]] = [[] for _ in schedulers]
    pending = iter(requests)
    remaining, step, preemptions = len(requests), 0, 0
    while remaining or any(s.has_requests() for s in schedulers):
        for trace in [t for _, t in zip(range(4), pending, strict=False)]:
            remaining -= 1
            for scheduler in schedulers:
                scheduler.add_request(lockstep.vllm_request(trace, setup.block_size))
        order = range(len(schedulers)) if step % 2 == 0 else reversed(range(len(schedulers)))
        records: list[Any] = [None] * len(schedulers)
        for index in order:
            seconds, records[index] = timed_step(lockstep, schedulers[index], setup, step)
            times[index].append(seconds)
        on_step(step, records)
        preemptions += len(records[0]["preempted"])
        step += 1
    return times, preemptions


def mirror_cost(
    lockstep: Any, scheduler_cls: Any, requests: list[Any], setup: Any
) -> dict[str, float]:
    """A replay of kvcore alone, timing the mirror's sync: its calls, seconds, and step time."""
    from kvcore.integrations.vllm._mirror import RequestMirror

    spent = [0.0, 0]
    plain = RequestMirror.sync

    def timed_sync(self: Any, request: Any) -> Any:
        start = time.perf_counter()
        try:
            return plain(self, request)
        finally:
            spent[0] += time.perf_counter() - start
            spent[1] += 1

    RequestMirror.sync = timed_sync  # type: ignore[method-assign]
    try:
        scheduler = lockstep.make_scheduler(scheduler_cls, setup)
        times, _ = replay(lockstep, [scheduler], requests, setup, lambda *_: None)
    finally:
        RequestMirror.sync = plain  # type: ignore[method-assign]
    return {"calls": spent[1], "sync_s": spent[0], "step_s": sum(times[0])}


def measure(
    lockstep: Any, schedulers: tuple[Any, Any], args: argparse.Namespace, config: str
) -> dict[str, Any]:
    """One setup: both schedulers in lockstep, then kvcore alone with the mirror timed.

    Returns the steps, preemptions, each scheduler's total and median step time
    (seconds) and the mirror's cost; raises SystemExit at the first step whose
    decisions differ (no timing is reported then).
    """
    setup = setup_for(lockstep, args, config)
    requests = lockstep.mooncake_requests(
        CONVERSATION_TRACE, args.requests, max_model_len=setup.max_model_len, max_tokens=10**6
    )
    built = [lockstep.make_scheduler(cls, setup) for cls in schedulers]

    def compare(step: int, records: list[Any]) -> None:
        if records[0] != records[1]:
            raise SystemExit(f"{config}, step {step}: the schedules differ; no timing is reported")

    times, preemptions = replay(lockstep, built, requests, setup, compare)
    return {
        "config": config,
        "steps": len(times[0]),
        "preemptions": preemptions,
        "total_s": [sum(t) for t in times],
        "median_s": [statistics.median(t) for t in times],
        "mirror": mirror_cost(lockstep, schedulers[1], requests, setup),
    }


def report(result: dict[str, Any], args: argparse.Namespace) -> None:
    """Print one setup's result as the docs show it."""
    (stock, ours), medians = result["total_s"], [1e6 * m for m in result["median_s"]]
    mirror = result["mirror"]
    print(
        f"{result['config']}, {args.requests} Mooncake conversation requests, {args.blocks:,} "
        f"blocks of 16, 8,192 tokens a step: {result['steps']:,} steps identical, "
        f"{result['preemptions']} preemptions"
    )
    print(f"  stock vLLM   total {stock:8.2f} s   median step {medians[0]:8.1f} us")
    print(f"  kvcore       total {ours:8.2f} s   median step {medians[1]:8.1f} us")
    print(
        f"  ratio kvcore / stock: total {ours / stock:.2f}x, median step "
        f"{medians[1] / medians[0]:.2f}x"
    )
    print(
        f"  mirror sync: {mirror['calls']:,} calls, "
        f"{1e6 * mirror['sync_s'] / mirror['calls']:.2f} us each (timer included), "
        f"{100 * mirror['sync_s'] / mirror['step_s']:.1f} % of kvcore's step time in that replay"
    )
    print_load()


def record(recorder: Recorder, results: list[dict[str, Any]]) -> None:
    """The figures and tables of every setup measured, keyed by its ``--config`` name.

    Per setup ``C``: ``C.steps``, ``C.preemptions``, ``C.stock-total`` and
    ``C.kvcore-total`` (seconds), ``C.stock-median`` and ``C.kvcore-median``
    (µs a step), ``C.ratio-total`` and ``C.ratio-median`` (kvcore / stock),
    ``C.mirror-calls``, ``C.mirror-call`` (µs a call), ``C.mirror-share`` (of
    kvcore's step time) and the table ``C`` (both schedulers and the ratio).
    Over all setups: ``mirror-share`` (its range) and the table ``setups``.
    """
    rows, shares = [], []
    for result in results:
        config, (stock, ours), medians = result["config"], result["total_s"], result["median_s"]
        mirror = result["mirror"]
        share = mirror["sync_s"] / mirror["step_s"]
        shares.append(share)
        cells = {
            "steps": f"{result['steps']:,}",
            "preemptions": f"{result['preemptions']:,}",
            "stock-total": f"{stock:.2f} s",
            "kvcore-total": f"{ours:.2f} s",
            "stock-median": f"{1e6 * medians[0]:.1f} µs",
            "kvcore-median": f"{1e6 * medians[1]:.1f} µs",
            "ratio-total": ratio(ours / stock),
            "ratio-median": ratio(medians[1] / medians[0]),
            "mirror-calls": f"{mirror['calls']:,}",
            "mirror-call": f"{1e6 * mirror['sync_s'] / mirror['calls']:.2f} µs",
            "mirror-share": percent(share),
        }
        for key, text in cells.items():
            recorder.figure(f"{config}.{key}", text)
        recorder.tables[config] = table(
            f"{config}: step time",
            ["scheduler", "total", "median step"],
            [
                ["vLLM 0.14 (stock)", cells["stock-total"], cells["stock-median"]],
                ["vLLM 0.14 on kvcore", cells["kvcore-total"], cells["kvcore-median"]],
                ["kvcore / stock", cells["ratio-total"], cells["ratio-median"]],
            ],
        )
        rows.append(
            [
                config,
                cells["steps"],
                cells["preemptions"],
                cells["ratio-total"],
                cells["ratio-median"],
                cells["mirror-share"],
            ]
        )
        recorder.data[config] = result
    recorder.figure("mirror-share", span(min(shares) * 100, max(shares) * 100, "{:.1f}", " %"))
    recorder.tables["setups"] = table(
        "kvcore / stock, per setup",
        ["setup", "steps", "preemptions", "total", "median step", "mirror share"],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=positive_int, default=500)
    parser.add_argument("--blocks", type=positive_int, default=16384)
    parser.add_argument(
        "--config",
        choices=CONFIGS,
        nargs="+",
        default=["full"],
        help="one or more setups, measured one after the other (default: full)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help=f"write benchmarks/results/{RECORD}.json (every setup measured)",
    )
    args = parser.parse_args(argv)
    if len(set(args.config)) != len(args.config):
        parser.error(f"argument --config: a setup named twice: {' '.join(args.config)}")
    # main(argv) from a test records argv, not the test runner's command line.
    ran = command_line([__file__, *(sys.argv[1:] if argv is None else argv)])
    recorder = Recorder(RECORD, enabled=args.record, command=ran)
    if str(LOCKSTEP) not in sys.path:
        sys.path.insert(0, str(LOCKSTEP))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lockstep
        from vllm.v1.core.sched.scheduler import Scheduler

        from kvcore.integrations.vllm import KVCoreScheduler
    results = []
    for config in args.config:
        result = measure(lockstep, (Scheduler, KVCoreScheduler), args, config)
        with recorder.section(config):
            report(result, args)
        results.append(result)
    record(recorder, results)
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
