"""Eviction policies side by side: hit rate against cache size, and manager time per step.

Every built-in policy (lru, admit, frequency, cost) and the offline optimum
(belady) replay the same workloads through ``kvcore simulate`` at the same
memory, four sizes per workload from tight to about the working set (where
the optimum reaches the unbounded-cache ceiling):

* the Mooncake conversation trace (12,031 requests) on gpt-oss-20b (sliding
  window + full attention) and on qwen3-next-80b (Mamba + full attention);
* the Mooncake synthetic trace (3,993 requests) on gpt-oss-20b;
* the built-in workload (2,000 requests, seed 0) on gpt-oss-20b.

Each cell also has the workload's unbounded-cache ceiling. Then a timing
phase replays one workload per model with every online policy in
``--repeats`` order-rotated rounds and reports the median manager time per
decode call, per decode step (a step in which every scheduled request
decoded one token: no admission, no prefill chunk; its frees and
preemptions included) and per step of any kind (with the spread and the
load average) against LRU. Within a round the policies' replays run in
lockstep, 32 scheduler steps each in turn, so that they all see the same
machine load.

Run (from the repository root)::

    # What the docs show: the first 1,000 requests of each trace (the built-in
    # workload whole), about 45 min of CPU
    python benchmarks/bench_eviction.py --limit 1000 --jobs 2 \
        --rst docs/explanation/eviction-results.inc --plot docs/_static/eviction.png
    # Whole traces: each cell takes 15 to 25 min, several hours in all
    python benchmarks/bench_eviction.py --jobs 2

Results are cached in ``--results`` (default ``benchmarks/eviction-results.json``,
one record per cell): an interrupted run resumes, and ``--table`` / ``--plot``
redraw without simulating. ``--jobs N`` runs N cells at once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from _common import DATA, REPO, positive_int
from _record import last_change, start, table, write_record

from kvcore._sim import (
    SimulationOptions,
    SimulationReport,
    Workload,
    load_workload,
    simulate,
)

POLICIES = ("lru", "admit", "frequency", "cost", "belady")
#: The built-in workload's model and longest request, in the sweep and the
#: timing phase (and in eviction_decode_steps.py).
BUILTIN_MODEL = "gpt-oss-20b"
BUILTIN_MAX_MODEL_LEN = 32768
#: Scheduler steps a replay runs before handing the turn on (timing phase).
LOCKSTEP_STEPS = 32
ONLINE = POLICIES[:-1]
CONVERSATION = DATA / "mooncake" / "mooncake_conversation_trace.jsonl"
SYNTHETIC = DATA / "mooncake" / "mooncake_synthetic_trace.jsonl"

# (key, title, trace or None for the built-in workload, model, sizes, max_model_len)
SWEEPS: tuple[tuple[str, str, Path | None, str, tuple[str, ...], int | None], ...] = (
    (
        "conversation/gpt-oss-20b",
        "Mooncake conversation, gpt-oss-20b",
        CONVERSATION,
        "gpt-oss-20b",
        ("10GiB", "20GiB", "40GiB", "80GiB"),
        None,
    ),
    (
        "conversation/qwen3-next-80b",
        "Mooncake conversation, qwen3-next-80b",
        CONVERSATION,
        "qwen3-next-80b",
        # Three Mamba states per block boundary: below 40 GiB running requests
        # fill the pool and even the optimum hits nothing.
        ("40GiB", "60GiB", "80GiB", "160GiB"),
        None,
    ),
    (
        "synthetic/gpt-oss-20b",
        "Mooncake synthetic, gpt-oss-20b",
        SYNTHETIC,
        "gpt-oss-20b",
        ("10GiB", "20GiB", "40GiB", "80GiB"),
        None,
    ),
    (
        "built-in/gpt-oss-20b",
        "built-in workload (2,000 requests), gpt-oss-20b",
        None,
        BUILTIN_MODEL,
        ("1GiB", "2GiB", "4GiB", "8GiB"),
        BUILTIN_MAX_MODEL_LEN,
    ),
)
# Timing phase: (title, trace, limit, model, memory, max_model_len)
TIMINGS = (
    ("built-in, gpt-oss-20b, 8 GiB", None, 2000, BUILTIN_MODEL, "8GiB", BUILTIN_MAX_MODEL_LEN),
    (
        "conversation (500), qwen3-next-80b, 80 GiB",
        CONVERSATION,
        500,
        "qwen3-next-80b",
        "80GiB",
        None,
    ),
)


def replay_options(
    model: str, memory: str, max_model_len: int | None, policy: str
) -> SimulationOptions:
    """One replay's options: ``model`` in ``memory``, ``policy`` evicting, default scheduler.

    The shared pool (one page size for every group), as the recorded figures
    were measured: qwen3-next-80b's 544-token blocks.
    """
    return SimulationOptions(
        model=model, memory=memory, max_model_len=max_model_len, eviction=policy, pool="shared"
    )


def _cell_key(sweep: str, memory: str, policy: str, limit: int | None) -> str:
    return f"{sweep}|{memory}|{policy}|{limit or 'all'}"


def _run_cell(
    sweep: str,
    trace: str | None,
    model: str,
    memory: str,
    max_model_len: int | None,
    policy: str,
    limit: int | None,
) -> dict[str, Any]:
    """Simulate one (workload, memory, policy) cell; a plain dict for the results file."""
    # The limit shortens the traces; the built-in workload is always its 2,000 requests.
    workload = load_workload(trace, limit=limit if trace is not None else None)
    options = replay_options(model, memory, max_model_len, policy)
    started = time.perf_counter()
    report = simulate(workload, options)
    prefix = report.prefix_cache
    return {
        "sweep": sweep,
        "memory": memory,
        "policy": policy,
        "limit": limit,
        "requests": report.workload.requests,
        "num_blocks": report.plan.num_blocks,
        "hit_rate": prefix.hit_rate,
        "ceiling_rate": prefix.ceiling_rate,
        "hit_tokens": prefix.hit_tokens,
        "prompt_tokens": prefix.prompt_tokens,
        "evicted_blocks": report.eviction.evicted_blocks,
        "preemptions": report.preemptions.count,
        "decode_mean_us": report.manager.ops["decode"].mean_us,
        "step_mean_us": report.manager.per_step_mean_us,
        "wall_s": time.perf_counter() - started,
    }


def load_results(path: Path) -> dict[str, dict[str, Any]]:
    if not path.exists():
        return {}
    records = json.loads(path.read_text())
    return {_cell_key(r["sweep"], r["memory"], r["policy"], r["limit"]): r for r in records}


def save_results(path: Path, results: dict[str, dict[str, Any]]) -> None:
    path.write_text(
        json.dumps(
            sorted(
                results.values(),
                key=lambda r: _cell_key(r["sweep"], r["memory"], r["policy"], r["limit"]),
            ),
            indent=1,
        )
        + "\n"
    )


def run_sweep(args: argparse.Namespace, results: dict[str, dict[str, Any]], path: Path) -> None:
    todo = []
    # Largest memory first in every sweep: the default configuration's cells
    # come first, and a partial run already answers the main question.
    for key, _, trace, model, sizes, max_model_len in SWEEPS:
        if args.sweeps and key not in args.sweeps:
            continue
        for memory in reversed(sizes):
            for policy in args.policies:
                if _cell_key(key, memory, policy, args.limit) in results:
                    continue
                trace_arg = str(trace) if trace is not None else None
                todo.append((key, trace_arg, model, memory, max_model_len, policy, args.limit))
    if not todo:
        return
    print(f"{len(todo)} cells to simulate ({args.jobs} at a time)", flush=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(_run_cell, *cell): cell for cell in todo}
        for done, future in enumerate(as_completed(futures), 1):
            record = future.result()
            results[
                _cell_key(record["sweep"], record["memory"], record["policy"], record["limit"])
            ] = record
            save_results(path, results)
            print(
                f"  [{done}/{len(todo)} {time.perf_counter() - started:6.0f} s] {record['sweep']} "
                f"{record['memory']:>6} {record['policy']:<9} "
                f"hit {100 * record['hit_rate']:5.2f} % "
                f"(ceiling {100 * record['ceiling_rate']:.1f} %, {record['wall_s']:.0f} s)",
                flush=True,
            )


def _cells(
    results: dict[str, dict[str, Any]], limit: int | None
) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {
        (r["sweep"], r["memory"], r["policy"]): r for r in results.values() if r["limit"] == limit
    }


def gap_closed(lru: float, best: float, belady: float) -> float | None:
    """Share of the LRU → Belady gap a policy closes (None when there is no gap)."""
    if belady - lru <= 1e-9:
        return None
    return (best - lru) / (belady - lru)


def sweep_record(
    results: dict[str, dict[str, Any]], limit: int | None
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The sweep's tables (one per workload: hit rate per policy and size, Belady,
    ceiling, gap closed) and figures, for the ``eviction-sweep`` record.

    Figures: ``hit.SWEEP.MEMORY.POLICY`` (% of prompt tokens),
    ``ceiling.SWEEP``, ``gap.SWEEP.MEMORY`` (share of the LRU → Belady gap the
    best online policy closes) for the cells of ``limit``; ``whole.`` ahead of
    the same keys for the cells of the whole traces.
    """
    tables: dict[str, dict[str, Any]] = {}
    figures: dict[str, str] = {}
    for prefix, cells in (("", _cells(results, limit)), ("whole.", _cells(results, None))):
        for key, title, trace, _, sizes, _ in SWEEPS:
            rows = []
            for size in sizes:
                hit = {
                    p: 100 * cells[key, size, p]["hit_rate"]
                    for p in POLICIES
                    if (key, size, p) in cells
                }
                for policy, rate in hit.items():
                    figures[f"{prefix}hit.{key}.{size}.{policy}"] = f"{rate:.2f} %"
                if (key, size, "lru") in cells:
                    ceiling = 100 * cells[key, size, "lru"]["ceiling_rate"]
                    figures[f"{prefix}ceiling.{key}"] = f"{ceiling:.2f} %"
                online = [p for p in ONLINE if p in hit]
                if not online or "lru" not in hit or "belady" not in hit:
                    continue
                best = max(online, key=lambda p: hit[p])
                closed = gap_closed(hit["lru"], hit[best], hit["belady"])
                shown = "n/a" if closed is None else f"{100 * closed:.0f} %"
                figures[f"{prefix}gap.{key}.{size}"] = shown
                if len(hit) < len(POLICIES):
                    continue
                rows.append(
                    [
                        f"{size} ({cells[key, size, 'lru']['num_blocks']:,} blocks)",
                        *[f"{hit[p]:.2f}" for p in POLICIES],
                        f"{ceiling:.2f}",
                        f"{best}: {shown}",
                    ]
                )
            if rows and not prefix:
                shortened = limit is not None and trace is not None
                tables[key] = table(
                    title + (f" (first {limit:,} requests)" if shortened else ""),
                    ["memory", *POLICIES, "ceiling", "best online: gap closed"],
                    rows,
                )
    return tables, figures


