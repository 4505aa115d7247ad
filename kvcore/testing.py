"""Test helpers for kvcore and its plugins: invariant checks and a random driver.

Opt-in: import it from your tests (``from kvcore.testing import
RandomWorkload``); it is not a pytest plugin and has no side effects.

:func:`check_plugin` checks an attention type (a spec and the manager serving
it) against every rule kvcore's own types pass: its rules are listed in its
documentation.

:func:`check_manager_invariants` verifies, after any operation, the invariants
every manager and pool must keep (see :doc:`/explanation/architecture`).
:class:`RandomWorkload` drives a :class:`~kvcore.KVCacheManager` through random
admissions (with cache lookups, tokens loaded by a KV connector and chunked
prefill), decode steps with lookahead slots, preemptions, finishes and
prefix-cache resets, and checks the invariants after each operation, plus the
per-operation ones: an allocation takes exactly the blocks it predicted, a
refused allocation changes nothing, and a hit is aligned and shorter than the
prompt.
"""

from __future__ import annotations

from kvcore._conformance import ConformanceError, ConformanceReport, check_plugin
from kvcore._workload import (
    RandomWorkload,
    WorkloadStats,
    admit,
    check_manager_invariants,
    snapshot,
)

__all__ = [
    "ConformanceError",
    "ConformanceReport",
    "RandomWorkload",
    "WorkloadStats",
    "admit",
    "check_manager_invariants",
    "check_plugin",
    "snapshot",
]
