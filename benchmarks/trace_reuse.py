"""How a Mooncake trace reuses its prefixes: what an eviction policy works against.

Counts, over a trace's 512-token chunks (its ``hash_ids``: a chunk's id
depends on everything before it, so an id is a prefix), how many distinct
chunks there are and what share of them is used once, and the time between
two uses of the same chunk (the gap a cached prefix must survive to be hit):
its median and quartiles and its 10th and 90th percentiles, over every reuse.
Optionally for the first ``--limit`` requests only (the tutorial's slice).

Run::

    python benchmarks/trace_reuse.py --record
    python benchmarks/trace_reuse.py --limit 2000 --record
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from _common import CONVERSATION_TRACE
from _record import Recorder, percent


def reuse(path: Path, limit: int | None) -> dict[str, float]:
    """Distinct chunks, the share used once and the reuse gaps (seconds) of a trace."""
    last_use: dict[int, float] = {}
    uses: dict[int, int] = defaultdict(int)
    gaps: list[float] = []
    requests = 0
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if limit is not None and requests >= limit:
                break
            record = json.loads(line)
            requests += 1
            now = record["timestamp"] / 1000
            for chunk in record["hash_ids"]:
                if chunk in last_use:
                    gaps.append(now - last_use[chunk])
                last_use[chunk] = now
                uses[chunk] += 1
    if len(gaps) < 2:
        msg = f"{path.name}: {len(gaps)} reuse(s) in {requests} requests; gaps need at least 2"
        raise ValueError(msg)
    cuts = statistics.quantiles(gaps, n=20)  # 5 % steps: 10 % is cuts[1], 90 % cuts[17]
    quartiles = statistics.quantiles(gaps, n=4)
    return {
        "requests": requests,
        "chunks": len(uses),
        "used_once": sum(1 for n in uses.values() if n == 1) / len(uses),
        "reuses": len(gaps),
        "gap_p10": cuts[1],
        "gap_q1": quartiles[0],
        "gap_median": quartiles[1],
        "gap_q3": quartiles[2],
        "gap_p90": cuts[17],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=CONVERSATION_TRACE)
    parser.add_argument("--limit", type=int, help="the first N requests only")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/trace-reuse[-LIMIT].json"
    )
    args = parser.parse_args(argv)
    name = "trace-reuse" + (f"-{args.limit}" if args.limit else "")
    recorder = Recorder(name, enabled=args.record)
    found = reuse(args.trace, args.limit)
    print(
        f"{args.trace.name}: {found['requests']:,} requests, {found['chunks']:,} distinct "
        f"chunks, {percent(found['used_once'], 0)} used once; {found['reuses']:,} reuses, "
        f"gap between two uses: median {found['gap_median']:.0f} s, quartiles "
        f"{found['gap_q1']:.0f}–{found['gap_q3']:.0f} s, 10 % within {found['gap_p10']:.0f} "
        f"s, 10 % after {found['gap_p90']:.0f} s"
    )
    recorder.figure("used-once", percent(found["used_once"], 0))
    for key in ("gap_p10", "gap_q1", "gap_median", "gap_q3", "gap_p90"):
        recorder.figure(key.replace("_", "-"), f"{found[key]:.0f} s")
    recorder.data.update(found)
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