def plot(results: dict[str, dict[str, Any]], limit: int | None, path: Path) -> None:
    import matplotlib as mpl

    mpl.use("Agg")
    import matplotlib.pyplot as plt

    cells = _cells(results, limit)
    figure, axes = plt.subplots(2, 2, figsize=(8, 6.4))
    styles = {
        "lru": ("tab:gray", "-", "o"),
        "admit": ("tab:blue", "-", "s"),
        "frequency": ("tab:green", "-", "^"),
        "cost": ("tab:orange", "-", "v"),
        "belady": ("black", "--", "x"),
    }
    for axis, (key, title, _, _, sizes, _) in zip(axes.flat, SWEEPS, strict=True):
        xs = [size for size in sizes if all((key, size, p) in cells for p in POLICIES)]
        labels = [size.replace("GiB", "") for size in xs]
        for policy in POLICIES:
            color, line, marker = styles[policy]
            axis.plot(
                labels,
                [100 * cells[key, x, policy]["hit_rate"] for x in xs],
                color=color,
                linestyle=line,
                marker=marker,
                markersize=4,
                label=policy,
            )
        if xs:
            axis.plot(
                labels,
                [100 * cells[key, x, "lru"]["ceiling_rate"] for x in xs],
                color="tab:red",
                linestyle=":",
                label="ceiling",
            )
        axis.set_title(title.replace(" workload (2,000 requests)", ""), fontsize=9)
        axis.set_xlabel("KV cache (GiB)", fontsize=8)
        axis.set_ylabel("prompt tokens hit (%)", fontsize=8)
        axis.tick_params(labelsize=8)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    handles, names = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="lower center", ncol=6, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


