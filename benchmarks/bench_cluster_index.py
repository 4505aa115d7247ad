"""How fast the cluster index takes events and answers queries, against what a fleet produces.

Records every event batch and every hit query of a fleet simulation (the
first requests of the Mooncake conversation trace on gpt-oss-20b, 16 engines
by default), then replays them into a fresh index on each backend: batches
submitted in order and applied in pipelines of ``--pipeline`` batches (a
subscriber drains its sockets and applies what it has in one round trip),
then the queries. Prints block operations (stores and removals) applied per
second next to the rate the simulated fleet produced them (mean, and peak
over 10 simulated seconds), and queries per second.

    python benchmarks/bench_cluster_index.py [--requests N] [--engines N]
        [--redis redis://HOST:PORT]

Without ``--redis`` a redis-server is started on a free loopback port when one
is installed. Timings depend on the machine's load: ratios from one run only.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Any

from _common import CONVERSATION_TRACE

import kvcore._sim.fleet as fleet_module
from kvcore._sim.fleet import FleetOptions, simulate_fleet
from kvcore._sim.simulate import SimulationOptions
from kvcore._sim.workload import load_workload
from kvcore.cluster import ClusterIndex, RedisBackend

RECORDED: dict[str, list[Any]] = {"batches": [], "queries": []}


class RecordingIndex(ClusterIndex):
    def submit(self, engine: str, seq: int, ts: float, events: Any) -> str:
        RECORDED["batches"].append((engine, seq, ts, list(events)))
        return super().submit(engine, seq, ts, events)

    def hit_tokens(self, block_hashes: Any, num_tokens: int, engines: Any = None) -> dict[str, int]:
        RECORDED["queries"].append((list(block_hashes), num_tokens, list(engines or ())))
        return super().hit_tokens(block_hashes, num_tokens, engines)


def replay(index: ClusterIndex, pipeline: int) -> tuple[float, float, int]:
    batches, queries = RECORDED["batches"], RECORDED["queries"]
    for engine in sorted({b[0] for b in batches}):
        index.heartbeat(engine)
    start = time.perf_counter()
    for i, batch in enumerate(batches, 1):
        index.submit(*batch)
        if i % pipeline == 0:
            index.flush()
    index.flush()
    apply_s = time.perf_counter() - start
    start = time.perf_counter()
    for block_hashes, num_tokens, engines in queries:
        index.hit_tokens(block_hashes, num_tokens, engines)
    return apply_s, time.perf_counter() - start, index.stats.block_ops


def start_redis() -> tuple[str, subprocess.Popen[bytes] | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        return "", None
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--save",
            "",
            "--dir",
            tempfile.gettempdir(),
        ],
        stdout=subprocess.DEVNULL,
    )
    time.sleep(0.5)
    return f"redis://127.0.0.1:{port}", process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--engines", type=int, default=16)
    parser.add_argument("--memory", default="48GiB")
    parser.add_argument("--pipeline", type=int, default=64)
    parser.add_argument("--redis", metavar="URL")
    args = parser.parse_args()

    fleet_module.ClusterIndex = RecordingIndex  # type: ignore[misc]
    workload = load_workload(CONVERSATION_TRACE, limit=args.requests)
    report = simulate_fleet(
        workload,
        SimulationOptions(memory=args.memory),
        FleetOptions(engines=args.engines, router="prefix", time_scale=args.engines / 2),
    )
    produced = report.index
    print(
        f"fleet: {args.engines} engines, {args.requests} requests of the conversation trace at "
        f"{args.engines / 2:g}x pace: {produced.block_ops:,} block ops in "
        f"{produced.simulated_s:.0f} simulated s = {produced.produced_block_ops_per_s:,.0f}/s "
        f"(peak {produced.peak_block_ops_per_s:,.0f}/s), {produced.queries:,} queries"
    )
    from kvcore._planning.plan import plan
    from kvcore._plugin_loader import load_registry
    from kvcore.cluster import FleetLayout

    registry = load_registry()
    config = plan("gpt-oss-20b", memory=args.memory, registry=registry).kv_cache_config
    layout = FleetLayout(config=config, registry=registry, hash_algorithm="fast")
    url, process = (args.redis, None) if args.redis else start_redis()
    try:
        backends: list[tuple[str, Any]] = [("embedded", None)]
        if url:
            groups = len(config.kv_cache_groups)
            backends.append(("redis", RedisBackend(url, groups, namespace="kvcore-bench")))
        for name, backend in backends:
            index = ClusterIndex(layout, backend)
            apply_s, query_s, ops = replay(index, args.pipeline)
            rate = ops / apply_s
            headroom = rate / produced.peak_block_ops_per_s
            queries = len(RECORDED["queries"]) / query_s
            print(
                f"{name:>8}: {rate:,.0f} block ops/s applied ({headroom:.1f}x the fleet's peak), "
                f"{queries:,.0f} queries/s"
            )
            if backend is not None:
                backend.clear_namespace()
            index.close()
    finally:
        if process is not None:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
