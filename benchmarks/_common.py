"""Shared pieces of the benchmarks: data location, the reference engine, timing.

Timing rules every benchmark follows:

- Candidates run in *rounds*; in each round every candidate runs once, and
  the order rotates from round to round, so no candidate always runs first
  (with a warm cache) or last (after the others' garbage).
- A figure is the **median** over the rounds, printed with its spread
  (min–max); never the best run.
- Setup (building and ageing a pool) is never timed.
- Every table is printed with the machine's load average, so a figure taken
  on a busy shared machine says so.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The shared data folder (third-party traces; read in place, never copied).
DATA = Path(os.environ.get("KVCORE_DATA", REPO.parent / "shared" / "data"))
CONVERSATION_TRACE = DATA / "mooncake" / "mooncake_conversation_trace.jsonl"

#: vLLM's prefix-caching hash options compared by the benchmarks (0.14 names).
VLLM_HASHES = ("sha256", "sha256_cbor", "xxhash")


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1 (a count of rounds or requests)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"must be an integer >= 1, got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def machine_load() -> str:
    """The load average, as ``uptime`` prints it, and the number of cores."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} on {os.cpu_count()} cores"


def print_load(label: str = "machine") -> None:
    """Print the current load average (call it next to every table)."""
    print(f"[{label}: {machine_load()}]")


def import_vllm() -> Any | None:
    """Return vLLM's v1 core modules as a namespace, or None if vLLM is not installed."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    # vLLM's imports pull in `requests`, which warns about optional packages.
    warnings.filterwarnings("ignore", module="requests")
    try:
        import vllm.v1.core.block_pool as block_pool
        import vllm.v1.core.kv_cache_manager as kv_cache_manager
        import vllm.v1.core.kv_cache_utils as kv_cache_utils
        import vllm.v1.kv_cache_interface as kv_cache_interface
        import vllm.v1.request as request
        from vllm import __version__
        from vllm.sampling_params import SamplingParams
        from vllm.utils import hashing
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
    ns.sha256 = hashing.sha256
    ns.hashing = hashing
    ns.version = __version__
    return ns


def kvcore_hash_available(algorithm: str) -> bool:
    """Whether kvcore's hash ``algorithm`` works here (``xxh3_128`` needs xxhash)."""
    if algorithm != "xxh3_128":
        return True
    return importlib.util.find_spec("xxhash") is not None


def vllm_hash_available(vllm: Any, name: str) -> bool:
    """Whether vLLM's hash option ``name`` works here (``xxhash`` needs the package)."""
    try:
        vllm.hashing.get_hash_fn_by_name(name)(b"probe")
    except (ImportError, ValueError):
        return False
    return True


def timer_overhead(samples: int = 20_000) -> float:
    """Seconds one ``perf_counter()`` pair adds around a timed operation (median)."""
    clock = time.perf_counter
    spans = []
    for _ in range(samples):
        start = clock()
        spans.append(clock() - start)
    return statistics.median(spans)


class Spread:
    """Samples of one measured quantity: median and min–max."""

    __slots__ = ("samples",)

    def __init__(self, samples: Sequence[float] = ()) -> None:
        self.samples = list(samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def fmt(self, scale: float = 1e6) -> str:
        """``median (min–max)`` in the given unit (default µs), 3 significant digits."""
        return f"{_num(self.median * scale)} ({_num(self.low * scale)}–{_num(self.high * scale)})"


def _num(value: float) -> str:
    """A figure with about three significant digits (no exponent)."""
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """``names`` rotated left by ``round_index`` (each round starts with another one)."""
    k = round_index % len(names) if names else 0
    return [*names[k:], *names[:k]]


def interleaved_rounds(
    rounds: int,
    candidates: dict[str, Callable[[], Callable[[], Any]]],
    measure: Callable[[Callable[[], Any]], tuple[Any, Any]] | None = None,
) -> dict[str, tuple[list[Any], Any]]:
    """Run every candidate once per round, in an order that rotates each round.

    Args:
        rounds: Number of rounds.
        candidates: name -> ``prepare()``; ``prepare`` does the untimed setup
            and returns the zero-argument callable to measure.
        measure: ``measure(run) -> (sample, result)``; the default times
            ``run()`` and uses its return value as the result.

    Returns:
        Per name: the samples (one per round) and the result of the last round.
        A candidate whose result changes from round to round raises
        ``AssertionError`` (every replay is deterministic).
    """
    if measure is None:

        def measure(run: Callable[[], Any]) -> tuple[Any, Any]:
            start = time.perf_counter()
            result = run()
            return time.perf_counter() - start, result

    samples: dict[str, list[Any]] = {name: [] for name in candidates}
    results: dict[str, Any] = {}
    names = list(candidates)
    for index in range(rounds):
        for name in rotated(names, index):
            run = candidates[name]()
            # Start every run with the same heap: no garbage left by the
            # previous candidate for this one's collections to walk.
            gc.collect()
            sample, result = measure(run)
            if name in results and results[name] != result:
                msg = f"{name}: the result changed between rounds"
                raise AssertionError(msg)
            results[name] = result
            samples[name].append(sample)
    return {name: (samples[name], results[name]) for name in names}


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> str:
    """Describe the first position where two result lists differ."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"result {index}: {x!r:.200} vs {y!r:.200}"
    return f"lengths {len(a)} vs {len(b)}"