def replay_in_lockstep(
    workload: Workload, options: Sequence[SimulationOptions], chunk: int = LOCKSTEP_STEPS
) -> list[SimulationReport]:
    """Simulate ``workload`` once per entry of ``options``, the replays taking turns.

    Each replay runs in its own thread, and only the one whose turn it is
    runs: it hands the turn on (in the order of ``options``) every ``chunk``
    scheduler steps, between a step's allocations and its frees, outside
    any timed manager call. So every replay sees the same machine load,
    and a ratio of their times is not skewed by the load changing between
    runs (on a shared machine it changes from one run to the next).

    Returns:
        The reports, in the order of ``options``.

    Raises:
        ValueError: ``chunk`` is not an integer >= 1.
    """
    if type(chunk) is not int or chunk < 1:
        msg = f"chunk must be an integer >= 1 (scheduler steps per turn), got {chunk!r}"
        raise ValueError(msg)
    turn = threading.Condition()
    current = [0]
    live = set(range(len(options)))
    reports: list[SimulationReport | None] = [None] * len(options)
    errors: list[BaseException] = []

    def wait_for_turn(me: int) -> None:
        with turn:
            turn.wait_for(lambda: current[0] == me)

    def hand_on(me: int, finished: bool = False) -> None:
        with turn:
            if finished:
                live.discard(me)
            for offset in range(1, len(options) + 1):
                following = (me + offset) % len(options)
                if following in live:
                    current[0] = following
                    break
            turn.notify_all()

    def replay(me: int) -> None:
        steps = 0

        def attach(plan: object, manager: object) -> Callable[..., None]:
            def on_step(scheduled: object) -> None:
                nonlocal steps
                steps += 1
                if steps % chunk == 0:
                    hand_on(me)
                    wait_for_turn(me)

            return on_step

        wait_for_turn(me)
        try:
            reports[me] = simulate(workload, options[me], attach=attach)
        except BaseException as error:  # re-raised in the caller's thread
            errors.append(error)
        finally:
            hand_on(me, finished=True)

    threads = [threading.Thread(target=replay, args=(me,)) for me in range(len(options))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [report for report in reports if report is not None]


def run_timing(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Manager time per decode call and per step of each online policy.

    ``--repeats`` rounds; in each every policy replays the workload once, the
    replays in lockstep (:func:`replay_in_lockstep`), their order rotated by
    one per round (so no policy always goes first). Reported: the median
    over the rounds, with the lowest and highest.
    """
    rows = []
    for title, trace, limit, model, memory, max_model_len in TIMINGS:
        workload = load_workload(str(trace) if trace else None, limit=limit)
        runs: dict[str, list[tuple[float, float, float]]] = {policy: [] for policy in ONLINE}
        load_before = os.getloadavg()[0]
        for round_index in range(args.repeats):
            shift = round_index % len(ONLINE)
            order = ONLINE[shift:] + ONLINE[:shift]
            options = [replay_options(model, memory, max_model_len, policy) for policy in order]
            for policy, report in zip(order, replay_in_lockstep(workload, options), strict=True):
                manager = report.manager
                runs[policy].append(
                    (
                        manager.ops["decode"].mean_us,
                        manager.per_decode_step_mean_us,
                        manager.per_step_mean_us,
                    )
                )
        load = (load_before + os.getloadavg()[0]) / 2
        # Per policy, per figure (decode call, decode step, step): the
        # median over the rounds, and the lowest and highest.
        figures = ("decode", "decode_step", "step")
        for policy in ONLINE:
            row: dict[str, Any] = {
                "workload": title,
                "policy": policy,
                "load": load,
                "rounds": args.repeats,
            }
            for index, figure in enumerate(figures):
                values = [run[index] for run in runs[policy]]
                lru = statistics.median(run[index] for run in runs["lru"])
                median = statistics.median(values)
                row[f"{figure}_us"] = median
                row[f"{figure}_range"] = (min(values), max(values))
                row[f"{figure}_vs_lru"] = median / lru
            rows.append(row)
            print(
                f"  {title}: {policy:<9} decode call {row['decode_us']:6.2f} µs "
                f"({row['decode_vs_lru']:.2f}x lru), decode step {row['decode_step_us']:7.1f} µs "
                f"({row['decode_step_vs_lru']:.2f}x lru), step {row['step_us']:7.1f} µs "
                f"({row['step_vs_lru']:.2f}x lru), load {load:.1f}",
                flush=True,
            )
    return rows


def timing_record(rows: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str]]:
    """The timing table and its figures (``timing.WORKLOAD.POLICY.FIGURE[.vs]``)."""
    rounds = rows[0]["rounds"] if rows else 0
    figures: dict[str, str] = {}
    body = []
    for row in rows:
        workload = "builtin" if row["workload"].startswith("built-in") else "qwen"
        cells = [f"{row['workload']} ({row['load']:.1f})", row["policy"]]
        for figure, digits in (("decode", 2), ("decode_step", 1), ("step", 1)):
            low, high = row[f"{figure}_range"]
            median, versus = row[f"{figure}_us"], row[f"{figure}_vs_lru"]
            spread = f"{low:.2f}–{high:.2f}" if digits == 2 else f"{low:.0f}–{high:.0f}"
            cells += [f"{median:.{digits}f} ({spread})", f"{versus:.2f}"]
            key = f"timing.{workload}.{row['policy']}.{figure.replace('_', '-')}"
            figures[key] = f"{median:.{digits}f} µs"
            figures[f"{key}.vs"] = f"{versus:.2f}×"
        body.append(cells)
    header = [
        "workload (load average)",
        "policy",
        "decode call (µs)",
        "vs lru",
        "decode step (µs)",
        "vs lru",
        "any step (µs)",
        "vs lru",
    ]
    title = f"Manager time (median of {rounds} lockstep rounds, lowest–highest)"
    return table(title, header, body), figures


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="first 1,000 requests of each trace")
    parser.add_argument("--limit", type=positive_int, help="first N requests of each trace")
    parser.add_argument(
        "--jobs", type=positive_int, default=1, help="cells simulated at once (default 1)"
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated")
    parser.add_argument("--sweeps", help="comma-separated sweep keys (default: all)")
    parser.add_argument(
        "--results", type=Path, default=REPO / "benchmarks" / "eviction-results.json"
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write benchmarks/results/eviction-sweep.json (and eviction-timing.json "
        "unless --no-timing)",
    )
    parser.add_argument("--plot", type=Path, help="write the hit-rate plot (PNG) here")
    parser.add_argument("--no-sweep", action="store_true", help="only redraw from --results")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing phase")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timing rounds (default 5)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.quick and args.limit is None:
        args.limit = 1000
    args.policies = [p for p in args.policies.split(",") if p]
    args.sweeps = set(args.sweeps.split(",")) if args.sweeps else None
    for trace in (CONVERSATION, SYNTHETIC):
        if not trace.exists():
            print(
                f"missing {trace}; set KVCORE_DATA to the folder holding mooncake/", file=sys.stderr
            )
            return 2
    results = load_results(args.results)
    before = json.dumps(results, sort_keys=True)
    start()
    if not args.no_sweep:
        run_sweep(args, results, args.results)
    tables, figures = sweep_record(results, args.limit)
    for recorded in tables.values():
        print(recorded["title"], *("  ".join(row) for row in recorded["rows"]), sep="\n  ")
    if args.record:
        # Cells this run did not simulate were measured by an earlier run of
        # the sweep: their date and commit are those that stored them.
        unchanged = json.dumps(results, sort_keys=True) == before
        write_record(
            "eviction-sweep",
            figures=figures,
            tables=tables,
            command="python benchmarks/bench_eviction.py --limit 1000 --jobs 2 --no-timing "
            "--record --plot docs/_static/eviction.png",
            provenance={
                **last_change(args.results),
                "load": "load not recorded (the hit rates do not depend on it)",
            }
            if unchanged
            else None,
        )
    if not args.no_timing:
        start()
        print(f"timing ({os.getloadavg()[0]:.1f} load average at start)")
        timing_table, timing_figures = timing_record(run_timing(args))
        if args.record:
            write_record(
                "eviction-timing",
                figures=timing_figures,
                tables={"timing": timing_table},
                command=f"python benchmarks/bench_eviction.py --no-sweep --repeats "
                f"{args.repeats} --record",
            )
    if args.plot:
        plot(results, args.limit, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
