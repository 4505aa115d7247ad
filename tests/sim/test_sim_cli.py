"""``kvcore simulate`` and ``kvcore workload`` through the CLI entry point."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from kvcore._cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--limit", "60", "--memory", "2GiB", "--max-model-len", "32768"]


def run_json(capsys, *argv):
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_prints_the_report(capsys):
    assert main(["simulate", *SMALL]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvcore simulate: gpt-oss-20b on built-in (seed 0, 60 requests)")
    for label in ("plan", "prefix hits", "preemptions", "blocks", "steps", "manager", "wall"):
        assert f"  {label}" in out


def test_simulate_json_and_seed(capsys):
    first = run_json(capsys, *SMALL, "--seed", "5")
    again = run_json(capsys, *SMALL, "--seed", "5")
    assert first["workload"]["seed"] == 5
    assert first["prefix_cache"] == again["prefix_cache"]
    assert first["finished"] == 60
    assert set(first["timeline"]) >= {"time_s", "used_blocks", "group_blocks", "hit_rate"}


def test_json_sections_and_the_eviction_policy(capsys):
    data = run_json(capsys, *SMALL, "--eviction", "frequency")
    assert set(data) == {
        "model",
        "workload",
        "plan",
        "scheduler",
        "eviction",
        "finished",
        "prefix_cache",
        "preemptions",
        "blocks",
        "steps",
        "manager",
        "timing",
        "timeline",
    }
    # The sections that existed before the eviction policies keep their keys;
    # the ceiling at the finest block came with the two-level pool.
    assert set(data["prefix_cache"]) == {
        "hit_tokens",
        "prompt_tokens",
        "hit_rate",
        "ceiling_tokens",
        "ceiling_rate",
        "ceiling_block_size",
        "fraction_of_ceiling",
        "fine_ceiling_tokens",
        "fine_block_size",
        "fine_ceiling_rate",
        "fraction_of_fine_ceiling",
    }
    assert set(data["blocks"]) >= {"usable", "peak", "mean", "peak_usage", "mean_usage"}
    assert set(data["manager"]["ops"]["decode"]) == {
        "count",
        "total_ms",
        "mean_us",
        "p50_us",
        "p99_us",
    }
    assert data["eviction"]["policy"] == "frequency"
    assert data["eviction"]["belady_hit_tokens"] is None
    assert data["eviction"]["evicted_blocks"] >= 0


def test_the_text_report_names_the_policy_and_the_optimum(capsys):
    assert main(["simulate", *SMALL, "--eviction", "admit", "--with-belady"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"  eviction     admit: [\d,]+ cached blocks evicted; offline optimum", out)


def test_progress_bar_is_quiet_when_piped(capsys):
    main(["simulate", *SMALL])
    assert capsys.readouterr().err == ""


def test_workload_then_simulate_the_file(tmp_path, capsys):
    path = tmp_path / "w.jsonl"
    assert main(["workload", str(path), "--requests", "40", "--seed", "2"]) == 0
    assert "wrote 40 requests" in capsys.readouterr().out
    from_file = run_json(
        capsys, "--trace", str(path), "--memory", "2GiB", "--max-model-len", "32768"
    )
    built_in = run_json(
        capsys, "--limit", "40", "--seed", "2", "--memory", "2GiB", "--max-model-len", "32768"
    )
    assert from_file["workload"]["name"] == str(path)
    assert from_file["prefix_cache"] == built_in["prefix_cache"]


def test_workload_to_stdout(capsys):
    assert main(["workload", "-", "--requests", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert set(json.loads(lines[0])) == {
        "timestamp",
        "input_length",
        "output_length",
        "hash_ids",
        "request_id",
    }


def test_mooncake_trace_with_limit(capsys, conversation_trace):
    data = run_json(
        capsys, "--trace", str(conversation_trace), "--limit", "30", "--arrival", "asap"
    )
    assert data["workload"]["requests"] == 30
    assert data["finished"] == 30
    assert data["prefix_cache"]["hit_rate"] > 0


def test_malformed_line_stops_with_file_line_and_reason(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt_token_ids": [1, 2, 3], "output_length": 2}\n{"hash_ids": 5}\n')
    assert main(["simulate", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvcore: error: {path}:2: ")
    assert "missing field" in err
    assert "--skip-bad-lines" in err
    data = run_json(capsys, "--trace", str(path), "--skip-bad-lines")
    assert data["workload"]["bad_lines"] == 1
    assert data["finished"] == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--trace", "x.jsonl", "--seed", "1"], "--seed applies to the built-in workload"),
        (["--skip-bad-lines"], "--skip-bad-lines applies to a --trace file"),
        (["--limit", "0"], "--limit must be a positive integer"),
        (["--max-num-seqs", "0"], "max_num_seqs must be a positive integer"),
        (["--plot", "out.svg"], "give a file name ending in .png"),
        (["no-such-model"], "unknown model 'no-such-model'"),
        (["--memory", "10MiB", "--max-model-len", "32768"], "give at least 963.75 MiB"),
        (["--memory", "10MiB"], "too long for max_model_len=192"),
        (["--only", "nope"], "nope"),
        (["--eviction", "lfu"], "unknown eviction policy 'lfu'. Available: lru, admit"),
    ],
)
def test_bad_input_is_one_line_with_exit_status_2(capsys, argv, message):
    assert main(["simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcore: error: ")
    assert message in err
    assert err.count("\n") == 1


def test_plot_writes_a_png(tmp_path, capsys):
    path = tmp_path / "sim.png"
    assert main(["simulate", *SMALL, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot         {path}" in capsys.readouterr().out


def test_plot_without_matplotlib_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert main(["simulate", *SMALL, "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'kvcore[plot]'" in err
    assert not (tmp_path / "x.png").exists()


def _options(subcommand):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[subcommand]
    return [
        s for a in sub._actions for s in a.option_strings if s.startswith("--") and s != "--help"
    ]


def _subcommands():
    parser = build_parser()
    return sorted(next(a for a in parser._actions if a.dest == "command").choices)


def test_the_cli_reference_covers_every_subcommand():
    assert {"plugins", "simulate", "workload"} <= set(_subcommands())
    text = (REPO / "docs" / "reference" / "cli.rst").read_text()
    missing = [name for name in _subcommands() if f"\nkvcore {name}\n---" not in text]
    assert not missing, f"docs/reference/cli.rst has no section for: kvcore {missing}"


@pytest.mark.parametrize("subcommand", _subcommands())
def test_every_option_is_in_the_cli_reference(subcommand):
    text = (REPO / "docs" / "reference" / "cli.rst").read_text()
    # The subcommand's section: from its title to the next section title.
    section = text.split(f"\nkvcore {subcommand}\n---", 1)[-1]
    section = re.split(r"\n[^\n]+\n-{3,}\n", section, maxsplit=1)[0]
    options = _options(subcommand)
    assert options
    missing = [o for o in options if f".. option:: {o}" not in section]
    assert not missing, f"docs/reference/cli.rst, kvcore {subcommand}: undocumented {missing}"


def test_simulate_takes_a_plugins_plan_option(capsys):
    argv = ["qwen3-next-80b", "--pool", "two-level", "--limit", "20"]
    every = run_json(capsys, *argv)
    selective = run_json(capsys, *argv, "--option", "mamba.prefill_states=selective")
    # The same requests, planned alike: only which states the prefills keep differs.
    assert selective["plan"] == every["plan"]
    assert selective["prefix_cache"]["prompt_tokens"] == every["prefix_cache"]["prompt_tokens"]
    assert main(["simulate", *argv, "--option", "mamba.prefill_states=some"]) == 2
    assert "must be one of 'every', 'selective', got 'some'" in capsys.readouterr().err
