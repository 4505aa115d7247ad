"""The manager's time per scheduler step under the two-level pool and the shared one.

Replays the built-in workload through ``kvcore simulate`` once per pool
(``--pool shared`` and ``--pool two-level``) for each model, the two replays
in lockstep (``bench_eviction.replay_in_lockstep``: they take turns every 32
steps, so both see the same machine load). Reports kvcore's mean time per
decode step (a step in which every scheduled request decoded one token) and
per step, and the two-level pool's ratio to the shared pool's. Rounds rotate
the pools' order; figures are medians over the rounds. Run::

    python benchmarks/bench_two_level_step.py
    python benchmarks/bench_two_level_step.py --models qwen3-next-80b --rounds 3 --record

``--record`` writes ``benchmarks/results/two-level-step.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

import bench_eviction
from _common import positive_int, rotated
from _record import Recorder, ratio, table

from kvcore._planning.pool_choice import PoolChoice
from kvcore._sim import SimulationOptions, SimulationReport, load_workload
from kvcore._sim.workload import Workload

MODELS = ("qwen3-next-80b", "jamba-v0.1")
POOLS: tuple[PoolChoice, ...] = ("shared", "two-level")


def measure(
    workload: Workload, model: str, memory: str, rounds: int
) -> dict[str, list[SimulationReport]]:
    """Per pool, one report per round (the pools replayed in lockstep, order rotated)."""
    reports: dict[str, list[SimulationReport]] = {pool: [] for pool in POOLS}
    for index in range(rounds):
        order = rotated(POOLS, index)
        options = [SimulationOptions(model=model, memory=memory, pool=pool) for pool in order]
        for pool, report in zip(
            order, bench_eviction.replay_in_lockstep(workload, options), strict=True
        ):
            reports[pool].append(report)
    return reports


def _median(reports: Sequence[SimulationReport], field: str) -> float:
    return statistics.median(getattr(report.manager, field) for report in reports)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--memory", default="80GiB")
    parser.add_argument(
        "--limit", type=positive_int, default=2000, help="built-in workload requests"
    )
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/two-level-step.json"
    )
    args = parser.parse_args(argv)
    recorder = Recorder("two-level-step", enabled=args.record)
    workload = load_workload(None, limit=args.limit)
    rows = []
    with recorder.section("table"):
        print(
            f"built-in workload ({args.limit} requests), {args.memory}, "
            f"{args.rounds} lockstep rounds, medians; µs in kvcore"
        )
        print(f"{'model':16} {'pool':10} {'decode step':>12} {'step':>8} {'x shared':>9}")
        for model in (name for name in args.models.split(",") if name):
            reports = measure(workload, model, args.memory, args.rounds)
            base = _median(reports["shared"], "per_decode_step_mean_us")
            for pool in POOLS:
                decode = _median(reports[pool], "per_decode_step_mean_us")
                step = _median(reports[pool], "per_step_mean_us")
                print(f"{model:16} {pool:10} {decode:12.1f} {step:8.1f} {decode / base:9.2f}")
                key = f"{model}.{pool}"
                recorder.figure(f"{key}.decode_step", f"{decode:.1f} µs")
                recorder.figure(f"{key}.step", f"{step:.1f} µs")
                recorder.figure(f"{key}.ratio", ratio(decode / base))
                rows.append(
                    [model, pool, f"{decode:.1f} µs", f"{step:.1f} µs", ratio(decode / base)]
                )
    recorder.tables["steps"] = table(
        "kvcore's time per step, two-level and shared pool",
        ["model", "pool", "per decode step", "per step", "decode step vs shared"],
        rows,
    )
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
