"""The reference executor: run a tiny model through the paged cache, check it against no cache.

Every other check of kvcore is bookkeeping: block ids, hit lengths, free
counts, byte offsets. The executor checks the claim an engine relies on: an
engine that writes keys, values and states where kvcore's block tables say,
and reads them back where they say, computes exactly what a model with no
cache computes.

* :class:`ReferenceModel` is a tiny model built from a plan: one layer per
  cache layer of the plan, each computed by its attention type's reference
  kernel (:mod:`kvcore.reference`), random weights from a seed.
* :class:`Executor` runs scheduled steps of that model through the cache
  allocated for the plan (:func:`kvcore.allocate_kv_cache`), reading every
  block table from a :class:`~kvcore.KVCacheManager`, and records every
  output; :meth:`Executor.check` compares them with a dense run of the same
  model over each request's tokens, for exact equality.
* :class:`ReferenceEngine` is a continuous-batching loop (chunked prefill,
  decode, prefix hits, eviction, preemption and resume, prefix-cache
  resets, speculative decoding with lookahead slots) that drives a manager
  and an executor together.

Quick start:

.. code-block:: python

    import kvcore
    from kvcore.executor import Executor, ReferenceEngine, synthetic_requests, tiny_model_path

    plan = kvcore.plan(tiny_model_path("tiny-hybrid"), num_blocks=40, max_num_batched_tokens=32)
    executor = Executor.from_plan(plan)
    requests = synthetic_requests(12, max_model_len=plan.max_model_len)
    ReferenceEngine(executor, requests).run()
    report = executor.check()
    assert report.ok, report.mismatches

This module imports torch.
"""

from __future__ import annotations

from kvcore._exec.engine import (
    EngineConfig,
    EngineRequest,
    EngineStats,
    ReferenceEngine,
    synthetic_requests,
)
from kvcore._exec.executor import Executor, Scheduled
from kvcore._exec.kernels import reference_kernels
from kvcore._exec.model import ReferenceLayer, ReferenceModel
from kvcore._exec.oracle import dense_outputs
from kvcore._exec.report import ExecutionReport, Mismatch
from kvcore._exec.tiny import tiny_model_path, tiny_models

__all__ = [
    "ReferenceModel",
    "ReferenceLayer",
    "Executor",
    "Scheduled",
    "ExecutionReport",
    "Mismatch",
    "dense_outputs",
    "ReferenceEngine",
    "EngineConfig",
    "EngineRequest",
    "EngineStats",
    "synthetic_requests",
    "reference_kernels",
    "tiny_models",
    "tiny_model_path",
]
