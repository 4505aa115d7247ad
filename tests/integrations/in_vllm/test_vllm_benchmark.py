"""benchmarks/bench_vllm_scheduler.py on a few requests: it compares, times and refuses."""

from __future__ import annotations

import importlib.util
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
