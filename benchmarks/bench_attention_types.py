"""Every attention type's allocation path, and the long-context sliding-window lookup.

Part 1, allocation path: for each attention type (and two hybrid models) an
op sequence is recorded from real prompts (the Mooncake conversation trace,
block size 16) with a small continuous-batching loop: admission = cache
lookup + one allocation for the uncached prompt, one decode token per running
request per step, preemption of the newest request when the pool is full,
free on finish. The sequence is replayed through kvcore and, when it is
importable, through vLLM 0.14's ``KVCacheManager`` with the equivalent specs
in the same process; every result (hit lengths and hit blocks per group, new
block ids per group, refusals) must be identical. Prints ops/s, µs/op and
the throughput ratio.

Part 2, sliding-window lookup with few hits: a prompt of 8k, 32k and 128k
tokens, window 128, block 16 (8 contiguous blocks needed), 2 % of the
blocks cached at random positions (never a full window). Compares the number
of cache probes and the time of kvcore's jump search, a plain right-to-left
scan (the reference algorithm, probing every block) and vLLM 0.14's
``SlidingWindowManager.find_longest_cache_hit``; all must return the same hit.

Run::

    python benchmarks/bench_attention_types.py            # kvcore alone
    VENV/bin/python benchmarks/bench_attention_types.py   # with vLLM: + comparison
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import CONVERSATION_TRACE, import_vllm
from _replay import Case, record_ops, replay_kvcore, replay_vllm

import kvcore
from kvcore._trace import read_mooncake_trace
from kvcore.managers import HitQuery
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.cross_attention import CrossAttentionSpec
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.hidden_state import HiddenStateCacheSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.mla import MLAAttentionSpec
from kvcore_plugins.sink_full_attention import SinkFullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec

ATTENTION = {"num_kv_heads": 1, "head_size": 64, "dtype": "float16"}


# -- part 1: the allocation path of every type -------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def _v_attn(vllm: Any, cls_name: str, block_size: int, **extra: Any) -> Any:
    cls = getattr(vllm.kv_cache_interface, cls_name)
    return cls(
        block_size=block_size, num_kv_heads=1, head_size=64, dtype=_torch_dtype("float16"), **extra
    )


def _v_mamba(vllm: Any, block_size: int) -> Any:
    return vllm.kv_cache_interface.MambaSpec(
        block_size=block_size, shapes=((4, 64), (8, 64)), dtypes=(_torch_dtype("float32"),) * 2
    )


def _k_mamba(block_size: int) -> MambaSpec:
    return MambaSpec(
        block_size=block_size,
        shapes=((4, 64), (8, 64)),
        dtypes=("float32", "float32"),
        mamba_cache_mode="align",
    )


CASES = [
    Case(
        "full_attention",
        lambda bs: [FullAttentionSpec(block_size=bs, **ATTENTION)],
        lambda v, bs: [_v_attn(v, "FullAttentionSpec", bs)],
    ),
    Case(
        "sliding_window",
        lambda bs: [SlidingWindowSpec(block_size=bs, sliding_window=1024, **ATTENTION)],
        lambda v, bs: [_v_attn(v, "SlidingWindowSpec", bs, sliding_window=1024)],
    ),
    Case(
        "chunked_local",
        lambda bs: [
            ChunkedLocalAttentionSpec(block_size=bs, attention_chunk_size=2048, **ATTENTION)
        ],
        lambda v, bs: [_v_attn(v, "ChunkedLocalAttentionSpec", bs, attention_chunk_size=2048)],
    ),
    Case("mamba", lambda bs: [_k_mamba(bs)], lambda v, bs: [_v_mamba(v, bs)]),
    Case(
        "cross_attention",
        lambda bs: [
            FullAttentionSpec(block_size=bs, **ATTENTION),
            CrossAttentionSpec(block_size=bs, **ATTENTION),
        ],
        lambda v, bs: [_v_attn(v, "FullAttentionSpec", bs), _v_attn(v, "CrossAttentionSpec", bs)],
        enable_caching=False,
        num_encoder_tokens=1500,
        note="full + cross, caching off",
    ),
    Case(
        "sink_full_attention",
        lambda bs: [SinkFullAttentionSpec(block_size=bs, sink_len=4 * bs, **ATTENTION)],
        lambda v, bs: [_v_attn(v, "SinkFullAttentionSpec", bs, sink_len=4 * bs)],
    ),
    Case(
        "mla",
        lambda bs: [
            MLAAttentionSpec(
                block_size=bs, head_size=576, dtype="uint8", cache_dtype_str="fp8_ds_mla"
            )
        ],
        lambda v, bs: [
            v.kv_cache_interface.MLAAttentionSpec(
                block_size=bs,
                num_kv_heads=1,
                head_size=576,
                dtype=_torch_dtype("uint8"),
                cache_dtype_str="fp8_ds_mla",
            )
        ],
    ),
    Case(
        "hidden_state",
        lambda bs: [HiddenStateCacheSpec(block_size=bs, **ATTENTION)],
        lambda v, bs: [_v_attn(v, "FullAttentionSpec", bs)],
        note="vs vLLM full attention: 0.14 has no hidden-state spec",
    ),
    Case(
        "full+2 sliding_window",
        lambda bs: [
            FullAttentionSpec(block_size=bs, **ATTENTION),
            SlidingWindowSpec(block_size=bs, sliding_window=128, **ATTENTION),
            SlidingWindowSpec(block_size=bs, sliding_window=128, **ATTENTION),
        ],
        lambda v, bs: [
            _v_attn(v, "FullAttentionSpec", bs),
            _v_attn(v, "SlidingWindowSpec", bs, sliding_window=128),
            _v_attn(v, "SlidingWindowSpec", bs, sliding_window=128),
        ],
        note="hybrid",
    ),
    Case(
        "full+mamba",
        lambda bs: [FullAttentionSpec(block_size=bs, **ATTENTION), _k_mamba(bs)],
        lambda v, bs: [_v_attn(v, "FullAttentionSpec", bs), _v_mamba(v, bs)],
        note="hybrid",
    ),
]


def bench_allocation_paths(args: argparse.Namespace, vllm: Any | None) -> bool:
    """Part 1; returns False if kvcore and vLLM disagreed on any result."""
    trace = list(read_mooncake_trace(args.trace, limit=args.requests))
    prompts = [r.prompt_token_ids[: args.max_prompt] for r in trace]
    outputs = [min(r.output_length, args.max_output) for r in trace]
    bs = args.block_size
    print(
        f"Allocation path: {len(prompts)} Mooncake requests (prompts capped at "
        f"{args.max_prompt} tokens, decode at {args.max_output}), block size {bs}, "
        f"{args.num_blocks} blocks per group, at most {args.max_running} running"
    )
    header = f"  {'type':<24}{'ops':>7}{'kvcore ops/s':>14}{'µs/op':>8}"
    if vllm is not None:
        header += f"{'vLLM ops/s':>12}{'µs/op':>8}{'ratio':>7}  same"
    print(header)
    all_same = True
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        num_blocks = args.num_blocks * len(case.kvcore_specs(bs)) + 8
        ops = record_ops(case, prompts, outputs, num_blocks, bs, args.max_running)
        best_kv = best_vl = float("inf")
        res_kv = res_vl = None
        for _ in range(args.repeat):  # alternate, so machine drift hits both alike
            gc.collect()
            start = time.perf_counter()
            res_kv = replay_kvcore(case, ops, prompts, num_blocks, bs)
            best_kv = min(best_kv, time.perf_counter() - start)
            if vllm is not None:
                gc.collect()
                start = time.perf_counter()
                res_vl = replay_vllm(vllm, case, ops, prompts, num_blocks, bs)
                best_vl = min(best_vl, time.perf_counter() - start)
        line = (
            f"  {case.name:<24}{len(ops):>7}{len(ops) / best_kv:>14,.0f}"
            f"{best_kv / len(ops) * 1e6:>8.2f}"
        )
        if vllm is not None:
            same = res_kv == res_vl
            all_same &= same
            line += (
                f"{len(ops) / best_vl:>12,.0f}{best_vl / len(ops) * 1e6:>8.2f}"
                f"{best_vl / best_kv:>6.2f}x  {'yes' if same else 'NO'}"
            )
            if not same:
                first = next(
                    i for i, (a, b) in enumerate(zip(res_kv, res_vl, strict=False)) if a != b
                )
                line += f"\n    first difference at result {first}: kvcore={res_kv[first]!r:.200}"
                line += f"\n    {'':>30}vLLM={res_vl[first]!r:.200}"
        if case.note:
            line += f"  ({case.note})"
        print(line)
    return all_same


# -- part 2: the long-context sliding-window lookup -------------------------------------------


class CountingPool:
    """Forwards cache lookups to a pool, counting them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.null_block = pool.null_block
        self.probes = 0

    def get_cached_block(self, block_hash: Any, group_ids: Sequence[int]) -> Any:
        self.probes += 1
        return self.pool.get_cached_block(block_hash, group_ids)


