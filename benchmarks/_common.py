"""Shared pieces of the benchmarks: data location, the reference engine, timing."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The shared data folder (third-party traces; read in place, never copied).
DATA = Path(os.environ.get("KVCORE_DATA", REPO.parent / "shared" / "data"))
CONVERSATION_TRACE = DATA / "mooncake" / "mooncake_conversation_trace.jsonl"


def import_vllm() -> Any | None:
    """Return vLLM's v1 core modules as a namespace, or None if vLLM is not installed."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        import vllm.v1.core.block_pool as block_pool
        import vllm.v1.core.kv_cache_manager as kv_cache_manager
        import vllm.v1.core.kv_cache_utils as kv_cache_utils
        import vllm.v1.kv_cache_interface as kv_cache_interface
        import vllm.v1.request as request
        from vllm import __version__
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
    except ImportError:
        return None

    class Namespace:
        pass

    ns = Namespace()
    ns.block_pool = block_pool
    ns.kv_cache_manager = kv_cache_manager
    ns.kv_cache_utils = kv_cache_utils
    ns.kv_cache_interface = kv_cache_interface
    ns.request = request
    ns.SamplingParams = SamplingParams
    ns.sha256 = sha256
    ns.version = __version__
    return ns


def best_of_interleaved(
    repeats: int, runs: dict[str, Callable[[], Any]]
) -> dict[str, tuple[float, Any]]:
    """Run every candidate ``repeats`` times, alternating between them.

    Alternating keeps slow drifts of a shared machine from favouring the
    candidate that happened to run while it was quiet. Returns, per name, the
    fastest wall time and the last result.
    """
    best = {name: (float("inf"), None) for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            # Start every run with the same heap: no garbage left by the
            # previous candidate for this one's collections to walk.
            gc.collect()
            start = time.perf_counter()
            result = run()
            seconds = time.perf_counter() - start
            best[name] = (min(best[name][0], seconds), result)
    return best


def best_of(repeats: int, run: Callable[[], Any]) -> tuple[float, Any]:
    """Run ``run`` ``repeats`` times; return the fastest wall time and the last result."""
    best = float("inf")
    result = None
    for _ in range(repeats):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result
