"""Run a Hugging Face transformers model on kvcore's paged cache (``kvcore[transformers]``).

* :func:`plan_model` plans a model's cache from the model itself (its config,
  its parameters' dtype).
* :class:`PagedModelCache` holds the manager, the allocated views and which
  module of the model lives in which KV cache group.
* :class:`KVCoreCache` is a ``transformers.Cache`` for one forward pass: it
  writes each layer's new keys, values and states into the slots kvcore's
  block tables give, and reads back exactly what the layer reads
  (:class:`KVCoreCrossCache`: an encoder-decoder model's cross attention).
* :func:`generate` is a continuous-batching greedy generator on top: prefix
  caching across requests, chunked prefill, preemption.
* :func:`tiny_model` builds a tiny model of each attention type from a
  config, with seeded random weights, for tests and examples.

Importing this module imports torch and transformers.
"""

from __future__ import annotations

from kvcore.integrations.transformers._cache import KVCoreCache, KVCoreCrossCache, StepRow
from kvcore.integrations.transformers._generate import (
    GenerateResult,
    GenerateStats,
    Generation,
    generate,
)
from kvcore.integrations.transformers._paged import LayerSlot, PagedModelCache
from kvcore.integrations.transformers._planning import model_dtype, plan_model
from kvcore.integrations.transformers._tiny import TINY_MODELS, tiny_model

__all__ = [
    "plan_model",
    "model_dtype",
    "PagedModelCache",
    "LayerSlot",
    "KVCoreCache",
    "KVCoreCrossCache",
    "StepRow",
    "generate",
    "GenerateResult",
    "Generation",
    "GenerateStats",
    "tiny_model",
    "TINY_MODELS",
]
