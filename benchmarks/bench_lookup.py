"""Cost of one prefix-cache lookup (``get_computed_blocks``), the only path that builds a HitQuery.

Four cases: one full-attention group and a full + sliding-window hybrid, each
with a miss (the first block is not cached: the cheapest lookup, where a fixed
cost shows most) and a 64-block hit. CPU time per lookup (``process_time``,
less sensitive than wall time to other processes on a shared machine), best
of ``--repeat`` runs. Uses the public API only, so the same script measures
any kvcore version: run it once per checkout and compare.

Run::

    python benchmarks/bench_lookup.py
"""

from __future__ import annotations

import argparse
import gc
import time

import kvcore
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec

ATTENTION = {"num_kv_heads": 1, "head_size": 1, "dtype": "float16"}


def lookup_cost(
    specs: list[kvcore.specs.KVCacheSpec], cached: int, prompt: int, args: argparse.Namespace
) -> tuple[int, float]:
    """Tokens hit and best CPU seconds per lookup of a ``prompt``-token request."""
    registry = kvcore.registry.registry_from_layer_types(
        [
            kvcore.LayerType(FullAttentionSpec, FullAttentionManager),
            kvcore.LayerType(SlidingWindowSpec, SlidingWindowManager),
        ]
    )
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(4000, specs), 65536, registry=registry
    )
    warm = kvcore.Request("warm", [*range(cached), 7])
    hit, num_hit = manager.get_computed_blocks(warm)
    manager.allocate_slots(warm, warm.num_tokens - num_hit, num_hit, hit)
    warm.num_computed_tokens = warm.num_tokens
    manager.free(warm)  # its full blocks stay cached
    probe = kvcore.Request("probe", list(range(prompt)))
    _, num_hit = manager.get_computed_blocks(probe)
    best = float("inf")
    for _ in range(args.repeat):
        gc.collect()
        start = time.process_time()
        for _ in range(args.lookups):
            manager.get_computed_blocks(probe)
        best = min(best, (time.process_time() - start) / args.lookups)
    return num_hit, best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args(argv)
    full = FullAttentionSpec(block_size=16, **ATTENTION)
    window = SlidingWindowSpec(block_size=16, sliding_window=128, **ATTENTION)
    cases = [
        ("full attention, miss", [full], 0, 1024),
        ("full attention, 64-block hit", [full], 1024, 1025),
        ("full + sliding window, miss", [full, window], 0, 1024),
        ("full + sliding window, 64-block hit", [full, window], 1024, 1025),
    ]
    print(f"kvcore {kvcore.__version__}: CPU time per get_computed_blocks, best of {args.repeat}")
    for label, specs, cached, prompt in cases:
        num_hit, seconds = lookup_cost(specs, cached, prompt, args)
        print(f"  {label:<38} hit {num_hit:>5} tokens  {seconds * 1e9:8.0f} ns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
