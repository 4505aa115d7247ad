"""A pytest plugin for vLLM's own test suite: kvcore's scheduler in place of vLLM's.

vLLM's scheduler tests build their scheduler through ``create_scheduler``
(``tests/v1/core/utils.py``), which calls the module's ``Scheduler``; one test
builds it directly. After collection (the test modules are imported), this
plugin points both modules' ``Scheduler`` at
:class:`kvcore.integrations.vllm.KVCoreScheduler`, a subclass, so every test
runs vLLM's scheduler on kvcore's KV cache manager and nothing else changes.
Loaded with ``-p kvcore_swap`` (this folder on ``PYTHONPATH``).
"""

from __future__ import annotations

import sys

import pytest

from kvcore.integrations.vllm import KVCoreScheduler

#: The modules of vLLM's tests that name vLLM's Scheduler class.
SWAPPED_MODULES = ("tests.v1.core.utils", "tests.v1.core.test_scheduler")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems() -> None:
    for name in SWAPPED_MODULES:
        module = sys.modules.get(name)
        if module is None or not hasattr(module, "Scheduler"):
            msg = f"{name} was not imported or names no Scheduler; the swap would test nothing"
            raise pytest.UsageError(msg)
        module.Scheduler = KVCoreScheduler
