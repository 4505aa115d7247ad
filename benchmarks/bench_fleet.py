"""Routers compared on a fleet: hit rate, imbalance, preemptions (the Fleet page's tables).

Every cell is one ``kvcore simulate MODEL --trace TRACE --limit N --memory M
--engines E --router R --time-scale E/2 --json`` (``--scoring all-alike`` for
the "all alike" rows), run in this process. Per model, a table: engines,
router, hit rate, hit rate over round robin's at the same fleet size,
imbalance (the busiest engine's mean running requests over the fleet's),
preemptions. With ``--record``, ``benchmarks/results/fleet-routing.json``
holds the tables and every cell's figures (``MODEL.E.ROUTER.hit``).

Run (from the repository root; a 16-engine cell takes up to 20 minutes on 2
shared cores)::

    python benchmarks/bench_fleet.py --record
    python benchmarks/bench_fleet.py --engines 4 --models gpt-oss-20b   # a part
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import Any

from _common import CONVERSATION_TRACE
from _record import Recorder, percent, ratio, table

from kvcore._cli.main import main as kvcore_main

#: model -> (memory per engine, routers compared)
MODELS = {
    "gpt-oss-20b": (
        "48GiB",
        ("prefix", "prefix, all alike", "round_robin", "least_loaded", "random"),
    ),
    "jamba-v0.1": ("80GiB", ("prefix", "prefix, all alike", "round_robin")),
}
FLEET_SIZES = (4, 8, 16)
LIMIT = 4000


def run_cell(model: str, memory: str, engines: int, router: str, limit: int) -> dict[str, Any]:
    """One fleet simulation's JSON report."""
    argv = [
        "simulate",
        model,
        "--trace",
        str(CONVERSATION_TRACE),
        "--limit",
        str(limit),
        "--memory",
        memory,
        "--engines",
        str(engines),
        "--router",
        router.split(",")[0],
        "--time-scale",
        str(engines / 2),
        "--json",
        "--pool",
        "shared",
    ]  # as recorded: jamba-v0.1's 80-token blocks
    if router.endswith("all alike"):
        argv += ["--scoring", "all-alike"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = kvcore_main(argv)
    if status != 0:
        msg = f"kvcore {' '.join(argv)} exited with {status}"
        raise RuntimeError(msg)
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--engines", type=int, nargs="+", default=list(FLEET_SIZES))
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/fleet-routing.json"
    )
    args = parser.parse_args(argv)
    recorder = Recorder("fleet-routing", enabled=args.record)
    for model in args.models:
        memory, routers = MODELS[model]
        rows = []
        for engines in args.engines:
            reports = {
                router: run_cell(model, memory, engines, router, args.limit) for router in routers
            }
            base = reports["round_robin"]["hit_rate"]
            for router, report in reports.items():
                key = f"{model}.{engines}.{router.replace(', ', '-').replace(' ', '-')}"
                cells = [
                    str(engines),
                    router,
                    percent(report["hit_rate"]),
                    f"{report['hit_rate'] / base:.2f}",
                    f"{report['imbalance']:.2f}",
                    str(report["preemptions"]),
                ]
                print("  ".join(cells), flush=True)
                rows.append(cells)
                recorder.figure(f"{key}.hit", percent(report["hit_rate"]))
                recorder.figure(f"{key}.vs-round-robin", ratio(report["hit_rate"] / base))
                recorder.figure(f"{key}.imbalance", f"{report['imbalance']:.2f}")
                recorder.data[key] = report
        recorder.tables[model] = table(
            model,
            ["engines", "router", "hit rate", "× round robin", "imbalance", "preemptions"],
            rows,
        )
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
