"""Admitting and freeing one 128k-token prompt in an aged pool, kvcore against vLLM 0.14.

Two models: full attention alone, and a gpt-oss-like hybrid (full attention
plus a sliding window of 128 tokens), block size 16, a pool just large enough
for the prompt in every group. The pool is aged first (every block used,
cached and freed: see ``_replay.py``), so a miss evicts one cached block per
new block, as on a server in steady state. Two scenarios:

``miss``
    a prompt nobody has seen: the lookup finds nothing, the admission takes
    8,192 blocks per group, each evicting a cached block;
``hit``
    the same prompt was admitted and freed just before: the lookup finds all
    but the last block, the admission revives those blocks from the free
    queue and takes one new block per group.

Timed per implementation and round (median and min–max of interleaved,
order-rotated rounds; the untimed setup builds and ages a fresh pool every
round): ``lookup`` (``get_computed_blocks`` with the prompt's hashes already
computed), ``admission`` (``allocate_slots``), their sum, ``free``, and the
admission including hashing the prompt (request creation + first lookup +
``allocate_slots``: vLLM hashes when the request is created, kvcore on the
first lookup). Every result (hit length, block ids per group) is compared.

Run::

    VENV/bin/python benchmarks/bench_long_prompts.py   # with vLLM installed
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from _common import (
    Spread,
    first_difference,
    import_vllm,
    interleaved_rounds,
    print_load,
)
from _record import Recorder, ratio
from _replay import (
    ADMIT,
    AGEING_TOKEN_BASE,
    FREE,
    LOOKUP,
    MAX_MODEL_LEN,
    NEW,
    Case,
    Recording,
    record_ops,
    replay_kvcore,
    replay_vllm,
)

import kvcore
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

ATTENTION = {"num_kv_heads": 8, "head_size": 64, "dtype": "bfloat16"}


def _v(vllm: Any, cls_name: str, bs: int, **extra: Any) -> Any:
    import torch

    cls = getattr(vllm.kv_cache_interface, cls_name)
    return cls(block_size=bs, num_kv_heads=8, head_size=64, dtype=torch.bfloat16, **extra)


CASES = [
    Case(
        "full attention",
        lambda bs: [FullAttentionSpec(block_size=bs, **ATTENTION)],
        lambda v, bs: [_v(v, "FullAttentionSpec", bs)],
    ),
    Case(
        "full + sliding window 128",
        lambda bs: [
            FullAttentionSpec(block_size=bs, **ATTENTION),
            SlidingWindowSpec(block_size=bs, sliding_window=128, **ATTENTION),
        ],
        lambda v, bs: [
            _v(v, "FullAttentionSpec", bs),
            _v(v, "SlidingWindowSpec", bs, sliding_window=128),
        ],
        note="gpt-oss-like",
    ),
]

PHASES = ("lookup", "admission", "lookup + admission", "free", "admission with hashing")


def recording(case: Case, num_tokens: int, bs: int, hit: bool) -> tuple[Recording, list[int]]:
    """The untimed setup (ageing, and for a hit the prompt's first admission) and the prompt."""
    num_groups = len(case.kvcore_specs(bs))
    num_blocks = num_groups * (num_tokens // bs + 64) + 1
    rec = record_ops(case, [], [], num_blocks, bs, 1, aged=True)
    base = AGEING_TOKEN_BASE - MAX_MODEL_LEN
    prompt = list(range(base, base + num_tokens))
    if hit:
        index = len(rec.prompts)
        rec.prompts.append(tuple(prompt))
        rec.ops += [(NEW, index), (LOOKUP, index), (ADMIT, index, num_tokens), (FREE, index)]
    rec.timed_from = len(rec.ops)
    return rec, prompt


def admit_and_free(prompt: list[int], ids: Callable[[Any], Any]) -> Callable[..., Any]:
    """The timed part, run on a replayed (aged) manager; returns (phase seconds, results)."""

    def run(manager: Any, make_request: Callable[[str, list[int]], Any]) -> Any:
        clock = time.perf_counter
        start = clock()
        request = make_request("target", prompt)
        manager.get_computed_blocks(request)
        hashing_and_lookup = clock() - start
        start = clock()
        hit_blocks, num_hit = manager.get_computed_blocks(request)
        lookup = clock() - start
        start = clock()
        blocks = manager.allocate_slots(request, len(prompt) - num_hit, num_hit, hit_blocks)
        admission = clock() - start
        request.num_computed_tokens = len(prompt)
        start = clock()
        manager.free(request)
        free = clock() - start
        seconds = [lookup, admission, lookup + admission, free, hashing_and_lookup + admission]
        return seconds, (num_hit, ids(hit_blocks), ids(blocks))

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=131_072)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--hash", default="sha256", help="kvcore's hash (vLLM: sha256)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/bench-long-prompts.json"
    )
    args = parser.parse_args(argv)
    recorder = Recorder("bench-long-prompts", enabled=args.record)
    with recorder.section("table"):
        ok = _run(args, recorder)
    if ok:
        recorder.write()
    return 0 if ok else 1


