"""The ``kvcore simulate`` runs the docs show, recorded with their figures.

Each run is a ``kvcore simulate`` command of the tutorial or the README, run
in this process exactly as the command line would (same parser, same code),
its report printed and kept: the record ``benchmarks/results/simulate-NAME.json``
holds the printed report (``outputs["report"]``, what the tutorial shows) and
its figures (``figures``: hit rates, times, pool use), so the prose and the
sample output come from the same run.

Run (from the repository root; one at a time, the times are measured)::

    python benchmarks/record_simulations.py --list
    python benchmarks/record_simulations.py builtin gemma --record
    python benchmarks/record_simulations.py --all --record

Runs on the Mooncake traces read ``../shared/data/mooncake/`` (or
``KVCORE_DATA``) in place.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from collections.abc import Callable
from typing import Any

from _common import CONVERSATION_TRACE
from _record import percent, start, write_record

from kvcore._cli.main import build_parser
from kvcore._cli.simulate_cmd import simulate_from_args
from kvcore._sim.report import format_report

TRACE = "conversation_trace.jsonl"
#: name -> the command as the docs show it (TRACE stands for the Mooncake
#: conversation trace, which the docs tell readers to download under that name).
RUNS: dict[str, str] = {
    "builtin": "kvcore simulate",
    "builtin-frequency": "kvcore simulate --eviction frequency",
    "builtin-4gib": "kvcore simulate --memory 4GiB",
    "gemma": "kvcore simulate gemma-3-27b --plot docs/_static/simulate-gemma-3-27b-builtin.png",
    "conversation-oss": (
        f"kvcore simulate gpt-oss-20b --trace {TRACE} --limit 2000 "
        "--plot docs/_static/simulate-gpt-oss-20b-conversation.png"
    ),
    "conversation-llama": (
        f"kvcore simulate llama-3-8b --max-model-len 131072 --trace {TRACE} --limit 2000 "
        "--plot docs/_static/simulate-llama-3-8b-conversation.png"
    ),
    "conversation-whole": f"kvcore simulate gpt-oss-20b --trace {TRACE}",
    "conversation-whole-frequency": (
        f"kvcore simulate gpt-oss-20b --trace {TRACE} --eviction frequency"
    ),
}


def _us(value: float) -> str:
    return f"{value:,.0f} µs" if value >= 100 else f"{value:.1f} µs"


def figures(data: dict[str, Any]) -> dict[str, str]:
    """The report's figures as the docs print them."""
    manager, ops = data["manager"], data["manager"]["ops"]
    cache, blocks, timing = data["prefix_cache"], data["blocks"], data["timing"]
    lost = data["preemptions"]["lost_tokens"]
    out = {
        "hit-rate": percent(cache["hit_rate"]),
        "ceiling": percent(cache["ceiling_rate"]),
        "of-ceiling": percent(cache["fraction_of_ceiling"]),
        "peak-use": percent(blocks["peak_usage"]),
        "mean-use": percent(blocks["mean_usage"]),
        "simulated": f"{data['steps']['simulated_s']:,.0f} s",
        "kvcore": f"{manager['total_s']:.1f} s",
        "simulator": f"{timing['simulator_overhead_s']:.1f} s",
        "wall": f"{timing['total_s']:.1f} s",
        "step-p50": _us(manager["per_step_p50_us"]),
        "step-p99": _us(manager["per_step_p99_us"]),
        "step-mean": _us(manager["per_step_mean_us"]),
        "decode-step-mean": _us(manager["per_decode_step_mean_us"]),
    }
    for op in ("lookup", "admit", "prefill", "decode", "free"):
        if ops[op]["count"]:
            out[f"{op}-mean"] = _us(ops[op]["mean_us"])
            out[f"{op}-p50"] = _us(ops[op]["p50_us"])
    if lost:
        out["found-again"] = percent(data["preemptions"]["resume_hit_tokens"] / lost)
    return out


def argv_of(command: str) -> list[str]:
    """The command's arguments after ``kvcore``, the trace's name resolved."""
    words = command.split()[1:]
    return [str(CONVERSATION_TRACE) if word == TRACE else word for word in words]


def record_run(name: str, *, record: bool, show: Callable[[str], None] = print) -> None:
    """Run one named simulation, print its report, and record it if asked."""
    start()
    args = build_parser().parse_args(argv_of(RUNS[name]))
    report, _ = simulate_from_args(args)
    # The report names the trace by the name the docs give it, not by where it lies here.
    text = format_report(report).replace(str(CONVERSATION_TRACE), TRACE)
    if args.plot is not None:
        text += f"\n  plot         {args.plot.rsplit('/', 1)[-1]}"
    show(text)
    if record:
        write_record(
            f"simulate-{name}",
            figures=figures(report.to_dict()),
            outputs={"report": text},
            data={"shown_command": RUNS[name]},
            command=f"python benchmarks/record_simulations.py {name} --record",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help="runs to record (see --list)")
    parser.add_argument("--all", action="store_true", help="every run, one after the other")
    parser.add_argument("--list", action="store_true", help="list the runs and their commands")
    parser.add_argument("--record", action="store_true", help="write the records")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(RUNS))
    if unknown:
        parser.error(f"unknown run(s) {', '.join(unknown)}; the runs: {', '.join(RUNS)}")
    if args.list or not (args.names or args.all):
        for name, command in RUNS.items():
            print(f"{name:<30}{command}")
        return 0
    for name in RUNS if args.all else args.names:
        print(f"== {name}: {RUNS[name]}", flush=True)
        with contextlib.redirect_stderr(io.StringIO()):
            record_run(name, record=args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
