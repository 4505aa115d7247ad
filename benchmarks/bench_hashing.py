"""Block hashing: kvcore's algorithms against vLLM 0.14's hash options, per block.

Every candidate hashes the same prompts (1,024 and 131,072 tokens, block size
16) into chained block hashes, the way its manager does when a request
arrives:

- kvcore: ``BlockHasher(16, algorithm).update(request)`` for ``sha256``,
  ``fast`` and ``xxh3_128``;
- the digests considered for ``xxh3_128`` and not chosen, in the same chained
  loop over the same byte encoding: BLAKE2b with a 16-byte digest (standard
  library) and BLAKE3 (the ``blake3`` package, when installed);
- vLLM 0.14: its request block hasher with ``sha256`` (pickle + SHA-256),
  ``sha256_cbor`` (CBOR + SHA-256) and ``xxhash`` (pickle + XXH3-128).

Figures: ns per block, median (min–max) of interleaved, order-rotated rounds,
and each candidate's speed relative to kvcore's ``sha256``. With ``--record``
the table and those ratios go to ``benchmarks/results/bench-hashing.json``.

Run::

    VENV/bin/python benchmarks/bench_hashing.py   # with vLLM (and xxhash) installed
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import sys
from collections.abc import Callable
from typing import Any

from _common import (
    VLLM_HASHES,
    Spread,
    import_vllm,
    interleaved_rounds,
    kvcore_hash_available,
    print_load,
    vllm_hash_available,
)
from _record import Recorder, ratio

import kvcore
from kvcore._hashing import BlockHasher


def _jobs(make: Callable[[], Callable[[], int]], calls: int) -> Callable[[], Any]:
    """``prepare()``: make ``calls`` fresh jobs (untimed); the timed run does them all."""

    def prepare() -> Callable[[], Any]:
        jobs = [make() for _ in range(calls)]
        return lambda: [job() for job in jobs][-1]

    return prepare


def kvcore_job(algorithm: str, tokens: list[int], bs: int) -> Callable[[], Callable[[], int]]:
    def make() -> Callable[[], int]:
        request = kvcore.Request("r", tokens)
        hasher = BlockHasher(bs, algorithm)
        return lambda: hasher.update(request) or len(request.block_hashes)

    return make


def chained_job(
    digest: Callable[[bytes], bytes], tokens: list[int], bs: int
) -> Callable[[], Callable[[], int]]:
    """A digest in kvcore's chained loop: ``digest(parent + packed block tokens)``."""

    def run() -> int:
        data = struct.pack(f"<{len(tokens)}q", *tokens)
        parent = digest(b"none")
        out = []
        append = out.append
        view = memoryview(data)
        step = 8 * bs
        for offset in range(0, len(data), step):
            parent = digest(parent + view[offset : offset + step])
            append(parent)
        return len(out)

    return lambda: run


def vllm_job(vllm: Any, name: str, tokens: list[int], bs: int) -> Callable[[], Callable[[], int]]:
    hash_fn = vllm.hashing.get_hash_fn_by_name(name)
    hasher = vllm.kv_cache_utils.get_request_block_hasher(bs, hash_fn)
    params = vllm.SamplingParams(max_tokens=1)

    def make() -> Callable[[], int]:
        request = vllm.request.Request("r", list(tokens), params, None, None)

        def run() -> int:
            vllm.kv_cache_utils.init_none_hash(hash_fn)
            return len(hasher(request))

        return run

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 131_072])
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/bench-hashing.json"
    )
    args = parser.parse_args(argv)
    recorder = Recorder("bench-hashing", enabled=args.record)
    with recorder.section("table"):
        ok = _run(args, recorder)
    if ok:
        recorder.write()
    return 0 if ok else 1


def _run(args: argparse.Namespace, recorder: Recorder) -> bool:
    """Print the table and record each ratio to kvcore's sha256; False on a wrong count."""
    vllm = None if args.no_vllm else import_vllm()
    bs = args.block_size
    print(
        f"Chained block hashes, block size {bs}: ns per block, median (min–max) of "
        f"{args.rounds} interleaved rounds"
    )
    print_load()
    for num_tokens in args.lengths:
        tokens = [(i * 2654435761) % 151_936 for i in range(num_tokens)]
        calls = max(1, 16_384 // num_tokens)  # >= 1,024 blocks per sample
        jobs: dict[str, Callable[[], Callable[[], int]]] = {}
        for algorithm in kvcore.hashing.HASH_ALGORITHMS:
            if kvcore_hash_available(algorithm):
                jobs[f"kvcore {algorithm}"] = kvcore_job(algorithm, tokens, bs)
        jobs["blake2b-128 (stdlib)"] = chained_job(
            lambda b: hashlib.blake2b(b, digest_size=16).digest(), tokens, bs
        )
        try:
            from blake3 import blake3
        except ImportError:
            print("  (blake3 package not installed: BLAKE3 not measured)")
        else:
            jobs["blake3-128"] = chained_job(lambda b: blake3(b).digest(16), tokens, bs)
        if vllm is not None:
            for name in VLLM_HASHES:
                if vllm_hash_available(vllm, name):
                    jobs[f"vLLM {name}"] = vllm_job(vllm, name, tokens, bs)
        candidates = {name: _jobs(make, calls) for name, make in jobs.items()}
        measured = interleaved_rounds(args.rounds, candidates)
        blocks = num_tokens // bs
        hashed = blocks * calls
        print(f"  {num_tokens:,} tokens ({blocks:,} blocks)")
        reference = Spread(measured["kvcore sha256"][0]).median
        for name, (samples, count) in measured.items():
            if count != blocks:
                print(f"ERROR: {name} produced {count} hashes for {blocks} blocks")
                return False
            spread = Spread([s / hashed for s in samples])
            relative = reference / (spread.median * hashed)
            print(f"    {name:<22}{spread.fmt(1e9):>24} ns   {relative:5.2f}x kvcore sha256")
            slug = name.split(" (")[0].replace(" ", "-")
            recorder.figure(f"vs-sha256.{num_tokens}.{slug}", ratio(relative))
    return True


if __name__ == "__main__":
    sys.exit(main())
