"""The records the docs' figures come from: what the scripts write, and what they measure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark
from simhelpers import assert_refused

record = load_benchmark("_record")
trace_reuse = load_benchmark("trace_reuse")
record_simulations = load_benchmark("record_simulations")


def test_a_record_holds_its_provenance_and_only_what_was_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    recorder = record.Recorder("demo", enabled=True)
    with recorder.section("table"):
        print("a 1")
        print("b 2")
    recorder.figure("ratio", record.ratio(2.345))
    recorder.tables["t"] = record.table("T", ["x", "y"], [[1, 2]])
    path = record.write_record(
        "demo",
        figures=recorder.figures,
        tables=recorder.tables,
        outputs=recorder.outputs,
        command="python benchmarks/demo.py",
        results=tmp_path,
    )
    written = json.loads(path.read_text())
    assert written["command"] == "python benchmarks/demo.py"
    assert written["date"].endswith(" UTC")
    assert written["load"].count("load average") == 2  # at the start and at the end
    assert written["load"].endswith("at end")
    assert written["commit"]  # a commit id, possibly "+ changes"
    assert written["figures"] == {"ratio": "2.35×"}
    assert written["tables"]["t"] == {"title": "T", "header": ["x", "y"], "rows": [["1", "2"]]}
    assert written["outputs"] == {"table": "a 1\nb 2\n"}
    assert "a 1\nb 2\n" in capsys.readouterr().out  # printed as usual too


def test_a_recorder_not_asked_to_record_writes_nothing():
    assert record.Recorder("demo", enabled=False).write() is None


def test_a_table_row_must_fill_the_header():
    with pytest.raises(ValueError, match="a row of 1 cells under 2 columns"):
        record.table("T", ["x", "y"], [[1]])


def test_figure_formats():
    assert record.percent(0.63148) == "63.1 %"
    assert record.span(1.451, 1.6449, unit="×") == "1.45–1.64×"
    assert record.span(2.001, 2.004, unit="×") == "2.00×"


def test_trace_reuse_counts_chunks_and_gaps_by_hand(tmp_path: Path):
    # Chunk 0 at 0, 10, 20 s; chunk 1 at 0 s and 20 s; chunk 2 once; chunk 3 once.
    lines = [
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [0, 1]},
        {"timestamp": 10_000, "input_length": 1024, "output_length": 1, "hash_ids": [0, 2]},
        {"timestamp": 20_000, "input_length": 1536, "output_length": 1, "hash_ids": [0, 1, 3]},
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    found = trace_reuse.reuse(trace, None)
    assert found["requests"] == 3
    assert found["chunks"] == 4
    assert found["used_once"] == 0.5  # chunks 2 and 3
    assert found["reuses"] == 3  # gaps of 10 s, 10 s (chunk 0) and 20 s (chunk 1)
    assert found["gap_median"] == 10
    with pytest.raises(ValueError, match="1 reuse\\(s\\) in 2 requests; gaps need at least 2"):
        trace_reuse.reuse(trace, 2)


def test_the_simulation_figures_come_from_the_report():
    data = {
        "manager": {
            "total_s": 2.2449,
            "per_step_p50_us": 28.9,
            "per_step_p99_us": 667.1,
            "per_step_mean_us": 53.1,
            "per_decode_step_mean_us": 32.4,
            "ops": {
                op: {"count": 0, "mean_us": 0.0, "p50_us": 0.0}
                for op in ("lookup", "admit", "prefill", "decode", "free")
            }
            | {"decode": {"count": 5, "mean_us": 2.034, "p50_us": 0.64}},
        },
        "prefix_cache": {"hit_rate": 0.6313, "ceiling_rate": 0.6438, "fraction_of_ceiling": 0.98},
        "blocks": {"peak_usage": 0.0998, "mean_usage": 0.021},
        "timing": {"simulator_overhead_s": 1.04, "total_s": 3.41},
        "steps": {"simulated_s": 299.9},
        "preemptions": {"lost_tokens": 200, "resume_hit_tokens": 199},
    }
    got = record_simulations.figures(data)
    assert got["hit-rate"] == "63.1 %"
    assert got["of-ceiling"] == "98.0 %"
    assert got["kvcore"] == "2.2 s"
    assert got["step-p99"] == "667 µs"
    assert got["decode-mean"] == "2.0 µs"
    assert got["found-again"] == "99.5 %"
    assert "lookup-mean" not in got  # no call, no figure


def test_record_simulations_refuses_an_unknown_run(capsys: pytest.CaptureFixture[str]):
    assert_refused(record_simulations.main, ["nosuchrun"], "unknown run(s) nosuchrun", capsys)
    assert record_simulations.argv_of(record_simulations.RUNS["conversation-whole"])[-1] == str(
        record_simulations.CONVERSATION_TRACE
    )


def test_the_vllm_scheduler_record_is_each_setup_and_the_mirror_share_range():
    bench = load_benchmark("bench_vllm_scheduler")

    def result(config: str, share_of: float) -> dict:
        # Stock 2 s and 400 µs a step, kvcore 1 s and 300 µs; the mirror 1,000 calls in 2 ms.
        return {
            "config": config,
            "steps": 1234,
            "preemptions": 3,
            "total_s": [2.0, 1.0],
            "median_s": [400e-6, 300e-6],
            "mirror": {"calls": 1000, "sync_s": 0.002, "step_s": 0.002 / share_of},
        }

    recorder = record.Recorder("t", enabled=False)
    bench.record(recorder, [result("full", 0.05), result("eagle", 0.06)])
    full = {k: v for k, v in recorder.figures.items() if k.startswith("full.")}
    assert full == {
        "full.steps": "1,234",
        "full.preemptions": "3",
        "full.stock-total": "2.00 s",
        "full.kvcore-total": "1.00 s",
        "full.stock-median": "400.0 µs",
        "full.kvcore-median": "300.0 µs",
        "full.ratio-total": "0.50×",
        "full.ratio-median": "0.75×",
        "full.mirror-calls": "1,000",
        "full.mirror-call": "2.00 µs",  # 2 ms / 1,000
        "full.mirror-share": "5.0 %",
    }
    assert recorder.figures["mirror-share"] == "5.0–6.0 %"
    assert recorder.tables["full"]["rows"] == [
        ["vLLM 0.14 (stock)", "2.00 s", "400.0 µs"],
        ["vLLM 0.14 on kvcore", "1.00 s", "300.0 µs"],
        ["kvcore / stock", "0.50×", "0.75×"],
    ]
    assert recorder.tables["setups"]["rows"] == [
        ["full", "1,234", "3", "0.50×", "0.75×", "5.0 %"],
        ["eagle", "1,234", "3", "0.50×", "0.75×", "6.0 %"],
    ]
