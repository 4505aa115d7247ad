"""The allocation path per operation, kvcore against vLLM 0.14 in the same process.

The op sequence comes from real prompts (the Mooncake conversation trace,
block size 16): a small continuous-batching loop admits requests (cache
lookup, then one allocation for the uncached prompt), grows every running
request by one decode token per step, preempts the newest request when the
pool is full and frees requests when they finish. It starts from an *aged*
pool (every block used, cached and freed; see ``_replay.py``). The sequence
is recorded once, then replayed through each implementation and hash option
in interleaved rounds whose order rotates; every result (hit length, block
ids, refusals) of every replay is compared with vLLM's ``sha256`` replay, so
the timing also proves both behave the same.

Figures are medians over the rounds with the min–max spread, per operation
(lookup, admission, decode, free; see ``_replay.py``), with the clock reads
subtracted. Then the memory of a pool of 1,000,000 blocks (``--pool-blocks``),
fresh and aged, each pool built as a KV cache manager builds it for the hash:
the native one keeps fixed-width digests (sha256, xxh3_128) in its own arrays.
``--memory-only`` measures only that (with ``--record``, into
``bench-allocation-memory.json``: the 10^7-block figures of the docs).

kvcore runs twice, on the pure-Python block pool and on the compiled one
(where the extension is built; ``--backend`` keeps one), in the same rounds.

Run::

    python benchmarks/bench_allocation.py            # kvcore alone
    VENV/bin/python benchmarks/bench_allocation.py   # with vLLM installed: + ratios
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import sys
import time
import tracemalloc
from collections.abc import Callable
from functools import partial
from itertools import product
from typing import Any

from _common import (
    VLLM_HASHES,
    Spread,
    first_difference,
    import_vllm,
    interleaved_rounds,
    kvcore_hash_available,
    print_load,
    timer_overhead,
    vllm_hash_available,
)
from _record import Recorder, ratio
from _replay import (
    CATEGORIES,
    Case,
    Recording,
    Replay,
    add_trace_options,
    record_ops,
    replay_kvcore,
    replay_vllm,
    trace_workload,
)

import kvcore
from kvcore._backend import native_available
from kvcore._eviction.lru import LRUFreeQueue
from kvcore._hashing import DIGEST_SIZES, INT_HASH_ALGORITHMS
from kvcore._native_pool import NativeBlockPool
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

#: kvcore hash algorithm -> the vLLM option it is compared with.
PAIRS = {"sha256": "sha256", "xxh3_128": "xxhash"}


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def bench_replay(args: argparse.Namespace, vllm: Any | None, recorder: Recorder) -> bool:
    """Per-operation times of every implementation; False if any result differed."""
    prompts, outputs = trace_workload(args)
    rec = record_ops(
        FULL_ATTENTION,
        prompts,
        outputs,
        args.num_blocks,
        args.block_size,
        args.max_running,
        aged=not args.fresh,
    )
    kinds = rec.kind_counts()
    backends = _backends(args.backend)
    counts = rec.counts()
    print(
        f"op sequence: {len(rec.ops) - rec.timed_from} timed ops from {len(prompts)} Mooncake "
        f"requests (block size {args.block_size}, {args.num_blocks} blocks, "
        f"{'fresh pool' if args.fresh else f'aged pool: {rec.timed_from} untimed ageing ops'}): "
        f"{kinds[0]} new, {kinds[1]} lookups, {kinds[2]} admissions, {kinds[3]} decode "
        f"allocations, {kinds[4]} frees, {kinds[5]} preemptions"
    )
    candidates: dict[str, Callable[[], Callable[[], Replay]]] = {}
    for algorithm in kvcore.hashing.HASH_ALGORITHMS:
        if not kvcore_hash_available(algorithm):
            print(f"  (kvcore {algorithm}: the xxhash package is missing; pip install xxhash)")
            continue
        for backend in backends:
            candidates[f"kvcore/{backend}, {algorithm}"] = _kvcore_run(rec, algorithm, backend)
    if vllm is not None:
        for name in VLLM_HASHES:
            if vllm_hash_available(vllm, name):
                candidates[f"vLLM {name}"] = _vllm_run(vllm, rec, name)
            else:
                print(f"  (vLLM {name}: not available here, e.g. the xxhash package is missing)")
    overhead = timer_overhead()

    def measure(run: Callable[[], Replay]) -> tuple[list[float], list[Any]]:
        replay = run()
        per_op = replay.per_op(counts, overhead)
        total = (sum(replay.seconds) - sum(replay.clock_reads) * overhead) / sum(counts)
        return [*per_op, total], replay.results

    measured = interleaved_rounds(args.rounds, candidates, measure)
    reference_name = "vLLM sha256" if vllm is not None else f"kvcore/{backends[0]}, sha256"
    reference = measured[reference_name][1]
    ok = True
    for name, (_, results) in measured.items():
        if results != reference:
            where = first_difference(results, reference)
            print(f"ERROR: {name} differs from {reference_name}: {where}")
            ok = False
    columns = [*CATEGORIES, "all ops"]
    print(
        f"µs per operation, median (min–max) of {args.rounds} interleaved rounds; "
        f"{overhead * 1e9:.0f} ns of clock reads subtracted per op"
    )
    print_load()
    header = "".join(
        f"{c + f' ({n})':>24}" for c, n in zip(columns, [*counts, sum(counts)], strict=True)
    )
    print(f"  {'implementation':<24}{header}")
    spreads: dict[str, list[Spread]] = {}
    for name, (samples, _) in measured.items():
        spreads[name] = [Spread([s[i] for s in samples]) for i in range(len(columns))]
        print(f"  {name:<24}" + "".join(f"{s.fmt():>24}" for s in spreads[name]))
    if vllm is not None:
        print("  ratio vLLM / kvcore (median of each):")
        for (algorithm, vllm_name), backend in product(PAIRS.items(), backends):
            k, v = f"kvcore/{backend}, {algorithm}", f"vLLM {vllm_name}"
            if k in spreads and v in spreads:
                ratios = [b.median / a.median for a, b in zip(spreads[k], spreads[v], strict=True)]
                print(f"  {k + ' vs ' + vllm_name:<36}" + "".join(f"{r:>18.2f}x" for r in ratios))
                for column, value in zip(columns, ratios, strict=True):
                    key = f"ratio.{backend}.{algorithm}.{column.replace(' ', '-')}"
                    recorder.figure(key, ratio(value))
        print(f"  identical results (hit lengths, block ids, refusals) in every replay: {ok}")
    return ok


def _backends(asked: str | None) -> list[str]:
    """The block-pool backends to time: the one asked for, else both where the extension built."""
    if asked not in (None, "auto"):
        return [asked]
    if native_available():
        return ["python", "native"]
    print("  (kvcore native: the compiled module is not built; timing the Python pool only)")
    return ["python"]


def _kvcore_run(
    rec: Recording, algorithm: str, backend: str | None
) -> Callable[[], Callable[[], Replay]]:
    def prepare() -> Callable[[], Replay]:
        return lambda: replay_kvcore(FULL_ATTENTION, rec, algorithm, backend=backend)

    return prepare


def _vllm_run(vllm: Any, rec: Recording, name: str) -> Callable[[], Callable[[], Replay]]:
    def prepare() -> Callable[[], Replay]:
        return lambda: replay_vllm(vllm, FULL_ATTENTION, rec, name)

    return prepare


# -- pool memory, fresh and aged ----------------------------------------------------------------


class _Hashes:
    """A stand-in request: just the block hashes (what a pool's caching reads)."""

    def __init__(self, request_id: str, block_hashes: list[Any]) -> None:
        self.request_id = request_id
        self.block_hashes = block_hashes
        # The free queue's caching notice reads the prompt's length.
        self.num_prompt_tokens = 0
        self.lora_id = None
        self.lora_name = None


def _digests(start: int, count: int, algorithm: str) -> list[Any]:
    """``count`` distinct hash values of the type ``algorithm`` produces."""
    if algorithm == "sha256":
        return [
            hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(start, start + count)
        ]
    if algorithm == "xxh3_128":
        return [hashlib.md5(i.to_bytes(8, "little")).digest() for i in range(start, start + count)]
    return [hash((i, "kvcore-bench")) for i in range(start, start + count)]


def age_kvcore(pool: Any, num_blocks: int, bs: int, algorithm: str, chunk: int = 64) -> None:
    """Allocate every block in requests of ``chunk`` blocks, cache them all, free all."""
    tables = []
    done = 0
    while done < num_blocks - 1:
        n = min(chunk, num_blocks - 1 - done)
        blocks = pool.get_new_blocks(n)
        pool.cache_full_blocks(
            _Hashes(str(done), _digests(done, n, algorithm)), blocks, 0, n, bs, 0
        )
        tables.append(blocks)
        done += n
    for blocks in tables:
        pool.free_blocks(blocks[::-1])


def age_vllm(pool: Any, num_blocks: int, bs: int, chunk: int = 64) -> None:
    """The same ageing through vLLM's BlockPool (sha256-sized hashes)."""
    tables = []
    done = 0
    while done < num_blocks - 1:
        n = min(chunk, num_blocks - 1 - done)
        blocks = pool.get_new_blocks(n)
        pool.cache_full_blocks(_Hashes(str(done), _digests(done, n, "sha256")), blocks, 0, n, bs, 0)
        tables.append(blocks)
        done += n
    for blocks in tables:
        pool.free_blocks(reversed(blocks))


def traced_bytes(make: Callable[[], Any]) -> tuple[float, int, Any]:
    """Seconds to run ``make``, the bytes it left allocated (tracemalloc), its result."""
    gc.collect()
    tracemalloc.start()
    start = time.perf_counter()
    value = make()
    seconds = time.perf_counter() - start
    gc.collect()
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, size, value


def bench_memory(args: argparse.Namespace, vllm: Any | None, recorder: Recorder) -> None:
    n = args.pool_blocks
    bs = args.block_size
    print(
        f"\nPool of {n:,} blocks: bytes per block held (tracemalloc), fresh and aged "
        "(every block allocated, cached with a distinct hash, freed; the hashes are held "
        "by the pool alone)"
    )
    print_load()
    print(f"  {'implementation':<34}{'build s':>9}{'fresh B/block':>15}{'aged B/block':>14}")
    # Each pool as a KV cache manager builds it for the algorithm: the native
    # one keeps digests of a fixed width (sha256, xxh3_128) or 64-bit ints
    # (fast) in its own arrays.
    every: dict[str, Callable[[str], Any]] = {
        "python": lambda a: kvcore.managers.BlockPool(n),
        "native": lambda a: NativeBlockPool(
            n, digest_size=DIGEST_SIZES.get(a), int_hashes=a in INT_HASH_ALGORITHMS
        ),
    }
    makers = {backend: every[backend] for backend in _backends(args.backend)}
    hashes = {"sha256": "sha256 hashes", "xxh3_128": "16-byte hashes", "fast": "fast (int) hashes"}
    # Figure keys: bytes.<algorithm> for the Python pool, bytes.native.<algorithm> natively.
    rows = [
        (f"kvcore/{backend}, {label}", partial(make, algorithm), algorithm,
         algorithm if backend == "python" else f"{backend}.{algorithm}")
        for backend, make in makers.items()
        for algorithm, label in hashes.items()
    ]  # fmt: skip
    parts: dict[str, tuple[dict[str, int], dict[str, int]]] = {}
    for label, make, algorithm, key in rows:
        secs, fresh, pool = traced_bytes(make)
        fresh_parts = pool_components(pool, fresh)
        del pool
        _, aged, pool = traced_bytes(lambda make=make, a=algorithm: _aged(make(), n, bs, a))
        parts[label] = fresh_parts, pool_components(pool, aged)
        del pool
        print(f"  {label:<34}{secs:>9.3f}{fresh / n:>15.1f}{aged / n:>14.1f}")
        recorder.figure(f"bytes.{key}.fresh", f"{fresh / n:.0f} bytes per block")
        recorder.figure(f"bytes.{key}.aged", f"{aged / n:.0f} bytes per block")
    if vllm is not None:

        def make_vllm() -> Any:
            return vllm.block_pool.BlockPool(n, True, bs)

        secs, fresh, pool = traced_bytes(make_vllm)
        del pool
        _, aged, pool = traced_bytes(lambda: _aged_vllm(make_vllm(), n, bs))
        del pool
        label = f"vLLM {vllm.version}, sha256 hashes"
        print(f"  {label:<34}{secs:>9.3f}{fresh / n:>15.1f}{aged / n:>14.1f}")
        recorder.figure("bytes.vllm.fresh", f"{fresh / n:.0f} bytes per block")
        recorder.figure("bytes.vllm.aged", f"{aged / n:.0f} bytes per block")
    print("  by component, B/block fresh / aged (sys.getsizeof of what each kvcore pool holds):")
    labels = [label.removeprefix("kvcore/").removesuffix(" hashes") for label in parts]
    print(f"  {'component':<28}" + "".join(f"{label:>20}" for label in labels))
    for component in next(iter(parts.values()))[0]:
        cells = "".join(
            f"{f'{fresh[component] / n:.1f} / {aged[component] / n:.1f}':>20}"
            for fresh, aged in parts.values()
        )
        print(f"  {component:<28}{cells}")


def pool_components(pool: Any, total: int) -> dict[str, int]:
    """Bytes of each part of a kvcore pool's per-block state (``sys.getsizeof``).

    Block ids above 256 are int objects of their own (smaller ones are shared
    by the interpreter): counted once, wherever the queue or the map holds
    them; a native core's are those it keeps (:func:`native_id_objects`).
    ``other`` is ``total`` (tracemalloc) minus the parts.
    """
    queue = pool._queue
    links = [queue._queue, queue._stale] if isinstance(queue, LRUFreeQueue) else []
    native = isinstance(pool, NativeBlockPool)
    if native and pool._keyed:
        return digest_pool_components(pool, total)
    maps = [*pool._cached, *pool._dups]
    hashes = {id(h): h for h in pool._hash if h is not None}
    ids: dict[int, int] = {}
    for sequence in [*links, *(m.values() for m in pool._cached)]:
        for block in sequence:
            if block > 256:
                ids[id(block)] = block
    waiting = [blocks for dups in pool._dups for blocks in dups.values()]
    parts = {
        # The native core's C arrays: int32 counts, int32 queue links before and after.
        "reference counts": 4 * pool.num_blocks if native else sys.getsizeof(pool._ref),
        "group ids": sys.getsizeof(pool._group),
        "free queue + stale counts": (
            8 * (pool.num_blocks + 1) if native else sum(map(sys.getsizeof, links))
        ),
        "block-id int objects": (
            native_id_objects(pool) if native else sum(map(sys.getsizeof, ids.values()))
        ),
        "hash slots": sys.getsizeof(pool._hash),
        "hash objects": sum(map(sys.getsizeof, hashes.values())),
        "prefix map": sum(map(sys.getsizeof, maps)) + sum(map(sys.getsizeof, waiting)),
    }
    parts["other"] = total - sum(parts.values())
    return parts


def native_id_objects(pool: Any) -> int:
    """Bytes of the int objects a native core keeps for block ids, and of their slots."""
    held, slots = pool._core.id_objects
    return held * sys.getsizeof(2**20) + slots * 8


def digest_pool_components(pool: Any, total: int) -> dict[str, int]:
    """:func:`pool_components` of a native pool keeping digests: its arrays, from its layout."""
    links = 4 * pool.num_blocks + 8 * (pool.num_blocks + 1)
    waiting = [blocks for dups in pool._dups for blocks in dups.values()]
    parts = {
        "reference counts": 4 * pool.num_blocks,
        "group ids": sys.getsizeof(pool._group),
        "free queue + stale counts": 8 * (pool.num_blocks + 1),
        "block-id int objects": native_id_objects(pool),
        "hash slots": 0,
        # Digests, the bit a block, the table of block ids (native arrays).
        "hash objects": 0,
        "prefix map": pool.nbytes - links + sum(map(sys.getsizeof, [*pool._dups, *waiting])),
    }
    parts["other"] = total - sum(parts.values())
    return parts


def _aged(pool: Any, n: int, bs: int, algorithm: str) -> Any:
    age_kvcore(pool, n, bs, algorithm)
    return pool


def _aged_vllm(pool: Any, n: int, bs: int) -> Any:
    age_vllm(pool, n, bs)
    return pool


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_options(parser)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--fresh", action="store_true", help="start from a never-used pool")
    parser.add_argument("--pool-blocks", type=int, default=1_000_000)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="measure only the memory (recorded as bench-allocation-memory.json)",
    )
    parser.add_argument("--no-vllm", action="store_true")
    parser.add_argument(
        "--backend",
        choices=["auto", "python", "native"],
        default=None,
        help="time and measure only this block pool (default: both, python and native where "
        "it is built)",
    )
    parser.add_argument(
        "--record",
        action="store_true",
        help="write benchmarks/results/bench-allocation.json (-memory.json with --memory-only)",
    )
    args = parser.parse_args(argv)
    name = "bench-allocation-memory" if args.memory_only else "bench-allocation"
    recorder = Recorder(name, enabled=args.record)

    vllm = None if args.no_vllm else import_vllm()
    if vllm is None:
        print("vLLM not importable: kvcore alone, no ratios (see README, 'Benchmarks')")
    ok = True
    if not args.memory_only:
        with recorder.section("replay"):
            ok = bench_replay(args, vllm, recorder)
    if not args.skip_memory:
        with recorder.section("memory"):
            bench_memory(args, vllm, recorder)
    if ok:
        recorder.write()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
