"""Throughput of the allocation path, kvcore against vLLM 0.14 in the same process.

The op sequence comes from real prompts (the Mooncake conversation trace,
block size 16): a small continuous-batching loop admits requests (cache
lookup, then one allocation for the uncached prompt), grows every running
request by one decode token per step, preempts the newest request when the
pool is full and frees requests when they finish. The sequence is recorded
once, then replayed through each implementation; every result (hit length,
block ids, refusals) is compared, so the timing also proves both behave the
same.

Run::

    python benchmarks/bench_allocation.py            # kvcore alone
    VENV/bin/python benchmarks/bench_allocation.py   # with vLLM installed: + ratio

Ops counted: request creation, lookup, admission, decode allocation, free.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from _common import CONVERSATION_TRACE, best_of_interleaved, import_vllm
from _replay import (
    ADMIT,
    DECODE,
    FREE,
    LOOKUP,
    NEW,
    PREEMPT,
    Case,
    record_ops,
    replay_kvcore,
    replay_vllm,
)

import kvcore
from kvcore._trace import read_mooncake_trace
from kvcore_plugins.full_attention import FullAttentionSpec

FULL_ATTENTION = Case(
    "full_attention",
    lambda bs: [FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype="float16")],
    lambda vllm, bs: [
        vllm.kv_cache_interface.FullAttentionSpec(
            block_size=bs, num_kv_heads=1, head_size=1, dtype=_torch_dtype("float16")
        )
    ],
)


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def measure_pool_build(make: Callable[[], Any]) -> tuple[float, float]:
    """Seconds to build a pool and traced bytes it holds."""
    gc.collect()
    start = time.perf_counter()
    pool = make()
    seconds = time.perf_counter() - start
    del pool
    gc.collect()
    tracemalloc.start()
    pool = make()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del pool
    return seconds, size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(CONVERSATION_TRACE))
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=12_000)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument(
        "--max-output",
        type=int,
        default=128,
        help="cap on decode tokens per request (keeps the run short)",
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pool-blocks", type=int, default=1_000_000)
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args(argv)

    trace = list(read_mooncake_trace(args.trace, limit=args.requests))
    prompts = [r.prompt_token_ids for r in trace]
    outputs = [min(r.output_length, args.max_output) for r in trace]
    ops = record_ops(
        FULL_ATTENTION, prompts, outputs, args.num_blocks, args.block_size, args.max_running
    )
    counts = [sum(1 for op in ops if op[0] == k) for k in range(6)]
    print(
        f"op sequence: {len(ops)} ops from {len(prompts)} Mooncake requests "
        f"(block size {args.block_size}, {args.num_blocks} blocks): "
        f"{counts[NEW]} new, {counts[LOOKUP]} lookups, {counts[ADMIT]} admissions, "
        f"{counts[DECODE]} decode allocations, {counts[FREE]} frees, "
        f"{counts[PREEMPT]} preemptions"
    )
    runs = {
        "kvcore (sha256)": lambda: replay_kvcore(
            FULL_ATTENTION, ops, prompts, args.num_blocks, args.block_size, "sha256"
        ),
        "kvcore (fast hash)": lambda: replay_kvcore(
            FULL_ATTENTION, ops, prompts, args.num_blocks, args.block_size, "fast"
        ),
    }
    vllm = None if args.no_vllm else import_vllm()
    if vllm is not None:
        runs[f"vLLM {vllm.version}"] = lambda: replay_vllm(
            vllm, FULL_ATTENTION, ops, prompts, args.num_blocks, args.block_size
        )
    best = best_of_interleaved(args.repeat, runs)
    rows = [(name, seconds) for name, (seconds, _) in best.items()]
    t_kv, res_kv = best["kvcore (sha256)"]
    if best["kvcore (fast hash)"][1] != res_kv:
        print("ERROR: kvcore results differ between hash algorithms")
        return 1
    if vllm is not None:
        t_vl, res_vl = best[f"vLLM {vllm.version}"]
    for name, seconds in rows:
        print(
            f"  {name:<22} {len(ops) / seconds:>12,.0f} ops/s  "
            f"{seconds / len(ops) * 1e6:>7.2f} µs/op  ({seconds:.3f} s)"
        )
    if vllm is not None:
        same = res_vl == res_kv
        print(f"  identical results (hit lengths, block ids, refusals): {same}")
        print(f"  kvcore/vLLM throughput ratio (sha256 both): {t_vl / t_kv:.2f}x")
        if not same:
            first = next(i for i, (a, b) in enumerate(zip(res_kv, res_vl, strict=False)) if a != b)
            print(
                f"  first difference at result {first}: kvcore={res_kv[first]} vllm={res_vl[first]}"
            )
            return 1
    else:
        print("  vLLM not importable: no ratio (see README, 'Benchmarks')")

    n = args.pool_blocks
    secs, size = measure_pool_build(lambda: kvcore.BlockPool(n))
    print(f"pool of {n:,} blocks: kvcore build {secs:.3f} s, {size / n:.1f} bytes/block")
    if vllm is not None:
        vsecs, vsize = measure_pool_build(
            lambda: vllm.block_pool.BlockPool(n, True, args.block_size)
        )
        print(f"pool of {n:,} blocks: vLLM   build {vsecs:.3f} s, {vsize / n:.1f} bytes/block")
        print(f"  build {vsecs / secs:.1f}x faster, {vsize / size:.1f}x less memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
