"""benchmarks/two_level_pool.py and its plot: the choices and drawing worked out by hand."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from simhelpers import explicit

from kvcore._sim import SimulationOptions
from kvcore._sim.workload import Workload

two_level_pool = load_benchmark("two_level_pool")
svg = load_benchmark("_svg")


def _cells(hits: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    """Runs keyed as the sweep keys them: six cells (model, cell) per checkpoint."""
    cells = [(m, c) for m in two_level_pool.MODELS for c, _, _ in two_level_pool.SWEEP_CELLS]
    return {
        f"{model}-{cell}-{checkpoint}": {"hit_rate": rate}
        for checkpoint, rates in hits.items()
        for (model, cell), rate in zip(cells, rates, strict=True)
    }


def test_the_best_checkpoint_comes_closest_to_each_cells_best():
    # The third cell of each model has low rates: 512 is 10x 1024's there.
    # Shares of each cell's best: 512 -> (0.5/0.6, 1, 1, 1, 1, 1), mean 0.972;
    # 1024 -> (1, 0.8, 0.1, 1, 1, 0.5), mean 0.733. By mean hit rate 1024
    # would win (0.6 + 0.16 + 0.004 + ... against 0.5 + 0.2 + 0.04 + ...).
    runs = _cells({
        512: [0.5, 0.2, 0.04, 0.6, 0.2, 0.02],
        1024: [0.6, 0.16, 0.004, 0.6, 0.2, 0.01],
    })  # fmt: skip
    assert two_level_pool._best_checkpoint(runs, [512, 1024]) == 512


def test_a_tie_goes_to_the_larger_checkpoint_and_a_refused_run_hits_nothing():
    runs = _cells({256: [0.4, 0.2, 0.1] * 2, 512: [0.4, 0.2, 0.1] * 2, 1024: [0.2, 0.1, 0.1] * 2})
    # 256 and 512 tie (every share 1); 1024 has shares (0.5, 0.5, 1) per model.
    assert two_level_pool._best_checkpoint(runs, [256, 512, 1024]) == 512
    runs["jamba-v0.1-8GiB-512"] = {"refused": "memory too small"}
    # 512 now has one share of 0: mean 5 / 6, below 256's 1.
    assert two_level_pool._best_checkpoint(runs, [256, 512, 1024]) == 256
    # A cell where no checkpoint hits counts as reached by all of them.
    for checkpoint in (256, 1024):
        runs[f"jamba-v0.1-8GiB-{checkpoint}"] = {"hit_rate": 0.0}
    assert two_level_pool._best_checkpoint(runs, [256, 512, 1024]) == 512


def test_nice_axis_tops():
    assert [svg._nice_top(v) for v in (0, 0.3, 1, 7, 63.1, 101, 2500)] == [
        1.0, 0.5, 1, 10, 100, 200, 5000,
    ]  # fmt: skip


def test_the_chart_places_points_on_a_log_axis():
    # The plot area runs from x = 80 to 720 - 24 = 696: 16 at its left edge,
    # 1024 at its right, 128 halfway (log2: 4, 7, 10). The y axis of the
    # panel tops at 50 (the nice top of 40); 240 px tall from y = 48: a value
    # of 40 lies at 48 + 240 - 40 / 50 * 240 = 96, one of 10 at 240.
    text = svg.line_chart(
        title="t",
        x_label="x",
        x_ticks=[16, 128, 1024],
        panels=[("y", {"a": [(16, 10.0), (128, 40.0), (1024, 10.0)]})],
    )
    root = ET.fromstring(text)
    namespace = {"s": "http://www.w3.org/2000/svg"}
    (line,) = root.findall("s:polyline", namespace)
    points = [tuple(map(float, p.split(","))) for p in line.get("points").split()]
    assert points == [(80.0, 240.0), (388.0, 96.0), (696.0, 240.0)]
    labels = [t.text for t in root.findall("s:text", namespace)]
    assert "a" in labels
    assert ["16", "128", "1024"] == [label for label in labels if label in {"16", "128", "1024"}]


def test_a_run_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    calls = []

    def fake_run(workload, options):
        calls.append(options.memory)
        return {"hit_rate": 0.5}

    monkeypatch.setattr(two_level_pool, "_run", fake_run)
    path = tmp_path / "cache.json"
    cache = two_level_pool._Cache()
    cache.load(path)
    workload = Workload(name="hand", requests=(explicit("a", range(10), 1),))
    options = SimulationOptions(memory="1GiB")
    assert cache.run("k", workload, options) == {"hit_rate": 0.5}
    again = two_level_pool._Cache()
    again.load(path)
    assert again.run("k", workload, options) == {"hit_rate": 0.5}
    assert calls == ["1GiB"]  # the second cache read the file instead of running
    assert json.loads(path.read_text()) == {"k": {"hit_rate": 0.5}}


def test_a_sweep_row_names_the_runs_that_do_not_fit_and_the_requests_too_long():
    refused = {"refused": "x", "checkpoint": 16, "most_state_bytes": 20 * 2**30}
    row = two_level_pool._sweep_row("m", "8 GiB", refused)
    assert row[:5] == ("m", "8 GiB", "16", "20,480 MiB", "does not fit")
    run = {
        "checkpoint": 512, "most_state_bytes": 17 * 3 * 12 * 2**20, "held_state_bytes": 36 * 2**20,
        "hit_rate": 0.25, "of_fine_ceiling": 0.5, "preemptions": 3, "peak_running": 40,
        "max_model_len": 65536, "rejected": 2,
    }  # fmt: skip
    row = two_level_pool._sweep_row("m", "8 GiB", run)
    assert row == (
        "m", "8 GiB", "512", "612 MiB", "36 MiB", "25.0 %", "50.0 %", "3", "40",
        "65,536 (2 requests too long)",
    )  # fmt: skip
    assert re.fullmatch(r"\d[\d,]* MiB", row[3])


def test_a_concurrency_row_sets_the_pools_side_by_side():
    shared = {"hit_rate": 0.08, "preemptions": 40, "simulated_s": 340.25, "peak_running": 32}
    two = {"hit_rate": 0.2, "preemptions": 3, "simulated_s": 330.0, "peak_running": 32}
    recorder = two_level_pool.Recorder("unused", enabled=False, command="")
    row = two_level_pool._concurrency_row(recorder, "m", 32, shared, two)
    # 0.2 / 0.08 = 2.5.
    assert row == (
        "m", "32", "8.0 % / 20.0 %", "2.50×", "40 / 3", "340.2 / 330.0", "32 / 32",
    )  # fmt: skip
    assert recorder.figures["m-32-hit-ratio"] == "2.50×"
    assert recorder.figures["m-32-two-level-preemptions"] == "3"
    assert recorder.figures["m-32-shared-simulated"] == "340.2 s"
