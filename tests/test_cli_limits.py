"""Inputs without end or without bound: the ``kvcore`` command fails fast, naming what is wrong.

Each case runs the real command in a child process held to 2 GiB of address
space and a time limit, so a regression fails the test instead of filling
the machine's memory or hanging the suite.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

SIMULATE = ("simulate", "llama-3-8b", "--memory", "1GiB", "--limit", "2")
MODELS = Path(__file__).resolve().parents[1] / "kvcore" / "_planning" / "models"


def _limit_memory() -> None:
    two_gib = 2 << 30
    resource.setrlimit(resource.RLIMIT_AS, (two_gib, two_gib))


def kvcore(*argv: str, timeout: float = 60) -> tuple[int, str, float]:
    """Run ``kvcore argv``; its exit status, standard error and wall time."""
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "kvcore", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_limit_memory,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"kvcore {' '.join(argv)} ran past {timeout} s")
    return done.returncode, done.stderr, time.monotonic() - start


def one_error_line(status: int, err: str) -> str:
    assert status == 2, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert err.startswith("kvcore: error: "), err[-2000:]
    assert err.count("\n") == 1, err[-2000:]
    return err.strip()


def test_an_endless_line_fails_fast():
    """``--trace /dev/zero`` read one line without end and died of MemoryError."""
    status, err, elapsed = kvcore(*SIMULATE, "--trace", "/dev/zero")
    line = one_error_line(status, err)
    assert "/dev/zero:1: " in line
    assert "not a JSON object" in line
    assert elapsed < 30


def test_a_line_past_the_length_limit_is_refused(tmp_path):
    trace = tmp_path / "long.jsonl"
    with trace.open("w") as handle:
        handle.write('{"prompt_token_ids": [')
        handle.write("1, " * (23 << 20))  # 69 MiB of one line
        handle.write('1], "output_length": 1}\n')
    status, err, _ = kvcore(*SIMULATE, "--trace", str(trace))
    line = one_error_line(status, err)
    assert f"{trace}:1: the line is longer than 64 MiB" in line


def test_a_number_of_ten_thousand_digits_is_a_trace_error(tmp_path):
    """A 10,000-digit input_length came out as a ValueError traceback."""
    trace = tmp_path / "digits.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": ' + "9" * 10_000 + ', "output_length": 1, '
        '"hash_ids": [1]}\n'
    )
    status, err, _ = kvcore(*SIMULATE, "--trace", str(trace))
    line = one_error_line(status, err)
    assert f"{trace}:1: not valid JSON: an integer has more than 4300 digits" in line
    assert "fix the line or pass --skip-bad-lines" in line


def test_a_billion_layers_is_a_config_error_naming_the_field(tmp_path):
    """num_hidden_layers of 1e9 ran out of memory in a plugin, which was blamed for it."""
    config = json.loads((MODELS / "llama-3-8b.json").read_text())
    config["num_hidden_layers"] = 1e9
    folder = tmp_path / "huge"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    status, err, _ = kvcore("simulate", str(folder / "config.json"), "--limit", "2")
    line = one_error_line(status, err)
    assert "num_hidden_layers must be at most 10000" in line
    assert "fix num_hidden_layers in the config.json" in line
    assert "plugin" not in line