def _run(args: argparse.Namespace, recorder: Recorder) -> bool:
    """Print the table; False if kvcore and vLLM disagreed."""
    vllm = None if args.no_vllm else import_vllm()
    bs = args.block_size
    print(
        f"One {args.tokens:,}-token prompt, block size {bs}, aged pool: ms per operation, "
        f"median (min–max) of {args.rounds} interleaved rounds; kvcore hash {args.hash} on "
        f"its {kvcore.backend()} backend, vLLM sha256"
    )
    print_load()
    header = f"  {'model':<27}{'case':<6}{'operation':<24}{'kvcore ms':>22}"
    if vllm is not None:
        header += f"{'vLLM ms':>22}{'ratio':>8}"
    print(header)
    ok = True
    for case in CASES:
        for hit in (False, True):
            rec, prompt = recording(case, args.tokens, bs, hit)
            kv_after = admit_and_free(prompt, lambda b: [list(g) for g in b.blocks])
            candidates = {
                "kvcore": lambda c=case, r=rec, a=kv_after: (
                    lambda: replay_kvcore(c, r, args.hash, after=a)
                )
            }
            if vllm is not None:
                v_after = admit_and_free(
                    prompt, lambda b: [[x.block_id for x in g] for g in b.blocks]
                )
                candidates["vLLM"] = lambda c=case, r=rec, a=v_after: (
                    lambda: replay_vllm(vllm, c, r, after=a)
                )
            measured = interleaved_rounds(
                args.rounds, candidates, measure=lambda run: _split(run())
            )
            same = vllm is None or measured["kvcore"][1] == measured["vLLM"][1]
            ok &= same
            for index, phase in enumerate(PHASES):
                kv = Spread([s[index] for s in measured["kvcore"][0]])
                label = case.name if index == 0 and not hit else ""
                line = f"  {label:<27}{'hit' if hit else 'miss':<6}{phase:<24}{kv.fmt(1e3):>22}"
                if vllm is not None:
                    vl = Spread([s[index] for s in measured["vLLM"][0]])
                    line += f"{vl.fmt(1e3):>22}{vl.median / kv.median:>7.2f}x"
                    slug = phase.replace(" + ", "+").replace(" ", "-")
                    key = f"ratio.{CASES.index(case)}.{'hit' if hit else 'miss'}.{slug}"
                    recorder.figure(key, ratio(vl.median / kv.median))
                if index == 0:
                    line += f"  (hit {measured['kvcore'][1][1][0]:,} tokens)"
                print(line)
            if not same:
                where = first_difference(measured["kvcore"][1], measured["vLLM"][1])
                print(f"  RESULTS DIFFER: {where}")
    if vllm is not None:
        print(f"  identical results (ageing, hit lengths, block ids): {ok}")
    return ok


def _split(replay: Any) -> tuple[list[float], Any]:
    seconds, results = replay.after
    return seconds, (replay.results, results)


if __name__ == "__main__":
    sys.exit(main())
