"""benchmarks/bench_vllm_scheduler.py on a few requests: it compares, times, records and refuses."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from vllm_env import require_vllm

require_vllm()

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def load_benchmark():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(
        "bench_vllm_scheduler", BENCHMARKS / "bench_vllm_scheduler.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_short_replay_is_compared_timed_and_costed(conversation_trace, capsys):
    bench = load_benchmark()
    assert bench.main(["--requests", "12", "--blocks", "1024"]) == 0
    out = capsys.readouterr().out
    steps = re.search(r"([\d,]+) steps identical, (\d+) preemptions", out)
    assert steps is not None, out
    assert int(steps[1].replace(",", "")) > 12
    ratio = re.search(r"ratio kvcore / stock: total ([\d.]+)x", out)
    assert ratio is not None
    assert float(ratio[1]) > 0
    assert re.search(r"mirror sync: [\d,]+ calls", out)


def test_bad_counts_are_refused_naming_the_argument(capsys):
    bench = load_benchmark()
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--requests", "0"])
    assert exit_info.value.code == 2
    assert "argument --requests: must be an integer >= 1, got '0'" in capsys.readouterr().err


def test_a_recorded_run_keeps_every_setup_it_printed(
    conversation_trace, tmp_path, monkeypatch, capsys
):
    bench = load_benchmark()
    monkeypatch.setattr(sys.modules["_record"], "RESULTS", tmp_path)
    argv = ["--requests", "12", "--blocks", "1024", "--config", "full", "mamba", "--record"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    written = json.loads((tmp_path / "bench-vllm-scheduler.json").read_text())
    assert written["command"] == "python benchmarks/bench_vllm_scheduler.py " + " ".join(argv)
    assert list(written["outputs"]) == ["full", "mamba"]
    rows = written["tables"]["setups"]["rows"]
    assert [row[0] for row in rows] == ["full", "mamba"]
    for config, row in zip(("full", "mamba"), rows, strict=True):
        printed = written["outputs"][config]
        assert printed in out
        ratio = re.search(r"ratio kvcore / stock: total ([\d.]+)x, median step ([\d.]+)x", printed)
        assert ratio is not None, printed
        figures = {
            k.split(".", 1)[1]: v
            for k, v in written["figures"].items()
            if k.startswith(f"{config}.")
        }
        # The figures are the printed run's, as the page shows them.
        assert figures["ratio-total"] == f"{ratio[1]}×"
        assert figures["ratio-median"] == f"{ratio[2]}×"
        steps = re.search(r"([\d,]+) steps identical, (\d+) preemptions", printed)
        assert (figures["steps"], figures["preemptions"]) == (steps[1], steps[2])
        assert row[1:5] == [steps[1], steps[2], f"{ratio[1]}×", f"{ratio[2]}×"]
        result = written["data"][config]
        assert result["total_s"][1] / result["total_s"][0] == pytest.approx(
            float(ratio[1]), abs=0.005
        )


def test_a_setup_named_twice_is_refused(capsys):
    bench = load_benchmark()
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--config", "full", "full"])
    assert exit_info.value.code == 2
    assert "argument --config: a setup named twice: full full" in capsys.readouterr().err
