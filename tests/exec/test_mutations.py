"""The mutation check: bookkeeping bugs the executor catches and the bookkeeping tests do not.

Each mutation in ``mutations.MUTATIONS`` breaks one piece of bookkeeping with
monkeypatch. It then runs twice:

* through the executor: a tiny model served by the engine loop (chunked
  prefill, hits, evictions, preemptions, a reset; with speculative decoding
  for the EAGLE mutations). Caught means a :class:`PagedAccessError` (a read
  through the null block or past a table), any other kvcore error, or a
  mismatch with the dense oracle;
* through the bookkeeping checks: ``check_manager_invariants`` after every
  step of that run, and ``RandomWorkload`` (400 random operations with its
  per-operation checks) on a fresh manager. Caught means an assertion or a
  kvcore error.

The expected outcome of each is written next to it; the not-caught ones say
why they cannot be.
"""

from __future__ import annotations

import pytest
from exechelpers import is_encoder_decoder, tiny_plan
from mutations import MUTATIONS, Mutation

import kvcore
from kvcore.errors import KVCoreError
from kvcore.executor import EngineConfig, Executor, ReferenceEngine, synthetic_requests
from kvcore.testing import RandomWorkload, check_manager_invariants


def through_the_executor(mutation: Mutation, plan: kvcore.KVCachePlan) -> tuple[str, list[str]]:
    """The executor's verdict, and the invariant failures seen after its steps."""
    encoder = is_encoder_decoder(plan)
    failures: list[str] = []

    def invariants(engine: ReferenceEngine) -> None:
        try:
            check_manager_invariants(engine.manager)
        except AssertionError as exc:
            failures.append(str(exc))

    if mutation.requests is not None:
        requests = mutation.requests(plan.max_model_len)
    else:
        requests = synthetic_requests(
            14, max_model_len=plan.max_model_len, num_encoder_tokens=20 if encoder else 0
        )
    config = EngineConfig(
        reset_prefix_cache_at=(15,), num_speculative_tokens=3 if mutation.use_eagle else 0
    )
    try:
        executor = Executor.from_plan(
            plan, enable_caching=not encoder, use_eagle=mutation.use_eagle
        )
        ReferenceEngine(executor, requests, config, on_step=invariants).run()
        report = executor.check()
    except KVCoreError as exc:
        return f"{type(exc).__name__}: {exc}", failures
    verdict = "exact" if report.ok else f"{report.num_mismatches} mismatches"
    return verdict, failures


def through_the_bookkeeping_tests(mutation: Mutation, plan: kvcore.KVCachePlan) -> str:
    encoder = is_encoder_decoder(plan)
    manager = kvcore.KVCacheManager(
        plan.kv_cache_config,
        plan.max_model_len,
        enable_caching=not encoder,
        use_eagle=mutation.use_eagle,
    )
    try:
        RandomWorkload(manager, seed=1, num_encoder_tokens=20 if encoder else 0).run(400)
    except (AssertionError, KVCoreError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "pass"


@pytest.mark.parametrize("mutation", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_mutation(mutation, monkeypatch):
    plan = tiny_plan(mutation.model, pressure=1.2)
    monkeypatch.undo()  # plan with the real code; break the bookkeeping only for the runs
    # The mutations break the Python pool, the specification (the native pool
    # has its own planted faults: tests/native/test_native_mutants.py).
    monkeypatch.setenv("KVCORE_BACKEND", "python")
    mutation.apply(monkeypatch)
    verdict, invariant_failures = through_the_executor(mutation, plan)
    random_workload = through_the_bookkeeping_tests(mutation, plan)

    caught = verdict != "exact"
    assert caught == mutation.executor_catches, f"executor: {verdict} ({mutation.why})"
    bookkeeping = bool(invariant_failures) or random_workload != "pass"
    assert bookkeeping == mutation.bookkeeping_catches, (
        f"invariants: {invariant_failures[:1]}, RandomWorkload: {random_workload}"
    )
