"""Where the gap between LRU and Belady comes from, on a trace's prefix chains alone.

A model much simpler than ``kvcore simulate``, to isolate the policy: requests
are replayed one at a time in arrival order, each prompt is its chain of full
512-token chunks (the Mooncake hash ids), a hit is the longest cached prefix
of the chain, and the cache holds ``capacity`` chunks (full attention only:
no windows, no states, no concurrency). After each request its whole chain is
cached; when the cache is over capacity, the policy evicts. Policies:

``lru``
    Least recently used, a chain's tail before its head.
``turns (online)``
    LRU plus a credit (in requests) per earlier turn of the conversation,
    counted from the hits on the chain's second chunk: the best predictor of
    a continuation an engine has (see docs/explanation/eviction.rst).
``knows-continuation (oracle)``
    LRU, but a chain that some later request reads is kept before any chain
    none does: it knows *whether*, not *when*.
``belady (oracle)``
    Evict the chunk whose next use is farthest away.

Run::

    python benchmarks/eviction_headroom.py                      # conversation trace
    python benchmarks/eviction_headroom.py --trace synthetic --capacity 300,1000,3000
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence

from _common import DATA
from _record import Recorder

CHUNK = 512
Priority = Callable[[int, list[int], dict[int, int]], list[tuple[float, int]]]


def read_chains(path: str) -> tuple[list[list[int]], int]:
    """Each request's chain of full chunks (as node ids), and the trace's prompt tokens."""
    nodes: dict[tuple[int, int], int] = {}
    chains = []
    prompt_tokens = 0
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            prompt_tokens += record["input_length"]
            parent = 0
            chain = []
            for hash_id in record["hash_ids"][: record["input_length"] // CHUNK]:
                node = nodes.setdefault((parent, hash_id), len(nodes) + 1)
                chain.append(node)
                parent = node
            chains.append(chain)
    return chains, prompt_tokens


def replay(chains: Sequence[list[int]], capacity: int, priority: Priority) -> int:
    """Hit tokens with ``capacity`` chunks; the lowest priority is evicted first."""
    cached: dict[int, tuple[float, int]] = {}
    heap: list[tuple[tuple[float, int], int]] = []
    hits_on: dict[int, int] = defaultdict(int)
    hit_tokens = 0
    for index, chain in enumerate(chains):
        matched = 0
        for node in chain:
            if node not in cached:
                break
            matched += 1
        hit_tokens += matched * CHUNK
        for node in chain[:matched]:
            hits_on[node] += 1
        for node, key in zip(chain, priority(index, chain, hits_on), strict=True):
            cached[node] = key
            heapq.heappush(heap, (key, node))
        while len(cached) > capacity:
            key, node = heapq.heappop(heap)
            if cached.get(node) == key:
                del cached[node]
        if len(heap) > 4 * capacity + 1024:
            heap = [(key, node) for node, key in cached.items()]
            heapq.heapify(heap)
    return hit_tokens


def policies(chains: Sequence[list[int]]) -> dict[str, Priority]:
    uses: dict[int, list[int]] = defaultdict(list)
    for index, chain in enumerate(chains):
        for node in chain:
            uses[node].append(index)

    def later_use(node: int, index: int) -> int | None:
        times = uses[node]
        at = bisect.bisect_right(times, index)
        return times[at] if at < len(times) else None

    def lru(index: int, chain: list[int], hits: dict[int, int]) -> list[tuple[float, int]]:
        return [(index, -depth) for depth in range(len(chain))]

    def turns(index: int, chain: list[int], hits: dict[int, int]) -> list[tuple[float, int]]:
        earlier = hits[chain[1]] if len(chain) > 1 else 0
        return [(index + 150 * min(earlier, 3), -depth) for depth in range(len(chain))]

    def knows_continuation(
        index: int, chain: list[int], hits: dict[int, int]
    ) -> list[tuple[float, int]]:
        again = bool(chain) and later_use(chain[-1], index) is not None
        return [(index + (1e9 if again else 0), -depth) for depth in range(len(chain))]

    def belady(index: int, chain: list[int], hits: dict[int, int]) -> list[tuple[float, int]]:
        keys = []
        for depth, node in enumerate(chain):
            following = later_use(node, index)
            keys.append((-(following if following is not None else 1e12), -depth))
        return keys

    return {
        "lru": lru,
        "turns (online)": turns,
        "knows-continuation (oracle)": knows_continuation,
        "belady (oracle)": belady,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", choices=("conversation", "synthetic"), default="conversation")
    parser.add_argument("--capacity", default="1200,5000,20000", help="chunks, comma-separated")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/eviction-headroom.json"
    )
    args = parser.parse_args(argv)
    recorder = Recorder("eviction-headroom", enabled=args.record)
    path = DATA / "mooncake" / f"mooncake_{args.trace}_trace.jsonl"
    if not path.exists():
        print(f"missing {path}; set KVCORE_DATA", file=sys.stderr)
        return 2
    chains, prompt_tokens = read_chains(str(path))
    named = policies(chains)
    print(f"{args.trace}: {len(chains):,} requests, hit rate (% of prompt tokens)")
    print(f"{'capacity':>22}  " + "  ".join(f"{name:>28}" for name in named))
    for capacity in (int(c) for c in args.capacity.split(",")):
        rates = [100 * replay(chains, capacity, fn) / prompt_tokens for fn in named.values()]
        for name, rate in zip(named, rates, strict=True):
            recorder.figure(f"{capacity}.{name.split()[0]}", f"{rate:.1f} %")
        label = f"{capacity:,} chunks ({capacity * CHUNK / 1e6:.1f} M tok)"
        print(f"{label:>22}  " + "  ".join(f"{rate:>28.1f}" for rate in rates), flush=True)
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
