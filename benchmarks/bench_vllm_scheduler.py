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
        [--blocks 16384] [--config full|sliding_window|mamba|eagle]
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

sys.path.insert(0, str(REPO / "tests" / "integrations" / "vllm"))

CONFIGS = ("full", "sliding_window", "mamba", "eagle")


def setup_for(lockstep: Any, args: argparse.Namespace) -> Any:
    block = 16
    specs = {
        "full": (lockstep.full_spec(block),),
        "sliding_window": (lockstep.window_spec(block, 128), lockstep.full_spec(block)),
        "mamba": (lockstep.mamba_spec(block), lockstep.full_spec(block)),
        "eagle": (lockstep.full_spec(block),),
    }[args.config]
    return lockstep.Setup(
        specs=specs,
        num_blocks=args.blocks,
        block_size=block,
        # The longest request must fit in half the pool, or it would wait for ever.
        max_model_len=min(131072, args.blocks * block // 2),
        max_num_batched_tokens=8192,
        num_speculative_tokens=2 if args.config == "eagle" else 0,
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


def mirror_cost(lockstep: Any, scheduler_cls: Any, requests: list[Any], setup: Any) -> str:
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
    total = sum(times[0])
    return (
        f"mirror sync: {spent[1]:,} calls, {1e6 * spent[0] / spent[1]:.2f} us each (timer "
        f"included), {100 * spent[0] / total:.1f} % of kvcore's step time in that replay"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=positive_int, default=500)
    parser.add_argument("--blocks", type=positive_int, default=16384)
    parser.add_argument("--config", choices=CONFIGS, default="full")
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import lockstep
        from vllm.v1.core.sched.scheduler import Scheduler

        from kvcore.integrations.vllm import KVCoreScheduler
    setup = setup_for(lockstep, args)
    requests = lockstep.mooncake_requests(
        CONVERSATION_TRACE, args.requests, max_model_len=setup.max_model_len, max_tokens=10**6
    )
    schedulers = [lockstep.make_scheduler(cls, setup) for cls in (Scheduler, KVCoreScheduler)]

    def compare(step: int, records: list[Any]) -> None:
        if records[0] != records[1]:
            raise SystemExit(f"step {step}: the schedules differ; no timing is reported")

    times, preemptions = replay(lockstep, schedulers, requests, setup, compare)
    stock, ours = (sum(t) for t in times)
    medians = [statistics.median(t) * 1e6 for t in times]
    print(
        f"{args.config}, {args.requests} Mooncake conversation requests, {args.blocks:,} "
        f"blocks of 16, 8,192 tokens a step: {len(times[0]):,} steps identical, "
        f"{preemptions} preemptions"
    )
    print(f"  stock vLLM   total {stock:8.2f} s   median step {medians[0]:8.1f} us")
    print(f"  kvcore       total {ours:8.2f} s   median step {medians[1]:8.1f} us")
    print(
        f"  ratio kvcore / stock: total {ours / stock:.2f}x, median step "
        f"{medians[1] / medians[0]:.2f}x"
    )
    print("  " + mirror_cost(lockstep, KVCoreScheduler, requests, setup))
    print_load()
    return 0


if __name__ == "__main__":
    sys.exit(main())
