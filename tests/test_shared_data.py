"""Tests that read the shared traces skip without them, and CI turns that skip into a failure.

The traces live outside the repository (``../shared/data``, or ``KVCORE_DATA``).
A clone elsewhere has no such folder: its tests skip with a reason instead of
failing. ``.ci/run`` sets ``KVCORE_REQUIRE_DATA=1``, under which the same
test fails, so CI can never pass without having read them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST = "tests/sim/test_ceiling.py::test_conversation_trace_matches_the_published_reuse"


def run_pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVCORE_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", TEST],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**clean, "KVCORE_DATA": str(tmp_path), **env},
    )


def test_a_test_reading_missing_shared_data_skips_with_the_reason(tmp_path):
    result = run_pytest(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "1 skipped" in result.stdout
    expected = tmp_path / "mooncake" / "mooncake_conversation_trace.jsonl"
    assert f"shared data missing: {expected} is not there" in result.stdout
    assert "set KVCORE_DATA to the folder holding mooncake/" in result.stdout


def test_kvcore_require_data_turns_the_skip_into_a_failure(tmp_path):
    result = run_pytest(tmp_path, KVCORE_REQUIRE_DATA="1")
    assert result.returncode == 1, result.stdout
    assert "1 error" in result.stdout  # the fixture fails: the test is reported in error
    assert "KVCORE_REQUIRE_DATA=1: the shared data must be present" in result.stdout


def test_ci_requires_the_shared_data():
    script = (REPO / ".ci" / "run").read_text()
    assert "KVCORE_REQUIRE_DATA=1 .venv/bin/pytest" in script
