"""vLLM 0.14's own scheduler tests, run on stock vLLM and with kvcore swapped in.

``tests/v1/core/test_scheduler.py`` from vLLM's sdist (80 items) runs twice in
a subprocess against vLLM's real CPU build: as shipped, and with the
``kvcore_swap`` plugin, which makes every scheduler the test builds a
:class:`~kvcore.integrations.vllm.KVCoreScheduler`. Every test that passes
on stock vLLM must pass on kvcore, except those listed in :data:`EXCLUDED`
with the reason; each of those must fail on kvcore for exactly that reason
(so the list cannot go stale). The tests that fail on stock vLLM here need
model files from the Hugging Face hub (the LLaVA processor) that a machine
with no access to the hub cannot have; they are reported, not compared.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from vllm_env import require_vllm

require_vllm()

from vllm_sources import vllm_tests  # noqa: E402

HERE = Path(__file__).resolve().parent
SUITE = "tests/v1/core/test_scheduler.py"

#: Tests that pass on stock vLLM but read vLLM's internal block pool or
#: coordinator, or depend on vLLM merging two requests' block tables:
#: test id -> (the reason, a string the kvcore failure must contain).
EXCLUDED = {
    "test_kv_connector_basic[False]": (
        "reads coordinator.single_type_managers[g].req_to_blocks (vLLM's coordinator)",
        "has no attribute 'coordinator'",
    ),
    "test_kv_connector_basic[True]": (
        "reads coordinator.single_type_managers[g].req_to_blocks (vLLM's coordinator)",
        "has no attribute 'coordinator'",
    ),
    "test_memory_leak": (
        "reads coordinator.single_type_managers and block_pool.free_block_queue",
        "has no attribute 'coordinator'",
    ),
    "test_priority_scheduling_preemption": (
        "adds a request with the id of a running one ('0'); vLLM's manager merges their "
        "block tables, kvcore refuses the second live request of an id",
        "another vLLM Request object with this id holds KV cache blocks",
    ),
    "test_priority_scheduling_no_preemption_when_space_available": (
        "adds a request with the id of a running one ('0'); vLLM's manager merges their "
        "block tables, kvcore refuses the second live request of an id",
        "another vLLM Request object with this id holds KV cache blocks",
    ),
}


def hub_cache(folder: Path) -> Path:
    """A Hugging Face cache holding facebook/opt-125m's config.json (from models/).

    The scheduler tests build their ``ModelConfig`` from that name; offline,
    the hub client reads it from this cache. Only the config is needed: the
    scheduler never loads weights.
    """
    snapshot = folder / "hub" / "models--facebook--opt-125m"
    (snapshot / "snapshots" / "local").mkdir(parents=True)
    (snapshot / "refs").mkdir()
    (snapshot / "refs" / "main").write_text("local")
    config = (HERE / "models" / "opt-125m" / "config.json").read_text()
    (snapshot / "snapshots" / "local" / "config.json").write_text(config)
    return folder


def run_suite(root: Path, hf_home: Path, report: Path, *plugins: str) -> dict[str, ET.Element]:
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE), str(root)]),
        "VLLM_LOGGING_LEVEL": "ERROR",
    }
    command = [sys.executable, "-m", "pytest", SUITE, "-q", "--noconftest"]
    command += ["-p", "no:cacheprovider", f"--junitxml={report}", "-W", "ignore"]
    for plugin in plugins:
        command += ["-p", plugin]
    subprocess.run(command, cwd=root, env=env, capture_output=True, check=False)
    cases = ET.parse(report).getroot().iter("testcase")
    return {case.attrib["name"]: case for case in cases}


def failure(case: ET.Element) -> str | None:
    for tag in ("failure", "error"):
        found = case.find(tag)
        if found is not None:
            return (found.attrib.get("message", "") + "\n" + (found.text or "")).strip()
    return None


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> tuple[dict[str, ET.Element], dict[str, ET.Element]]:
    root = vllm_tests()
    folder = tmp_path_factory.mktemp("vllm-suite")
    hf_home = hub_cache(folder / "hf")
    stock = run_suite(root, hf_home, folder / "stock.xml")
    kvcore = run_suite(root, hf_home, folder / "kvcore.xml", "kvcore_swap")
    return stock, kvcore


def test_every_scheduler_test_passing_on_vllm_passes_on_kvcore(outcomes):
    stock, kvcore = outcomes
    assert len(stock) == 80  # the items of vLLM 0.14.0's test_scheduler.py
    assert set(kvcore) == set(stock)
    passing = {name for name, case in stock.items() if failure(case) is None}
    assert set(EXCLUDED) <= passing, "an excluded test no longer passes on stock vLLM"
    broken = {
        name: failure(kvcore[name])
        for name in sorted(passing - set(EXCLUDED))
        if failure(kvcore[name]) is not None
    }
    assert not broken
    print(
        f"\nvLLM 0.14.0 test_scheduler.py: {len(passing)} pass on stock vLLM, "
        f"{len(passing) - len(EXCLUDED)} of them compared and passing on kvcore, "
        f"{len(EXCLUDED)} excluded, {len(stock) - len(passing)} fail on stock here"
    )


@pytest.mark.parametrize("name", sorted(EXCLUDED))
def test_an_excluded_test_fails_on_kvcore_for_its_stated_reason(outcomes, name):
    _, kvcore = outcomes
    message = failure(kvcore[name])
    assert message is not None, f"{name} passes on kvcore now: drop it from EXCLUDED"
    assert EXCLUDED[name][1] in message


def test_the_tests_failing_on_stock_vllm_here_need_the_hub(outcomes):
    """They fail on a model the hub would provide, not on the scheduler."""
    stock, _ = outcomes
    for name, case in stock.items():
        message = failure(case)
        if message is not None:
            assert "llava-hf/llava-1.5-7b-hf" in message, name
