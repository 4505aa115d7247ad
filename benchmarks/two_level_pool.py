"""The two-level pool against the shared one: hit rate, ceiling, preemptions, capacity.

Three measurements, each a set of ``kvcore simulate`` runs made in this
process (the same code as the command line), each written to its own record
with ``--record``:

``builtin``
    The built-in workload (2,000 requests, seed 0) for each model, at each
    memory, under ``--pool shared`` and ``--pool two-level``: hit rate in
    prompt tokens, the unbounded-cache ceiling at the pool's hit grid and at
    16-token blocks, the hit rate as a share of the latter, preemptions and
    the peak of running requests (``two-level-builtin.json``).
``mooncake``
    The first 1,000 requests of the Mooncake conversation trace at 80 GiB,
    every eviction policy, both pools, both models
    (``two-level-mooncake.json``).
``sweep``
    The Mamba checkpoint (tokens between two cached states) swept under the
    two-level pool, both models, on three cells: the built-in workload at
    each memory and the first 1,000 requests of the conversation trace at
    80 GiB (``lru``): state memory per request, hit rate, preemptions, and
    the checkpoint that comes closest to each cell's best
    (``mamba-checkpoint-sweep.json``, and the plot
    ``docs/_static/mamba-checkpoint-sweep.svg``).
``concurrency``
    Both pools at 8 GiB on the built-in workload with the engine's
    concurrency capped (``--max-num-seqs``, the same cap for both pools):
    hit rate, preemptions, simulated time and peak running requests per cap
    (``two-level-concurrency.json``).
``states``
    Which states a prefill keeps (the plan option ``mamba.prefill_states``,
    ``every`` or ``selective``) under the two-level pool, next to the shared
    pool: the built-in workload for each model at each memory, and the first
    1,000 requests of the conversation trace at 80 GiB under every eviction
    policy (``mamba-prefill-states.json``).

Run (from the repository root; a few minutes each on one core)::

    python benchmarks/two_level_pool.py builtin --record
    python benchmarks/two_level_pool.py mooncake --record
    python benchmarks/two_level_pool.py sweep --record
    python benchmarks/two_level_pool.py states --record
    python benchmarks/two_level_pool.py concurrency --record

The trace is read from ``../shared/data/mooncake/`` (or ``KVCORE_DATA``) in
place.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _common import CONVERSATION_TRACE, REPO
from _record import Recorder, percent, table
from _svg import line_chart

from kvcore._eviction.registry import available_eviction_policies
from kvcore._planning.pool_choice import PoolChoice
from kvcore._plugin_loader import load_registry
from kvcore._sim import SimulationOptions, load_workload, simulate
from kvcore._sim.report import SimulationReport
from kvcore._sim.scheduler import SchedulerConfig
from kvcore._sim.simulate import plan_for
from kvcore._sim.workload import Workload
from kvcore.errors import KVCoreError

MODELS = ("qwen3-next-80b", "jamba-v0.1")
MEMORIES = ("80GiB", "8GiB")
POOLS: tuple[PoolChoice, ...] = ("shared", "two-level")
CHECKPOINTS = (16, 256, 512, 1024, 2048)
PREFILL_STATES = ("every", "selective")
#: ``--max-num-seqs`` caps of the concurrency measurement (256: the simulator's default).
MAX_NUM_SEQS = (16, 24, 32, 40, 48, 64, 256)
MOONCAKE_REQUESTS = 1000
SWEEP_PLOT = REPO / "docs" / "_static" / "mamba-checkpoint-sweep.svg"


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:,.0f} MiB"


def _state_bytes(options: SimulationOptions) -> tuple[int, int]:
    """Bytes of one cached state of every state group, and of what one request may hold."""
    plan = plan_for(options, load_registry())
    state = [g for g in plan.groups if g.kind == "mamba"]
    one = sum(g.bytes_per_block for g in state)
    return one, sum(g.bytes_per_block * g.pages_per_request for g in state)


def _held_state_per_request(report: SimulationReport, options: SimulationOptions) -> float:
    """Mean bytes of state held per running request, over the samples with requests running."""
    plan = plan_for(options, load_registry())
    state = [(g.index, g.bytes_per_block) for g in plan.groups if g.kind == "mamba"]
    per_request = [
        sum(s.group_blocks[i] * size for i, size in state) / s.running
        for s in report.samples
        if s.running
    ]
    return sum(per_request) / len(per_request) if per_request else 0.0


class _Cache:
    """Finished runs kept in a JSON file (``--cache``), so an interrupted measurement resumes.

    A run is keyed by its measurement and options; delete the file to
    measure again (the record's date is the date of the run that wrote it).
    """

    def __init__(self) -> None:
        self.path: Path | None = None
        self.runs: dict[str, dict[str, Any]] = {}

    def load(self, path: Path | None) -> None:
        """Keep runs in ``path`` from now on, starting from those it holds."""
        self.path = path
        if path is not None and path.exists():
            self.runs = json.loads(path.read_text())

    def run(self, key: str, workload: Workload, options: SimulationOptions) -> dict[str, Any]:
        """The cached row for ``key``, or a fresh run of ``options`` (then kept)."""
        if key in self.runs:
            return self.runs[key]
        row = self.runs[key] = _run(workload, options)
        if self.path is not None:
            self.path.write_text(json.dumps(self.runs, indent=1) + "\n")
        return row


CACHE = _Cache()


def _run(workload: Workload, options: SimulationOptions) -> dict[str, Any]:
    """One simulation's figures (or why it could not be planned)."""
    started = time.perf_counter()
    try:
        report = simulate(workload, options)
    except KVCoreError as exc:
        return {"refused": str(exc)}
    pc, steps = report.prefix_cache, report.steps
    row = {
        "hit_rate": pc.hit_rate,
        "hit_tokens": pc.hit_tokens,
        "prompt_tokens": pc.prompt_tokens,
        "grid": pc.ceiling_block_size,
        "ceiling_rate": pc.ceiling_rate,
        "fine_block_size": pc.fine_block_size,
        "fine_ceiling_rate": pc.fine_ceiling_rate,
        "of_fine_ceiling": pc.fraction_of_fine_ceiling,
        "preemptions": report.preemptions.count,
        "simulated_s": steps.simulated_s,
        "peak_running": steps.peak_running,
        "mean_running": steps.mean_running,
        "peak_memory_usage": report.blocks.peak_memory_usage,
        "evicted_blocks": report.eviction.evicted_blocks,
        "max_model_len": report.plan.max_model_len,
        "rejected": report.workload.rejected_too_long,
        "wall_s": time.perf_counter() - started,
    }
    if options.pool == "two-level":
        row["held_state_bytes"] = _held_state_per_request(report, options)
    return row


def _say(label: str, row: dict[str, Any]) -> None:
    if "refused" in row:
        print(f"{label}: refused: {row['refused']}", flush=True)
        return
    print(
        f"{label}: hits {percent(row['hit_rate'])} (ceiling {percent(row['ceiling_rate'])} at "
        f"{row['grid']}, {percent(row['fine_ceiling_rate'])} at {row['fine_block_size']}: "
        f"{percent(row['of_fine_ceiling'])} of it), {row['preemptions']} preemptions, "
        f"peak {row['peak_running']} running ({row['wall_s']:.0f} s)",
        flush=True,
    )


def _both_pools(
    runs: dict[str, dict[str, Any]],
    measurement: str,
    key: str,
    workload: Workload,
    options: Callable[[PoolChoice], SimulationOptions],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The shared and the two-level run of ``options(pool)``, kept as ``runs[f"{key}-{pool}"]``."""
    for pool in POOLS:
        runs[f"{key}-{pool}"] = CACHE.run(f"{measurement}-{key}-{pool}", workload, options(pool))
        _say(f"{key}-{pool}", runs[f"{key}-{pool}"])
    return runs[f"{key}-shared"], runs[f"{key}-two-level"]


# -- builtin ----------------------------------------------------------------------------


def builtin(recorder: Recorder) -> None:
    """Both pools, both models, both memories, on the built-in workload."""
    workload = load_workload()
    runs: dict[str, dict[str, Any]] = {}
    for memory in MEMORIES:
        for model in MODELS:
            for pool in POOLS:
                key = f"{model}-{memory}-{pool}"
                options = SimulationOptions(model=model, memory=memory, pool=pool)
                runs[key] = CACHE.run(f"builtin-{key}", workload, options)
                _say(key, runs[key])
    recorder.data["runs"] = runs
    header = (
        "model", "pool", "hit rate", "ceiling at the hit grid", "ceiling at 16 tokens",
        "share of the 16-token ceiling", "preemptions", "peak running",
    )  # fmt: skip
    for memory in MEMORIES:
        rows = []
        for model in MODELS:
            for pool in POOLS:
                row = runs[f"{model}-{memory}-{pool}"]
                rows.append((
                    model, pool, percent(row["hit_rate"]),
                    f"{percent(row['ceiling_rate'])} ({row['grid']} tokens)",
                    percent(row["fine_ceiling_rate"]), percent(row["of_fine_ceiling"]),
                    f"{row['preemptions']:,}", f"{row['peak_running']:,}",
                ))  # fmt: skip
        title = f"The built-in workload at {memory.replace('GiB', ' GiB')}, both pools"
        recorder.tables[memory] = table(title, header, rows)
    _builtin_figures(recorder, runs)


def _builtin_figures(recorder: Recorder, runs: dict[str, dict[str, Any]]) -> None:
    for key, row in runs.items():
        recorder.figure(f"{key}-hit-rate", percent(row["hit_rate"]))
        recorder.figure(f"{key}-of-fine-ceiling", percent(row["of_fine_ceiling"]))
        recorder.figure(f"{key}-preemptions", f"{row['preemptions']:,}")
        recorder.figure(f"{key}-peak-running", f"{row['peak_running']:,}")
    for model in MODELS:
        shared, two = runs[f"{model}-8GiB-shared"], runs[f"{model}-8GiB-two-level"]
        hits = two["hit_rate"] / shared["hit_rate"] if shared["hit_rate"] else float("inf")
        recorder.figure(f"{model}-8GiB-hit-ratio", f"{hits:.2f}×")
        if shared["preemptions"]:
            share = two["preemptions"] / shared["preemptions"]
            recorder.figure(f"{model}-8GiB-preemption-share", percent(share))


# -- concurrency ------------------------------------------------------------------------


def concurrency(recorder: Recorder) -> None:
    """Both pools at 8 GiB, both models, the built-in workload, under each concurrency cap."""
    workload = load_workload()
    runs: dict[str, dict[str, Any]] = {}
    rows = []
    for model in MODELS:
        for cap in MAX_NUM_SEQS:
            pair = _both_pools(
                runs, "concurrency", f"{model}-{cap}", workload,
                lambda pool, m=model, c=cap: SimulationOptions(
                    model=m, memory="8GiB", pool=pool, scheduler=SchedulerConfig(max_num_seqs=c)
                ),
            )  # fmt: skip
            rows.append(_concurrency_row(recorder, model, cap, *pair))
    recorder.data["runs"] = runs
    header = (
        "model", "max_num_seqs", "hit rate (shared / two-level)", "two-level / shared",
        "preemptions (shared / two-level)", "simulated s (shared / two-level)",
        "peak running (shared / two-level)",
    )  # fmt: skip
    title = "The built-in workload at 8 GiB, both pools, concurrency capped"
    recorder.tables["caps"] = table(title, header, rows)


def _concurrency_row(
    recorder: Recorder, model: str, cap: int, shared: dict[str, Any], two: dict[str, Any]
) -> tuple[str, ...]:
    hits = two["hit_rate"] / shared["hit_rate"] if shared["hit_rate"] else float("inf")
    prefix = f"{model}-{cap}"
    recorder.figure(f"{prefix}-hit-ratio", f"{hits:.2f}×")
    for pool, row in (("shared", shared), ("two-level", two)):
        recorder.figure(f"{prefix}-{pool}-hit-rate", percent(row["hit_rate"]))
        recorder.figure(f"{prefix}-{pool}-preemptions", f"{row['preemptions']:,}")
        recorder.figure(f"{prefix}-{pool}-simulated", f"{row['simulated_s']:.1f} s")
        recorder.figure(f"{prefix}-{pool}-peak-running", f"{row['peak_running']:,}")
    return (
        model, f"{cap:,}", f"{percent(shared['hit_rate'])} / {percent(two['hit_rate'])}",
        f"{hits:.2f}×", f"{shared['preemptions']:,} / {two['preemptions']:,}",
        f"{shared['simulated_s']:.1f} / {two['simulated_s']:.1f}",
        f"{shared['peak_running']:,} / {two['peak_running']:,}",
    )  # fmt: skip


# -- mooncake ---------------------------------------------------------------------------


def mooncake(recorder: Recorder) -> None:
    """Every eviction policy, both pools, both models: the conversation trace at 80 GiB."""
    workload = load_workload(CONVERSATION_TRACE, limit=MOONCAKE_REQUESTS)
    policies = list(available_eviction_policies())
    runs: dict[str, dict[str, Any]] = {}
    rows = []
    for model in MODELS:
        for policy in policies:
            shared, two = _both_pools(
                runs, "mooncake", f"{model}-{policy}", workload,
                lambda pool, m=model, e=policy: SimulationOptions(model=m, pool=pool, eviction=e),
            )  # fmt: skip
            points = 100 * (two["hit_rate"] - shared["hit_rate"])
            recorder.figure(f"{model}-{policy}-difference", f"{points:+.1f} points")
            rows.append((
                model, policy, percent(shared["hit_rate"]), percent(two["hit_rate"]),
                f"{points:+.1f}", percent(two["fine_ceiling_rate"]),
                f"{shared['grid']} / {two['grid']}",
                f"{shared['preemptions']:,} / {two['preemptions']:,}",
            ))  # fmt: skip
    recorder.data["runs"] = runs
    header = (
        "model", "policy", "shared", "two-level", "difference (points)",
        "ceiling at 16 tokens", "hit grid (shared / two-level, tokens)",
        "preemptions (shared / two-level)",
    )  # fmt: skip
    title = f"The first {MOONCAKE_REQUESTS:,} requests of the conversation trace at 80 GiB"
    recorder.tables["policies"] = table(title, header, rows)
    lower = [key for key in rows if float(key[4]) < 0]
    recorder.figure("policies-lower", f"{len(lower)} of {len(rows)}")


# -- sweep ------------------------------------------------------------------------------


#: The sweep's cells per model: (key, label, memory); ``trace`` is the conversation trace.
SWEEP_CELLS = (
    ("80GiB", "built-in, 80 GiB", "80GiB"),
    ("8GiB", "built-in, 8 GiB", "8GiB"),
    ("trace", f"trace ({MOONCAKE_REQUESTS:,}), 80 GiB", "80GiB"),
)


def sweep(recorder: Recorder, checkpoints: Sequence[int]) -> None:
    """The Mamba checkpoint under the two-level pool: state memory against hit rate."""
    workloads = {
        "built-in": load_workload(),
        "trace": load_workload(CONVERSATION_TRACE, limit=MOONCAKE_REQUESTS),
    }
    runs: dict[str, dict[str, Any]] = {}
    rows = []
    for model in MODELS:
        for cell, label, memory in SWEEP_CELLS:
            workload = workloads["trace" if cell == "trace" else "built-in"]
            for checkpoint in checkpoints:
                key = f"{model}-{cell}-{checkpoint}"
                options = SimulationOptions(
                    model=model, memory=memory, pool="two-level", mamba_checkpoint=checkpoint
                )
                row = runs[key] = dict(CACHE.run(f"sweep-{key}", workload, options))
                try:
                    one, most = _state_bytes(options)
                except KVCoreError:  # the run said why; the sizes are not there either
                    one = most = 0
                row.update(state_bytes=one, most_state_bytes=most, checkpoint=checkpoint)
                _say(key, row)
                rows.append(_sweep_row(model, label, row))
    recorder.data["runs"] = runs
    header = (
        "model", "workload", "checkpoint (tokens)", "state memory per request (at most)",
        "state memory per running request (mean held)", "hit rate",
        "share of the 16-token ceiling", "preemptions", "peak running", "max_model_len",
    )  # fmt: skip
    recorder.tables["sweep"] = table("The Mamba checkpoint sweep (two-level pool)", header, rows)
    _sweep_figures(recorder, runs, checkpoints)
    SWEEP_PLOT.write_text(_sweep_plot(runs, checkpoints))
    print(f"[plot: {SWEEP_PLOT.relative_to(REPO)}]")


def _sweep_row(model: str, label: str, row: dict[str, Any]) -> tuple[str, ...]:
    most = _mib(row["most_state_bytes"])
    if "refused" in row:
        return (model, label, str(row["checkpoint"]), most,
                "does not fit", "", "", "", "", "")  # fmt: skip
    longest = f"{row['max_model_len']:,}"
    if row["rejected"]:
        longest += f" ({row['rejected']:,} requests too long)"
    return (
        model, label, str(row["checkpoint"]), most,
        _mib(row["held_state_bytes"]), percent(row["hit_rate"]),
        percent(row["of_fine_ceiling"]), f"{row['preemptions']:,}", f"{row['peak_running']:,}",
        longest,
    )  # fmt: skip


def _best_checkpoint(runs: dict[str, dict[str, Any]], checkpoints: Sequence[int]) -> int:
    """The checkpoint whose hit rate comes closest to each cell's best, on average.

    Each (model, cell) counts its hit rate at a checkpoint as a share of the
    highest any checkpoint reached there, so a cell of low hit rates (the
    conversation trace) weighs as much as one of high rates; the checkpoint
    with the highest mean share wins. A run that cannot be planned counts
    as no hits; on a tie the larger checkpoint (less state memory) wins.
    """
    cells = [f"{m}-{cell}" for m in MODELS for cell, _, _ in SWEEP_CELLS]

    def hits(cell: str, checkpoint: int) -> float:
        return float(runs[f"{cell}-{checkpoint}"].get("hit_rate", 0.0))

    best = {cell: max(hits(cell, c) for c in checkpoints) for cell in cells}

    def mean_share(checkpoint: int) -> float:
        shares = [hits(cell, checkpoint) / best[cell] if best[cell] else 1.0 for cell in cells]
        return sum(shares) / len(shares)

    return max(checkpoints, key=lambda c: (round(mean_share(c), 4), c))


def _sweep_figures(
    recorder: Recorder, runs: dict[str, dict[str, Any]], checkpoints: Sequence[int]
) -> None:
    for key, row in runs.items():
        if "refused" not in row:
            recorder.figure(f"{key}-hit-rate", percent(row["hit_rate"]))
            recorder.figure(f"{key}-of-fine-ceiling", percent(row["of_fine_ceiling"]))
            recorder.figure(f"{key}-preemptions", f"{row['preemptions']:,}")
    best = _best_checkpoint(runs, checkpoints)
    recorder.figure("best-checkpoint", f"{best} tokens")
    recorder.data["best_checkpoint"] = best


def _sweep_plot(runs: dict[str, dict[str, Any]], checkpoints: Sequence[int]) -> str:
    """Hit rate and state memory per running request against the checkpoint, as an SVG."""
    hits, state = {}, {}
    for model in MODELS:
        for cell, cell_label, _ in SWEEP_CELLS:
            label = f"{model}, {cell_label}"
            cells = [(c, runs[f"{model}-{cell}-{c}"]) for c in checkpoints]
            hits[label] = [(c, 100 * r["hit_rate"]) for c, r in cells if "refused" not in r]
            state[label] = [
                (c, r["held_state_bytes"] / 2**20) for c, r in cells if "refused" not in r
            ]
    return line_chart(
        title="Mamba checkpoint sweep, two-level pool",
        x_label="tokens between two cached states (log scale)",
        x_ticks=list(checkpoints),
        panels=[("prompt tokens hit (%)", hits), ("state held per running request (MiB)", state)],
    )


# -- states -----------------------------------------------------------------------------


def _states_options(
    model: str, memory: str, variant: str, eviction: str = "lru"
) -> SimulationOptions:
    """``variant``: ``"shared"``, or the two-level pool with that ``prefill_states``."""
    if variant == "shared":
        return SimulationOptions(model=model, memory=memory, pool="shared", eviction=eviction)
    return SimulationOptions(
        model=model,
        memory=memory,
        pool="two-level",
        eviction=eviction,
        plan_options={"mamba.prefill_states": variant},
    )


STATES_VARIANTS = ("shared", *PREFILL_STATES)


def states(recorder: Recorder) -> None:
    """Every or selective prefill states (two-level pool), next to the shared pool."""
    runs: dict[str, dict[str, Any]] = {}
    _states_builtin(recorder, runs)
    _states_policies(recorder, runs)
    recorder.data["runs"] = runs


def _states_builtin(recorder: Recorder, runs: dict[str, dict[str, Any]]) -> None:
    """The built-in workload, each model at each memory, under ``lru``."""
    workload = load_workload()
    header = (
        "model", "memory", "pool, prefill states", "hit rate", "share of the 16-token ceiling",
        "preemptions", "peak running", "state held per running request",
    )  # fmt: skip
    rows = []
    for model in MODELS:
        for memory in MEMORIES:
            for variant in STATES_VARIANTS:
                key = f"builtin-{model}-{memory}-{variant}"
                options = _states_options(model, memory, variant)
                row = runs[key] = CACHE.run(f"states-{key}", workload, options)
                _say(key, row)
                held = _mib(row["held_state_bytes"]) if "held_state_bytes" in row else ""
                pool = "shared" if variant == "shared" else f"two-level, {variant}"
                rows.append((
                    model, memory.replace("GiB", " GiB"), pool, percent(row["hit_rate"]),
                    percent(row["of_fine_ceiling"]), f"{row['preemptions']:,}",
                    f"{row['peak_running']:,}", held,
                ))  # fmt: skip
                recorder.figure(f"{key}-hit-rate", percent(row["hit_rate"]))
                recorder.figure(f"{key}-of-fine-ceiling", percent(row["of_fine_ceiling"]))
                recorder.figure(f"{key}-preemptions", f"{row['preemptions']:,}")
    title = "Prefill states on the built-in workload"
    recorder.tables["builtin"] = table(title, header, rows)


def _states_policies(recorder: Recorder, runs: dict[str, dict[str, Any]]) -> None:
    """The first requests of the conversation trace at 80 GiB, every eviction policy."""
    workload = load_workload(CONVERSATION_TRACE, limit=MOONCAKE_REQUESTS)
    lower = dict.fromkeys(PREFILL_STATES, 0)
    rows = []
    for model in MODELS:
        for policy in available_eviction_policies():
            cells = {}
            for variant in STATES_VARIANTS:
                key = f"mooncake-{model}-{policy}-{variant}"
                options = _states_options(model, "80GiB", variant, policy)
                cells[variant] = runs[key] = CACHE.run(f"states-{key}", workload, options)
                _say(key, cells[variant])
                recorder.figure(f"{key}-hit-rate", percent(cells[variant]["hit_rate"]))
            for variant in PREFILL_STATES:
                lower[variant] += cells[variant]["hit_rate"] < cells["shared"]["hit_rate"]
            rows.append((
                model, policy, *(percent(cells[v]["hit_rate"]) for v in STATES_VARIANTS),
                percent(cells["shared"]["fine_ceiling_rate"]),
            ))  # fmt: skip
    for variant, count in lower.items():
        recorder.figure(f"mooncake-{variant}-lower", f"{count} of {len(rows)}")
    header = (
        "model", "policy", "shared", "two-level, every", "two-level, selective",
        "ceiling at 16 tokens",
    )  # fmt: skip
    title = (
        f"Prefill states on the first {MOONCAKE_REQUESTS:,} requests of the conversation "
        "trace at 80 GiB, every eviction policy (prompt tokens hit)"
    )
    recorder.tables["mooncake"] = table(title, header, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "measurement", choices=("builtin", "mooncake", "sweep", "states", "concurrency")
    )
    parser.add_argument("--record", action="store_true", help="write the record")
    parser.add_argument(
        "--checkpoints", type=lambda text: [int(t) for t in text.split(",")],
        default=list(CHECKPOINTS), help="sweep: checkpoints, comma-separated",
    )  # fmt: skip
    parser.add_argument(
        "--cache", type=Path, default=None,
        help="keep finished runs in this JSON file and reuse them (resume a measurement)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    CACHE.load(args.cache)
    names = {
        "builtin": "two-level-builtin",
        "mooncake": "two-level-mooncake",
        "sweep": "mamba-checkpoint-sweep",
        "states": "mamba-prefill-states",
        "concurrency": "two-level-concurrency",
    }
    given = list(argv if argv is not None else sys.argv[1:])
    if args.cache is not None:  # where runs are kept is no part of the measurement
        at = next(i for i, word in enumerate(given) if word.startswith("--cache"))
        del given[at : at + (1 if "=" in given[at] else 2)]
    shown = ["python", "benchmarks/two_level_pool.py", *given]
    recorder = Recorder(names[args.measurement], enabled=args.record, command=" ".join(shown))
    if args.measurement == "builtin":
        builtin(recorder)
    elif args.measurement == "mooncake":
        mooncake(recorder)
    elif args.measurement == "states":
        states(recorder)
    elif args.measurement == "concurrency":
        concurrency(recorder)
    else:
        sweep(recorder, args.checkpoints)
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
