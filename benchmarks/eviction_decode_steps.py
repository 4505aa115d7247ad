"""Where a decode step's manager time goes, by operation, for each eviction policy.

A *decode step* is a scheduler step in which every scheduled request decoded
one token (``kvcore simulate``'s "per decode step" line): its manager time is
its decode calls, the frees of the requests that finished in it, and any
preemption or admission attempt that found no room (a lookup and an
``allocate_slots`` call that returned ``None``: nothing was admitted).
This replays the built-in workload (gpt-oss-20b, 8 GiB, as the timing
table of ``bench_eviction.py``) once per policy, the replays in
lockstep (``bench_eviction.replay_in_lockstep``: they take turns every 32
steps, so all see the same machine load), and splits the decode steps' time
by operation. Rounds rotate the policies' order; figures are medians over
the rounds. Run::

    python benchmarks/eviction_decode_steps.py
    python benchmarks/eviction_decode_steps.py --policies lru,frequency --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from collections.abc import Sequence
from typing import Any

import bench_eviction
from _common import positive_int, rotated
from _record import Recorder, ratio

from kvcore._sim import SimulationOptions, SimulationReport, load_workload
from kvcore._sim import scheduler as scheduler_module
from kvcore._sim.metrics import OP_KINDS

SHOWN = ("decode", "free", "lookup", "admit", "preempt")


class DecodeStepSplit:
    """Per policy: decode steps seen, and per operation kind its time (ns) and calls in them."""

    def __init__(self) -> None:
        self.steps = 0
        self.ns = dict.fromkeys(OP_KINDS, 0)
        self.calls = dict.fromkeys(OP_KINDS, 0)


def measure(
    workload: Any,
    policies: Sequence[str],
    memory: str,
    max_model_len: int = bench_eviction.BUILTIN_MAX_MODEL_LEN,
) -> tuple[dict[str, DecodeStepSplit], dict[str, SimulationReport]]:
    """One lockstep replay of ``workload`` per policy: each one's decode-step split and report."""
    splits = {policy: DecodeStepSplit() for policy in policies}
    label = threading.local()
    real_step = scheduler_module.Scheduler.step
    real_simulate = bench_eviction.simulate

    def labelled_simulate(workload: Any, options: SimulationOptions, **kwargs: Any) -> Any:
        # Each lockstep replay runs in a thread of its own.
        label.split = splits[options.eviction]
        return real_simulate(workload, options, **kwargs)

    def splitting_step(self: Any) -> None:
        before = [len(times.durations) for times in self.op_times]
        decode_steps = self.decode_steps
        real_step(self)
        if self.decode_steps == decode_steps:
            return
        split = label.split
        split.steps += 1
        for kind, times, start in zip(OP_KINDS, self.op_times, before, strict=True):
            new = times.durations[start:]
            split.ns[kind] += sum(new)
            split.calls[kind] += len(new)

    scheduler_module.Scheduler.step = splitting_step  # type: ignore[method-assign]
    bench_eviction.simulate = labelled_simulate
    try:
        reports = bench_eviction.replay_in_lockstep(
            workload,
            [
                bench_eviction.replay_options(
                    bench_eviction.BUILTIN_MODEL, memory, max_model_len, policy
                )
                for policy in policies
            ],
        )
    finally:
        scheduler_module.Scheduler.step = real_step  # type: ignore[method-assign]
        bench_eviction.simulate = real_simulate
    return splits, dict(zip(policies, reports, strict=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="lru,admit,frequency,cost", help="comma-separated")
    parser.add_argument("--memory", default="8GiB")
    parser.add_argument(
        "--limit", type=positive_int, default=2000, help="built-in workload requests"
    )
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument(
        "--record",
        action="store_true",
        help="write benchmarks/results/eviction-decode-steps-MEMORY.json",
    )
    args = parser.parse_args(argv)
    recorder = Recorder(f"eviction-decode-steps-{args.memory}", enabled=args.record)
    policies = [policy for policy in args.policies.split(",") if policy]
    if not policies or len(set(policies)) != len(policies):
        parser.error(f"--policies needs distinct names, the baseline first; got {args.policies!r}")
    workload = load_workload(None, limit=args.limit)
    rounds = [
        measure(workload, rotated(policies, index), args.memory)[0] for index in range(args.rounds)
    ]

    def per_step(policy: str, kind: str | None = None) -> float:
        """Median over the rounds of µs per decode step (one kind, or all)."""
        values = []
        for splits in rounds:
            split = splits[policy]
            ns = split.ns[kind] if kind else sum(split.ns.values())
            values.append(ns / split.steps / 1e3)
        return statistics.median(values)

    with recorder.section("table"):
        _print_table(args, policies, rounds, per_step, recorder)
    recorder.write()
    return 0


def _print_table(
    args: argparse.Namespace,
    policies: list[str],
    rounds: list[Any],
    per_step: Any,
    recorder: Recorder,
) -> None:
    base = policies[0]
    print(f"built-in workload ({args.limit} requests), gpt-oss-20b, {args.memory}")
    print(f"{args.rounds} lockstep rounds, medians; µs per decode step (calls per step)")
    header = f"{'policy':10} {'steps':>6} {'total':>7} {'x ' + base:>7}"
    print(header + "".join(f" {kind:>16}" for kind in SHOWN))
    for policy in policies:
        split = rounds[0][policy]
        total = per_step(policy)
        line = f"{policy:10} {split.steps:6} {total:7.2f} {total / per_step(base):7.3f}"
        for kind in SHOWN:
            calls = split.calls[kind] / split.steps
            line += f" {per_step(policy, kind):7.2f} ({calls:5.3f})"
            recorder.figure(f"{policy}.{kind}", f"{per_step(policy, kind):.1f} µs")
        print(line)
        recorder.figure(f"{policy}.total", f"{total:.1f} µs")
        recorder.figure(f"{policy}.ratio", ratio(total / per_step(base)))


if __name__ == "__main__":
    sys.exit(main())
