"""``kvcore simulate --execute``: the executor attached to the simulator's scheduler."""

from __future__ import annotations

import json

import pytest

from kvcore._cli.main import main
from kvcore._exec.simulate import resolve_model
from kvcore.executor import tiny_model_path


def write_trace(path, prompts, output_length=5, timestamps=None):
    with path.open("w") as out:
        for index, prompt in enumerate(prompts):
            record = {
                "timestamp": timestamps[index] if timestamps else index * 50,
                "prompt_token_ids": prompt,
                "output_length": output_length,
            }
            out.write(json.dumps(record) + "\n")
    return path


def test_execute_checks_every_computed_position(tmp_path, capsys):
    prompts = [[i * 100 + t for t in range(20 + 7 * i)] for i in range(5)]  # nothing shared
    trace = write_trace(tmp_path / "t.jsonl", prompts, output_length=5)
    argv = ["simulate", "tiny-gemma", "--trace", str(trace), "--memory", "1MiB", "--execute"]
    argv += ["--max-num-batched-tokens", "16", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    execution = data["execution"]
    assert execution["ok"] is True
    assert execution["num_mismatches"] == 0
    # Every prompt token and every output token but the last is computed once
    # (no hits, no preemption with 1 MiB): sum of (prompt + 5 - 1).
    assert data["prefix_cache"]["hit_tokens"] == 0
    assert execution["positions_checked"] == sum(len(p) + 4 for p in prompts)
    assert execution["layers"] == 5
    assert execution["device"] in ("cpu", "cuda:0")


def test_execute_appends_its_line_to_the_report(tmp_path, capsys):
    shared = list(range(40))
    prompts = [shared + [500 + i] * (3 + i) for i in range(4)]  # hits on the shared 40 tokens
    trace = write_trace(tmp_path / "t.jsonl", prompts)
    argv = ["simulate", "tiny-mla", "--trace", str(trace), "--memory", "1MiB", "--execute"]
    argv += ["--pool", "shared"]  # the plan this test was worked out for
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "  prefix hits" in out
    (line,) = [line for line in out.splitlines() if line.startswith("  execute")]
    assert "x 4 layers checked (4 requests" in line
    assert line.endswith("bit-exact against the dense oracle")


def test_a_state_cached_in_the_same_step_is_adopted_one_step_later(tmp_path, capsys):
    """The simulator announces every step, so the hazard of the same-step hit is gone.

    Two identical 40-token prompts arrive together (block 16). Request "2"
    hits the 32 tokens "1" caches in the first step, but the state after 32
    tokens is written only while that step runs: the Mamba manager keeps "2"
    waiting one step, then it adopts the hit and every position matches the
    dense oracle. Checked positions: "1" computes 40 + 4, "2" 8 + 4 (the
    last of 5 output tokens is never fed back). Before the rule, "2" read
    the unwritten state at position 32 in step 1 (see test_engine for the
    hazard itself).
    """
    prompts = [list(range(40)), list(range(40))]
    trace = write_trace(tmp_path / "t.jsonl", prompts, timestamps=[0, 0])
    argv = ["simulate", "tiny-qwen-next", "--trace", str(trace), "--memory", "1MiB"]
    argv += ["--execute", "--arrival", "asap", "--json"]
    argv += ["--pool", "shared"]  # the plan this test was worked out for
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["prefix_cache"]["hit_tokens"] == 32
    assert data["execution"]["num_mismatches"] == 0
    assert data["execution"]["positions_checked"] == (40 + 4) + (8 + 4)


def test_execute_refuses_a_large_cache(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", [list(range(10))])
    assert main(["simulate", "tiny-gemma", "--trace", str(trace), "--execute"]) == 2  # 80GiB
    err = capsys.readouterr().err
    assert "--execute allocates the whole KV cache" in err
    assert "give a smaller --memory" in err


def test_execute_needs_encoder_inputs_for_cross_attention(tmp_path, capsys):
    trace = write_trace(tmp_path / "t.jsonl", [list(range(10))])
    argv = ["simulate", "tiny-whisper", "--trace", str(trace), "--memory", "1MiB"]
    argv += ["--execute", "--no-prefix-caching"]
    assert main(argv) == 2
    assert "has no encoder output" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tiny-hybrid", "gpt-oss-20b", "some/config.json"])
def test_tiny_model_names_resolve_to_their_configs(name):
    expected = str(tiny_model_path(name)) if name.startswith("tiny-") else name
    assert resolve_model(name) == expected
