"""benchmarks/fuzz_cluster_index.py: what it records, by hand and from a short run on Redis."""

from __future__ import annotations

import json
import sys

import pytest
from benchmark_scripts import load_benchmark

fuzz = load_benchmark("fuzz_cluster_index")
STORES = "16,384 stores into empty entries"
SWAP = "8,192 removals + 8,192 stores, full engine"


def _run(batches: int, apply_ms: float, query_ms: float, over: int, **counts: int) -> dict:
    return {
        "batches": batches,
        "crashes": counts.get("crashes", 0),
        "divergences": counts.get("divergences", 0),
        "longest_apply_ms": apply_ms,
        "longest_query_ms": query_ms,
        "apply_calls_over_100_ms": over,
    }


def test_the_record_sums_the_runs_and_spans_the_largest_batches():
    runs = [_run(600, 6.3, 1.0, 0), _run(400, 2.0, 3.5, 1, crashes=2)]
    largest = [
        {
            f"int: {STORES}": 11.2,
            f"int: {SWAP}": 23.0,
            f"sha256: {STORES}": 18.4,
            f"sha256: {SWAP}": 42.3,
        },
        {
            f"int: {STORES}": 12.0,
            f"int: {SWAP}": 25.5,
            f"sha256: {STORES}": 14.0,
            f"sha256: {SWAP}": 30.0,
        },
    ]
    recorder = fuzz.Recorder("t", enabled=False)
    fuzz.record(recorder, runs, largest)
    assert recorder.figures == {
        "fuzz.batches": "1,000",  # 600 + 400
        "fuzz.crashes": "2",
        "fuzz.divergences": "0",
        "fuzz.runs": "2",
        "fuzz.longest-batch": "6.3 ms",  # the first run's
        "fuzz.longest-query": "3.5 ms",  # the second run's
        "fuzz.over-100-ms": "1",
        # Every round and both hashes: 11.2 to 18.4 ms, 23.0 to 42.3 ms, whole ms.
        "largest.stores": "11–18 ms",
        "largest.removals-and-stores": "23–42 ms",
    }
    assert recorder.tables["largest"]["rows"] == [
        [STORES, "int", "11.2–12.0 ms"],
        [STORES, "sha256", "14.0–18.4 ms"],
        [SWAP, "int", "23.0–25.5 ms"],
        [SWAP, "sha256", "30.0–42.3 ms"],
    ]
    assert recorder.tables["largest"]["title"].endswith("2 rounds")


def test_a_short_run_records_what_it_printed(redis_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys.modules["_record"], "RESULTS", tmp_path)
    argv = [
        "--batches",
        "300",
        "--seed",
        "5",
        "--hash",
        "fast",
        "sha256",
        "--largest-rounds",
        "1",
        "--redis",
        redis_server.url,
        "--record",
    ]
    assert fuzz.main(argv) == 0
    out = capsys.readouterr().out
    written = json.loads((tmp_path / "fuzz-cluster-index.json").read_text())
    assert written["command"].startswith("python benchmarks/fuzz_cluster_index.py --batches 300")
    figures = written["figures"]
    assert figures["fuzz.batches"] == "600"  # 300 a run, one run per hash
    assert figures["fuzz.crashes"] == figures["fuzz.divergences"] == "0"
    runs = written["data"]["runs"]
    assert [(r["hash"], r["seed"], r["batches"]) for r in runs] == [
        ("fast", 5, 300),
        ("sha256", 6, 300),
    ]
    longest = max(r["longest_apply_ms"] for r in runs)
    assert figures["fuzz.longest-batch"] == f"{longest:.1f} ms"
    times = written["data"]["largest_batches_ms"][0]
    assert sorted(times) == sorted(f"{h}: {w}" for h in ("int", "sha256") for w in (STORES, SWAP))
    assert all(ms > 0 for ms in times.values())  # the slow log saw every largest batch
    assert written["outputs"]["summary"] in out
    assert "300 batches (sha256 hashes, seed 6)" in written["outputs"]["summary"]


def test_a_setting_below_one_is_refused_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_info:
        fuzz.main(["--largest-rounds", "0"])
    assert exit_info.value.code == 2
    assert "argument --largest-rounds: must be an integer >= 1, got '0'" in capsys.readouterr().err
