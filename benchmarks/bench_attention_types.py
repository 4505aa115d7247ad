"""Every attention type's allocation path, and the long-context sliding-window lookup.

Part 1, allocation path per operation: for each attention type (and two
hybrid models) an op sequence is recorded from real prompts (the Mooncake
conversation trace, block size 16) with a small continuous-batching loop:
admission = cache lookup + one allocation for the uncached prompt, one decode
token per running request per step, preemption of the newest request when the
pool is full, free on finish, starting from an aged pool (``_replay.py``).
The sequence is replayed through kvcore and, when it is importable, through
vLLM 0.14's ``KVCacheManager`` with the equivalent specs in the same process,
in interleaved rounds whose order rotates; every result (hit lengths and hit
blocks per group, new block ids per group, refusals) must be identical.
Prints, per type and operation (lookup, admission, decode, free), the median
µs per operation with its min–max spread, and the ratio of the medians.

Part 2, sliding-window lookup: a prompt of 8k, 32k and 128k tokens, window
128, block 16 (8 contiguous blocks needed), with none of its blocks cached,
2 % cached at random positions (no full window: a miss that still searches
the whole prompt), its first half cached (a hit of half the prompt) and all
of it cached. Compares the number of cache probes and the time of kvcore's
jump search, a plain right-to-left scan (the reference algorithm, probing
every block) and vLLM 0.14's ``SlidingWindowManager.find_longest_cache_hit``
over pools caching the same blocks under the same ids; all three must return
the same blocks.

Run::

    python benchmarks/bench_attention_types.py            # kvcore alone
    VENV/bin/python benchmarks/bench_attention_types.py   # with vLLM: + comparison
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from _common import (
    Spread,
    first_difference,
    import_vllm,
    interleaved_rounds,
    print_load,
    timer_overhead,
)
from _record import Recorder, ratio, span
from _replay import (
    CATEGORIES,
    Case,
    Replay,
    add_trace_options,
    record_ops,
    replay_kvcore,
    replay_vllm,
    trace_workload,
)

import kvcore
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


def bench_allocation_paths(args: argparse.Namespace, vllm: Any | None, recorder: Recorder) -> bool:
    """Part 1; returns False if kvcore and vLLM disagreed on any result."""
    prompts, outputs = trace_workload(args, args.max_prompt)
    bs = args.block_size
    overhead = timer_overhead()
    print(
        f"Allocation path: {len(prompts)} Mooncake requests (prompts capped at "
        f"{args.max_prompt} tokens, decode at {args.max_output}), block size {bs}, "
        f"{args.num_blocks} blocks per group, at most {args.max_running} running, "
        f"{'fresh' if args.fresh else 'aged'} pool, kvcore on its {kvcore.backend()} backend; "
        f"µs per operation, median (min–max) of "
        f"{args.rounds} interleaved rounds, {overhead * 1e9:.0f} ns of clock reads subtracted"
    )
    print_load()
    header = f"  {'type':<24}{'op':<11}{'n':>6}{'kvcore µs':>22}"
    if vllm is not None:
        header += f"{'vLLM µs':>22}{'ratio':>8}"
    print(header)
    all_same = True
    ratios: dict[str, list[float]] = {}
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        num_blocks = args.num_blocks * len(case.kvcore_specs(bs)) + 8
        rec = record_ops(
            case, prompts, outputs, num_blocks, bs, args.max_running, aged=not args.fresh
        )
        counts = rec.counts()
        candidates = {"kvcore": _prepare(lambda c=case, r=rec: replay_kvcore(c, r))}
        if vllm is not None:
            candidates["vLLM"] = _prepare(lambda c=case, r=rec: replay_vllm(vllm, c, r))

        def measure(run: Callable[[], Replay], counts: list[int] = counts) -> tuple[Any, Any]:
            replay = run()
            total = (sum(replay.seconds) - sum(replay.clock_reads) * overhead) / sum(counts)
            return [*replay.per_op(counts, overhead), total], replay.results

        measured = interleaved_rounds(args.rounds, candidates, measure)
        same = vllm is None or measured["kvcore"][1] == measured["vLLM"][1]
        all_same &= same
        for index, op in enumerate([*CATEGORIES, "all ops"]):
            n = counts[index] if index < len(counts) else sum(counts)
            kv = Spread([s[index] for s in measured["kvcore"][0]])
            line = f"  {case.name if index == 0 else '':<24}{op:<11}{n:>6}{kv.fmt():>22}"
            if vllm is not None:
                vl = Spread([s[index] for s in measured["vLLM"][0]])
                line += f"{vl.fmt():>22}{vl.median / kv.median:>7.2f}x"
                recorder.figure(
                    f"ratio.{case.name}.{op.replace(' ', '-')}", ratio(vl.median / kv.median)
                )
                if not (case.note and "caching off" in case.note and op == "lookup"):
                    ratios.setdefault(op, []).append(vl.median / kv.median)
            if index == 0 and case.note:
                line += f"  ({case.note})"
            print(line)
        if vllm is not None:
            if same:
                print(f"  {'':<24}identical results: yes")
            else:
                where = first_difference(measured["kvcore"][1], measured["vLLM"][1])
                print(f"  {'':<24}RESULTS DIFFER at {where}")
    for op, values in ratios.items():
        # Every type and hybrid (cross attention's lookup with caching off aside).
        recorder.figure(
            f"ratio.range.{op.replace(' ', '-')}", span(min(values), max(values), unit="×")
        )
    return all_same


def _prepare(run: Callable[[], Replay]) -> Callable[[], Callable[[], Replay]]:
    return lambda: run


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
    out = [[kvcore.managers.NULL_BLOCK] * max_blocks for _ in group_ids]
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


#: Which blocks of the prompt are cached, by scenario name.
PATTERNS = ("none", "scattered", "first half", "all")


def cached_pattern(pattern: str, n: int, density: float, rng: random.Random) -> list[bool]:
    """Which of the prompt's ``n`` blocks are cached in the scenario ``pattern``.

    ``none``: nothing (a miss); ``scattered``: each block with probability
    ``density`` (a miss at the default 2 %, the search still covering the
    whole prompt); ``first half``: the prompt shares its first half with an
    earlier request (a hit of half the prompt); ``all``: the whole prompt was
    seen before (a hit of all but the last token's block).
    """
    if pattern == "none":
        return [False] * n
    if pattern == "scattered":
        return [rng.random() < density for _ in range(n)]
    if pattern == "first half":
        return [i < n // 2 for i in range(n)]
    return [True] * n


def _per_call(run: Callable[[], Any], min_seconds: float = 2e-3) -> Callable[[], Any]:
    """A callable that runs ``run`` enough times to last ``min_seconds``; returns s/call."""
    start = time.perf_counter()
    run()
    once = max(time.perf_counter() - start, 1e-7)
    calls = max(1, int(min_seconds / once))

    def timed() -> tuple[float, Any]:
        start = time.perf_counter()
        for _ in range(calls):
            result = run()
        return (time.perf_counter() - start) / calls, result

    return timed


def _kvcore_lookup(pool: Any, spec: SlidingWindowSpec, hashes: list[bytes], length: int) -> Any:
    """kvcore's sliding-window hit search (the jump search) on ``pool``."""
    return SlidingWindowManager.find_longest_cache_hit(
        HitQuery(hashes, length, [0], pool, spec, False, spec.block_size)
    )


def bench_sliding_window_lookup(
    args: argparse.Namespace, vllm: Any | None, recorder: Recorder
) -> bool:
    """Part 2; returns False if any implementation disagreed."""
    window, bs = args.window, args.block_size
    spec = SlidingWindowSpec(block_size=bs, sliding_window=window, **ATTENTION)
    needed = -(-(window - 1) // bs)
    print(
        f"\nSliding-window lookup: window {window}, block {bs} ({needed} contiguous blocks "
        f"needed); cached blocks: none, scattered ({args.density:.0%} at random), the first "
        f"half of the prompt, all of it. Time per lookup, median (min–max) of {args.rounds} "
        "interleaved rounds; probes = cache lookups"
    )
    print_load()
    header = f"  {'tokens':>7}  {'cached':<11}{'hit':>7}  {'jump: probes, µs':>28}"
    header += f"  {'plain scan: probes, µs':>30}"
    if vllm is not None:
        header += f"  {'vLLM 0.14: probes, µs':>30}  {'vs vLLM':>7}"
    print(header)
    all_same = True
    for num_tokens in args.lengths:
        n = num_tokens // bs
        hashes = [hashlib.sha256(b"%d" % i).digest() for i in range(n)]
        for pattern in PATTERNS:
            cached = cached_pattern(pattern, n, args.density, random.Random(num_tokens))
            pool = kvcore.managers.BlockPool(n + 1)
            request = kvcore.Request("lookup", [0] * num_tokens)
            request.block_hashes.extend(hashes)
            table = [kvcore.managers.NULL_BLOCK] * n
            for i in range(n):
                if cached[i]:
                    table[i] = pool.get_new_blocks(1)[0]
            pool.cache_full_blocks(request, table, 0, n, bs, 0)

            # As get_computed_blocks asks: the last prompt token is always recomputed.
            limit = num_tokens - 1

            def jump(pool: Any = pool, hashes: list[bytes] = hashes, n: int = limit) -> Any:
                return _kvcore_lookup(pool, spec, hashes, n)

            def plain(pool: Any = pool, hashes: list[bytes] = hashes, n: int = limit) -> Any:
                return plain_scan(hashes, n, [0], pool, spec, False, bs)

            candidates = {"jump": (jump, pool), "plain": (plain, pool)}
            if vllm is not None:
                candidates["vLLM"] = _vllm_lookup(vllm, spec, hashes, cached, limit)
            probes = {}
            for name, (run, its_pool) in candidates.items():
                counting = CountingPool(its_pool)
                run(counting)
                probes[name] = counting.probes
            measured = interleaved_rounds(
                args.rounds,
                {name: (lambda run=run: _per_call(run)) for name, (run, _) in candidates.items()},
                measure=lambda timed: timed(),
            )
            hits = {name: [list(g) for g in result] for name, (_, result) in measured.items()}
            same = all(h == hits["jump"] for h in hits.values())
            all_same &= same
            times = {name: Spread(samples) for name, (samples, _) in measured.items()}
            hit_tokens = len(hits["jump"][0]) * bs
            line = f"  {num_tokens:>7}  {pattern:<11}{hit_tokens:>7}"
            for name in candidates:
                line += f"  {probes[name]:>6} {times[name].fmt():>23}"
            if vllm is not None:
                line += f"  {times['vLLM'].median / times['jump'].median:>6.1f}x"
                recorder.figure(
                    f"lookup.{num_tokens}.{pattern.replace(' ', '-')}",
                    f"{times['vLLM'].median / times['jump'].median:.1f}×",
                )
            print(line + ("" if same else "  RESULTS DIFFER"))
    print(
        "  hit: tokens found (the same for all three implementations, block for block, "
        "or the line says RESULTS DIFFER)"
    )
    return all_same


def _vllm_lookup(
    vllm: Any, spec: SlidingWindowSpec, hashes: list[bytes], cached: list[bool], max_length: int
) -> tuple[Callable[..., Any], Any]:
    """vLLM's sliding-window search, and a vLLM pool caching the same blocks (same ids)."""
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager as VSWManager

    bs = spec.block_size
    n = len(hashes)
    vllm_pool = vllm.block_pool.BlockPool(n + 1, True, bs)
    next_id = 1
    for i in range(n):
        if cached[i]:
            vllm_pool.cached_block_hash_to_block.insert(
                make_block_hash_with_group_id(hashes[i], 0), vllm_pool.blocks[next_id]
            )
            next_id += 1
    v_spec = _v_attn(vllm, "SlidingWindowSpec", bs, sliding_window=spec.sliding_window)

    def lookup(pool: Any = vllm_pool) -> Any:
        result = VSWManager.find_longest_cache_hit(
            block_hashes=hashes,
            max_length=max_length,
            kv_cache_group_ids=[0],
            block_pool=pool,
            kv_cache_spec=v_spec,
            use_eagle=False,
            alignment_tokens=bs,
        )
        return tuple([b.block_id for b in group] for group in result)

    return lookup, vllm_pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_options(parser, requests=100, num_blocks=6000, max_output=64)
    parser.add_argument("--max-prompt", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--fresh", action="store_true", help="start from a never-used pool")
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768, 131072])
    parser.add_argument("--only", nargs="+", help="attention types of part 1 to run")
    parser.add_argument("--skip-allocation", action="store_true")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/bench-attention-types.json"
    )
    args = parser.parse_args(argv)
    recorder = Recorder("bench-attention-types", enabled=args.record)

    vllm = None if args.no_vllm else import_vllm()
    if vllm is None:
        print("vLLM not importable: kvcore alone (see README, 'Benchmarks')")
    else:
        print(f"comparing with vLLM {vllm.version}")
    ok = True
    if not args.skip_allocation:
        with recorder.section("allocation"):
            ok &= bench_allocation_paths(args, vllm, recorder)
    with recorder.section("lookup"):
        ok &= bench_sliding_window_lookup(args, vllm, recorder)
    if not ok:
        print("ERROR: results differ")
        return 1
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
