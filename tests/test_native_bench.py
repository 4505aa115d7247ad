"""benchmarks/bench_native.py without valgrind: the marked replay and the count parser.

Under callgrind the markers only delimit what is counted; here they must call
through unchanged, so the marked replay gives the same results on both
backends, and the parser must add up each marker's inclusive count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from native_backend import require_native

bench_native = load_benchmark("bench_native")


def test_the_marked_replay_gives_the_same_results_on_both_backends(
    tmp_path: Path, conversation_trace: Path
) -> None:
    require_native()
    trace = conversation_trace
    folder = bench_native.build_marks(tmp_path)
    runs = []
    for backend in bench_native.BACKENDS:
        args = argparse.Namespace(
            marks=str(folder),
            trace=str(trace),
            requests=6,
            max_output=8,
            num_blocks=600,
            block_size=16,
            max_running=4,
            backend=backend,
        )
        runs.append(bench_native.replay_marked(args))
    sys.modules.pop("_callgrind_marks", None)
    assert runs[0]["results"] == runs[1]["results"]
    # 6 requests: each admitted after one lookup at least, each freed once.
    lookups, admissions, decodes, frees = runs[0]["counts"]
    assert lookups == admissions >= 6
    assert frees >= 6
    assert decodes > 0


def test_the_parser_adds_each_markers_inclusive_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    annotated = """\
--------------------------------------------------------------------------------
Ir
--------------------------------------------------------------------------------
3,000,000 (100.0%)  PROGRAM TOTALS
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
1,200,000 (40.00%)  ???:kvbench_decode [/tmp/x/_callgrind_marks.so]
  900,000 (30.00%)  ???:kvbench_lookup [/tmp/x/_callgrind_marks.so]
  600,000 (20.00%)  ???:kvbench_admission [/tmp/x/_callgrind_marks.so]
  300,000 (10.00%)  ???:kvbench_free [/tmp/x/_callgrind_marks.so]
  250,000 ( 8.33%)  ???:_PyEval_EvalFrameDefault [/usr/lib/libpython3.11.so]
"""

    class Done:
        stdout = annotated

    monkeypatch.setattr(bench_native.subprocess, "run", lambda *a, **k: Done())
    assert bench_native.inclusive_counts(tmp_path / "profile") == {
        "decode": 1_200_000,
        "lookup": 900_000,
        "admission": 600_000,
        "free": 300_000,
    }