def plain_scan(
    hashes: Sequence[Any],
    max_length: int,
    group_ids: Sequence[int],
    pool: Any,
    spec: SlidingWindowSpec,
    use_eagle: bool,
    alignment: int,
) -> tuple[list[int], ...]:
    """The reference algorithm: right to left, one probe per block, no jumps."""
    bs = spec.block_size
    needed = max(-(-(spec.sliding_window - 1) // bs) + use_eagle, 1)
    max_blocks = max_length // bs
    out = [[kvcore.NULL_BLOCK] * max_blocks for _ in group_ids]
    count = 0
    keep = -1
    for i in range(max_blocks - 1, -1, -1):
        blocks = pool.get_cached_block(hashes[i], group_ids)
        if blocks is None:
            count = 0
            continue
        edge = i if use_eagle else i + 1
        if count == 0 and bs != alignment and (edge * bs) % alignment:
            continue
        for lst, block in zip(out, blocks, strict=True):
            lst[i] = block
        count += 1
        if count >= needed:
            keep = i + count
            break
    if keep < 0:
        keep = count
    if use_eagle and keep:
        keep -= 1
    return tuple(lst[:keep] for lst in out)


def _time(repeat: int, run: Callable[[], Any]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - start)
    return best, result


def bench_sliding_window_lookup(args: argparse.Namespace, vllm: Any | None) -> bool:
    """Part 2; returns False if any implementation disagreed."""
    window, bs = args.window, args.block_size
    spec = SlidingWindowSpec(block_size=bs, sliding_window=window, **ATTENTION)
    needed = -(-(window - 1) // bs)
    print(
        f"\nSliding-window lookup, few hits: window {window}, block {bs} ({needed} contiguous "
        f"blocks needed), {args.density:.0%} of blocks cached at random, best of {args.repeat}"
    )
    header = f"  {'tokens':>7}{'blocks':>7}  {'jump':>15}  {'plain scan':>15}"
    if vllm is not None:
        header += f"  {'vLLM 0.14':>15}  jump speed-up vs plain / vs vLLM"
    else:
        header += "  jump speed-up vs plain"
    print(header)
    all_same = True
    for num_tokens in args.lengths:
        n = num_tokens // bs
        rng = random.Random(num_tokens)
        cached = [rng.random() < args.density for _ in range(n)]
        hashes = [hashlib.sha256(b"%d" % i).digest() for i in range(n)]
        pool = kvcore.BlockPool(n + 1)
        request = kvcore.Request("lookup", [0] * num_tokens)
        request.block_hashes.extend(hashes)
        table = [kvcore.NULL_BLOCK] * n
        for i in range(n):
            if cached[i]:
                table[i] = pool.get_new_blocks(1)[0]
        pool.cache_full_blocks(request, table, 0, n, bs, 0)

        def jump(pool: Any = pool, hashes: list[bytes] = hashes, length: int = num_tokens) -> Any:
            return SlidingWindowManager.find_longest_cache_hit(
                HitQuery(hashes, length, [0], pool, spec, False, bs)
            )

        def plain(pool: Any = pool, hashes: list[bytes] = hashes, length: int = num_tokens) -> Any:
            return plain_scan(hashes, length, [0], pool, spec, False, bs)

        t_jump, r_jump = _time(args.repeat, jump)
        t_plain, r_plain = _time(args.repeat, plain)
        counting = CountingPool(pool)
        jump(counting)
        p_jump = counting.probes
        counting = CountingPool(pool)
        plain(counting)
        p_plain = counting.probes
        same = r_jump == r_plain
        line = (
            f"  {num_tokens:>7}{n:>7}  {p_jump:>5} {t_jump * 1e6:>7.0f} µs"
            f"  {p_plain:>5} {t_plain * 1e6:>7.0f} µs"
        )
        ratio = f"{t_plain / t_jump:.1f}x"
        if vllm is not None:
            t_vl, p_vl, r_vl = _vllm_lookup(vllm, args, spec, hashes, cached, num_tokens)
            same &= r_vl == [b for b in r_jump[0]]
            line += f"  {p_vl:>5} {t_vl * 1e6:>7.0f} µs"
            ratio += f" / {t_vl / t_jump:.1f}x"
        all_same &= same
        hit = len(r_jump[0]) * bs
        print(f"{line}  {ratio}  (hit {hit} tokens{'' if same else ', RESULTS DIFFER'})")
    print("  columns: probes (cache lookups) and best time per lookup")
    return all_same


def _vllm_lookup(
    vllm: Any,
    args: argparse.Namespace,
    spec: SlidingWindowSpec,
    hashes: list[bytes],
    cached: list[bool],
    num_tokens: int,
) -> tuple[float, int, list[int]]:
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager as VSWManager

    bs = spec.block_size
    n = len(hashes)
    pool = vllm.block_pool.BlockPool(n + 1, True, bs)
    next_id = 1
    for i in range(n):
        if cached[i]:
            pool.cached_block_hash_to_block.insert(
                make_block_hash_with_group_id(hashes[i], 0), pool.blocks[next_id]
            )
            next_id += 1
    v_spec = _v_attn(vllm, "SlidingWindowSpec", bs, sliding_window=spec.sliding_window)

    def lookup(pool: Any = pool) -> Any:
        return VSWManager.find_longest_cache_hit(
            block_hashes=hashes,
            max_length=num_tokens,
            kv_cache_group_ids=[0],
            block_pool=pool,
            kv_cache_spec=v_spec,
            use_eagle=False,
            alignment_tokens=bs,
        )

    t, result = _time(args.repeat, lookup)
    counting = CountingPool(pool)
    lookup(counting)
    return t, counting.probes, [b.block_id for b in result[0]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default=str(CONVERSATION_TRACE))
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--max-prompt", type=int, default=16384)
    parser.add_argument("--max-output", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--num-blocks", type=int, default=6000)
    parser.add_argument("--max-running", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--only", nargs="+", help="attention types of part 1 to run")
    parser.add_argument("--skip-allocation", action="store_true")
    parser.add_argument("--no-vllm", action="store_true")
    args = parser.parse_args(argv)

    vllm = None if args.no_vllm else import_vllm()
    if vllm is None:
        print("vLLM not importable: kvcore alone (see README, 'Benchmarks')")
    else:
        print(f"comparing with vLLM {vllm.version}")
    ok = True
    if not args.skip_allocation:
        ok &= bench_allocation_paths(args, vllm)
    ok &= bench_sliding_window_lookup(args, vllm)
    if not ok:
        print("ERROR: results differ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
