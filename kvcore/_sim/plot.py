"""``--plot``: pool usage and prefix-hit rate over simulated time, as a PNG (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvcore._sim.report import GroupUse, SimulationReport
from kvcore.errors import KVCoreError

__all__ = ["PlotUnavailableError", "group_shares", "plot_report"]


class PlotUnavailableError(KVCoreError, ImportError):
    """matplotlib, needed for ``--plot``, is not installed."""


def _pyplot() -> Any:
    try:
        import matplotlib as mpl
    except ImportError:
        msg = "--plot needs matplotlib: pip install 'kvcore[plot]'"
        raise PlotUnavailableError(msg) from None
    mpl.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def plot_report(report: SimulationReport, path: str | Path) -> None:
    """Draw usage per group and the hit rate against simulated time into ``path``.

    Top panel: blocks held per KV cache group and by the whole pool, as a
    share of the pool (in a two-level pool: a group's small pages in large
    pages' worth of memory, and the large pages holding a block in use).
    Bottom panel: the cumulative prefix-hit rate (first admissions) with the
    workload's unbounded-cache ceiling, and the running and waiting requests
    on a second axis.

    Raises:
        PlotUnavailableError: matplotlib is missing.
        KVCoreError: the file cannot be written.
    """
    plt = _pyplot()
    # Sized to stay legible when a page scales the PNG to a ~700 px column.
    with plt.rc_context({"font.size": 11, "legend.fontsize": 10}):
        _draw(plt, report, path)


def _draw(plt: Any, report: SimulationReport, path: str | Path) -> None:
    samples = report.samples
    usable = report.blocks.usable or 1
    times = [s.time_s for s in samples]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.4), sharex=True)
    top.plot(times, [100 * s.used_blocks / usable for s in samples], color="black", label="pool")
    series = group_shares(report)
    styles = ("-", "--", ":", "-.")
    for number, (values, groups) in enumerate(series.items()):
        top.plot(
            times,
            [100 * v for v in values],
            label=_group_label(groups),
            linewidth=1.4,
            linestyle=styles[number % len(styles)],
            color=f"C{number % 10}",
        )
    top.set_ylabel(
        "memory held (% of pool)" if report.blocks.classes else "blocks held (% of pool)"
    )
    top.set_ylim(0, 105)
    top.legend(loc="upper left")
    top.grid(alpha=0.3)
    bottom.plot(times, [100 * s.hit_rate for s in samples], color="tab:blue", label="hit rate")
    bottom.axhline(
        100 * report.prefix_cache.ceiling_rate,
        color="tab:blue",
        linestyle="--",
        label="ceiling (final)",
    )
    if report.belady_rate is not None:
        bottom.axhline(
            100 * report.belady_rate, color="tab:purple", linestyle=":", label="belady (final)"
        )
    bottom.set_ylabel("prompt tokens hit (%)")
    bottom.set_ylim(0, 100)
    bottom.set_xlabel("simulated time (s)")
    bottom.grid(alpha=0.3)
    queue = bottom.twinx()
    queue.plot(
        times, [s.running for s in samples], color="tab:green", linewidth=0.8, label="running"
    )
    queue.plot(times, [s.waiting for s in samples], color="tab:red", linewidth=0.8, label="waiting")
    queue.set_ylabel("requests")
    lines = bottom.get_legend_handles_labels()
    more = queue.get_legend_handles_labels()
    bottom.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left", ncol=2)
    source = report.workload.name
    if report.workload.seed is None:  # a trace file: its name is enough
        source = Path(source).name
    figure.suptitle(f"kvcore simulate {report.model} ({report.eviction.policy}): {source}")
    figure.tight_layout()
    try:
        figure.savefig(path, dpi=150)
    except OSError as exc:
        msg = f"cannot write plot to {path}: {exc.strerror or exc}"
        raise KVCoreError(msg) from None
    finally:
        plt.close(figure)


def group_shares(report: SimulationReport) -> dict[tuple[float, ...], list[GroupUse]]:
    """Each group's blocks held at every sample as a share of the pool (0.0 to 1.0).

    In a two-level pool a group's small pages are counted in large pages'
    worth of memory (the pool's unit), so that every share is one of the
    same memory. Groups with the same series (the groups of one windowed
    type, strided over a model's layers, hold the same blocks at every step)
    are one entry, listing all of them.
    """
    usable = report.blocks.usable or 1
    per_page = [g.pages_per_large_page for g in report.plan.groups]
    series: dict[tuple[float, ...], list[GroupUse]] = {}
    for group in report.blocks.groups:
        scale = per_page[group.group] * usable
        values = tuple(s.group_blocks[group.group] / scale for s in report.samples)
        series.setdefault(values, []).append(group)
    return series


def _group_label(groups: list[GroupUse]) -> str:
    """``group 1 (full_attention)``, or ``groups 0-5 (sliding_window, each)`` for equal series."""
    kinds = sorted({group.kind for group in groups})
    indices = [group.group for group in groups]
    if len(indices) == 1:
        return f"group {indices[0]} ({kinds[0]})"
    contiguous = indices == list(range(indices[0], indices[-1] + 1))
    which = f"{indices[0]}-{indices[-1]}" if contiguous else ",".join(map(str, indices))
    return f"groups {which} ({', '.join(kinds)}, each)"
