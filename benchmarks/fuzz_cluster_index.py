"""Fuzz the cluster index off CI: millions of random and mutated batches through both backends.

Drives two indexes, one on the in-process backend and one on a real Redis,
with the same random history: valid batches, batches with one bad event
(a hash of the wrong type or width, a group out of range, a wrong block size
or kind, something that is not an event), batches that go through the wire
format and are mutated on the way (a byte changed, cut short, grown), replays,
gaps, restarts, replaced incarnations, pool announcements, heartbeats,
resyncs and silences past the heartbeat timeout. Counts:

* crashes: anything but a kvcore error out of the decoder or an index;
* divergences: the two indexes answer a submission differently, or differ
  in entries per engine, live engines, counters or the hits of random
  prompts (checked every ``--check-every`` steps);
* the longest time Redis spent on one batch (its ``SLOWLOG``, the apply
  script's calls) and on one query;
* then, apart from the fuzz, the time Redis spends on the largest batches an
  index sends (16,384 hashes) on an engine of a 131,072-block pool: stores
  into empty entries, and removals plus stores on a full engine, with
  integer and with SHA-256 hashes.

    nice -n 19 python benchmarks/fuzz_cluster_index.py --batches 250000 --seed 1
        [--hash {fast,sha256,xxh3_128} ...] [--largest-rounds 4]
        [--redis redis://HOST:PORT] [--json results.json] [--record]

One fuzz run per ``--hash`` (seeds ``--seed``, ``--seed`` + 1, ...), then
``--largest-rounds`` rounds of the largest batches; ``--record`` writes
``benchmarks/results/fuzz-cluster-index.json``. The exit status is 1 if any
run crashed or diverged.

Without ``--redis`` a redis-server is started on a free loopback port (its
slow log is set to record calls from 100 µs). The run stops at the first
crash or divergence only with ``--stop``; otherwise it counts them, prints
the first few with the steps that led there, and goes on with fresh indexes.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import deque
from typing import Any

import attrs
import redis
from _common import positive_int, print_load
from _record import Recorder, command_line, span, table

import kvcore
from kvcore.cluster import (
    ClusterIndex,
    EmbeddedBackend,
    EventBatch,
    EventFormatError,
    FleetLayout,
    RedisBackend,
    decode_batch,
    encode_batch,
)
from kvcore.errors import KVCoreError
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

ENGINES = ("a", "b", "c")
POOL = 12
KINDS = ("full_attention", "sliding_window")
HASHES = ("fast", "sha256", "xxh3_128")
RECORD = "fuzz-cluster-index"
ODD_VALUES = (-1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, b"12345678", b"", 1.5, 2, 10**7, None)


def make_layout(hash_algorithm: str) -> FleetLayout:
    common = {"block_size": 4, "num_kv_heads": 1, "head_size": 1, "dtype": "float32"}
    specs = [FullAttentionSpec(**common), SlidingWindowSpec(sliding_window=4, **common)]
    registry = kvcore.load_registry(only=["full_attention", "sliding_window"])
    config = kvcore.KVCacheConfig.from_specs(POOL, specs)
    return FleetLayout(config=config, registry=registry, hash_algorithm=hash_algorithm)


class History:
    """Random steps; each engine's sequence numbers and incarnations as a publisher keeps them."""

    def __init__(self, rng: random.Random, digest: int | None) -> None:
        self.rng = rng
        self.digest = digest
        self.seq = dict.fromkeys(ENGINES, 0)
        self.incarnation = dict.fromkeys(ENGINES, "i0")
        self.runs = dict.fromkeys(ENGINES, 0)

    def block_hash(self) -> Any:
        value = self.rng.randrange(10)
        if self.digest is None:
            return value
        return value.to_bytes(self.digest, "big")

    def event(self) -> Any:
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            return kvcore.events.AllBlocksCleared()
        group = rng.randrange(2)
        size = rng.choices((0, 1, 2, 3, 6, 12, 40), (10, 30, 25, 15, 10, 7, 3))[0]
        hashes = [self.block_hash() for _ in range(size)]
        if roll < 0.55:
            return kvcore.events.BlockRemoved(block_hashes=hashes, group_idx=group)
        return kvcore.events.BlockStored(
            block_hashes=hashes,
            parent_block_hash=None,
            token_ids=[],
            block_size=4,
            group_idx=group,
            kind=rng.choice((None, KINDS[group])),
        )

    def spoil(self, events: list[Any]) -> None:
        rng = self.rng
        i = rng.randrange(len(events))
        event, odd = events[i], rng.choice(ODD_VALUES)
        if isinstance(event, kvcore.events.AllBlocksCleared) or rng.random() < 0.1:
            events[i] = "BlockStored"
            return
        way = rng.randrange(4 if isinstance(event, kvcore.events.BlockStored) else 2)
        if way == 0:
            events[i] = attrs.evolve(event, block_hashes=[*event.block_hashes, odd])
        elif way == 1:
            events[i] = attrs.evolve(event, group_idx=rng.choice((-1, 2, 10**7)))
        elif way == 2:
            events[i] = attrs.evolve(event, block_size=8)
        else:
            events[i] = attrs.evolve(event, kind="mamba")

    def step(self) -> dict[str, Any]:
        rng = self.rng
        engine = rng.choice(ENGINES)
        roll = rng.random()
        if roll < 0.05:
            return {"action": "heartbeat", "engine": engine}
        if roll < 0.09:
            return {"action": "resync", "engine": engine}
        if roll < 0.14:
            return {"action": "tick", "seconds": 6.0 if rng.random() < 0.15 else 1.0}
        choice = rng.choices(("same", "new", "old", "none", "bad"), (90, 4, 3, 2, 1))[0]
        if choice == "new":
            self.runs[engine] += 1
            self.incarnation[engine] = f"i{self.runs[engine]}"
            self.seq[engine] = 0
        incarnation = {"same": self.incarnation[engine], "new": self.incarnation[engine]}.get(
            choice, {"old": "i0", "none": None, "bad": "bad id"}.get(choice)
        )
        seq = self.seq[engine] + rng.choices((0, 2, -2, -1), (85, 6, 5, 4))[0]
        seq = max(0, seq)
        self.seq[engine] = max(self.seq[engine], seq + 1)
        events = [self.event() for _ in range(rng.randrange(6))]
        if events and rng.random() < 0.1:
            self.spoil(events)
        return {
            "action": "submit",
            "engine": engine,
            "seq": seq,
            "incarnation": incarnation,
            "num_blocks": rng.choices((None, 8, POOL, 10**6, 0), (85, 5, 5, 3, 2))[0],
            "events": events,
            "wire": rng.random() < 0.5,
            "mutate": rng.random() < 0.3,
        }

    def mutate(self, payload: bytes) -> bytes:
        rng = self.rng
        data = bytearray(payload)
        way = rng.randrange(4)
        if way == 0 and data:
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif way == 1:
            del data[rng.randrange(len(data) + 1) :]
        elif way == 2:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        else:
            start = rng.randrange(len(data) + 1)
            data[start:start] = rng.randbytes(rng.randrange(1, 16))
        return bytes(data)


def outcome(call: Any) -> tuple[Any, ...]:
    try:
        return ("ok", call())
    except KVCoreError as exc:
        return ("error", type(exc).__name__, str(exc))


def wire(history: History, step: dict[str, Any], ts: float) -> Any:
    """The step's batch as a subscriber decodes it: an EventBatch, or None if refused."""
    events = [e for e in step["events"] if not isinstance(e, str)]
    try:
        payload = encode_batch(
            EventBatch(ts, events, incarnation=step["incarnation"], num_blocks=step["num_blocks"])
        )
    except (TypeError, OverflowError, ValueError):
        return "unsendable"
    if step["mutate"]:
        payload = history.mutate(payload)
    try:
        return decode_batch(payload)
    except EventFormatError:
        return None


class Pair:
    """An embedded and a Redis index on one clock, fed alike."""

    def __init__(self, layout: FleetLayout, url: str) -> None:
        self.now = [0.0]
        options: dict[str, Any] = {
            "heartbeat_timeout_s": 5.0,
            "clock": lambda: self.now[0],
            "max_pending": 4,
        }
        self.redis_backend = RedisBackend(url, 2, namespace=f"fuzz-{uuid.uuid4().hex[:12]}")
        self.indexes = (
            ClusterIndex(layout, EmbeddedBackend(2), **options),
            ClusterIndex(layout, self.redis_backend, **options),
        )

    def close(self) -> None:
        self.redis_backend.clear_namespace()
        for index in self.indexes:
            index.close()

    def run(self, history: History, step: dict[str, Any]) -> bool:
        """Apply ``step`` to both; whether they answered alike (a batch counted or not)."""
        action = step["action"]
        if action == "tick":
            self.now[0] += step["seconds"]
            return True
        if action != "submit":
            results = [
                outcome(lambda i=index: getattr(i, action)(step["engine"]))
                for index in self.indexes
            ]
            return results[0] == results[1]
        events, incarnation, num_blocks = step["events"], step["incarnation"], step["num_blocks"]
        if step["wire"]:
            batch = wire(history, step, self.now[0])
            if batch is None or batch == "unsendable":
                return True
            events, incarnation, num_blocks = batch.events, batch.incarnation, batch.num_blocks
        results = [
            outcome(
                lambda i=index: i.submit(
                    step["engine"],
                    step["seq"],
                    self.now[0],
                    events,
                    incarnation=incarnation,
                    num_blocks=num_blocks,
                )
            )
            for index in self.indexes
        ]
        return results[0] == results[1]

    def state(self, index: ClusterIndex, probes: list[list[int]]) -> tuple[Any, ...]:
        engines = list(ENGINES)
        return (
            index.live_engines(),
            [index.cached_blocks(engine) for engine in engines],
            [index.hit_tokens(probe, 4 * len(probe) + 1, engines) for probe in probes],
            attrs.asdict(index.stats, filter=lambda a, _: not a.name.endswith("_s")),
        )

    def same_state(self, history: History, rng: random.Random) -> bool:
        probes = [[history.block_hash() for _ in range(rng.randrange(1, 6))] for _ in range(2)]
        first, second = (self.state(index, probes) for index in self.indexes)
        return first == second


def start_redis() -> tuple[str, subprocess.Popen[bytes]]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed (apt-get install redis-server), or pass --redis")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tempfile.mkdtemp()
    process = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--dir", folder],
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    client = redis.Redis.from_url(url)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)
    client.close()
    return url, process


class SlowLog:
    """The longest apply-script and query-script calls Redis logged (µs)."""

    def __init__(self, url: str, apply_sha: str, query_sha: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.saved = self.client.config_get("slowlog-*")
        self.client.config_set("slowlog-log-slower-than", 100)
        self.client.config_set("slowlog-max-len", 100_000)
        self.client.slowlog_reset()
        self.shas = {apply_sha.encode(): "apply", query_sha.encode(): "query"}
        self.longest = {"apply": 0, "query": 0}
        self.over_100_ms = 0

    def read(self) -> None:
        for entry in self.client.slowlog_get(100_000):
            args = entry["command"].split()
            if len(args) > 1 and args[0].upper() == b"EVALSHA" and args[1] in self.shas:
                kind = self.shas[args[1]]
                self.longest[kind] = max(self.longest[kind], entry["duration"])
                self.over_100_ms += kind == "apply" and entry["duration"] > 100_000
        self.client.slowlog_reset()

    def close(self) -> None:
        self.read()
        for key, value in self.saved.items():
            self.client.config_set(key, value)
        self.client.close()


class _Largest:
    """One engine of a 131,072-block pool on Redis, fed the largest batches an index sends."""

    POOL = 131_072

    def __init__(self, url: str, width: int | None) -> None:
        self.width = width
        self.backend = RedisBackend(url, 2, namespace=f"largest-{uuid.uuid4().hex[:12]}")
        self.log = SlowLog(url, self.backend._apply_script.sha, self.backend._query_script.sha)
        self.seq = 0

    def keys(self, start: int, stop: int) -> list[Any]:
        if self.width is None:
            return list(range(start, stop))
        return [i.to_bytes(self.width, "big") for i in range(start, stop)]

    def apply(self, *ops: Any, reset: bool = False) -> float:
        """Milliseconds Redis spent on one batch of ``ops``."""
        from kvcore.cluster import ReadyBatch

        batch = ReadyBatch("a", self.seq, 1.0, ops, reset, "x", self.POOL)
        assert self.backend.apply([batch]) == ["applied"]
        self.seq += 1
        self.log.longest["apply"] = 0
        self.log.read()
        return self.log.longest["apply"] / 1000

    def close(self) -> None:
        self.log.close()
        self.backend.clear_namespace()
        self.backend.close()


def largest_batches(url: str) -> dict[str, float]:
    """Milliseconds Redis spends on the largest batches an index sends (16,384 hashes)."""
    from kvcore.cluster._validate import MAX_BATCH_HASHES as most

    out: dict[str, float] = {}
    for width, name in ((None, "int"), (32, "sha256")):
        engine = _Largest(url, width)
        out[f"{name}: {most:,} stores into empty entries"] = engine.apply(
            (1, 0, engine.keys(0, most)), reset=True
        )
        for start in range(most, engine.POOL, most):
            engine.apply((1, start // most % 2, engine.keys(start, start + most)))
        half = most // 2
        out[f"{name}: {half:,} removals + {half:,} stores, full engine"] = engine.apply(
            (-1, 0, engine.keys(0, half)), (1, 1, engine.keys(engine.POOL, engine.POOL + half))
        )
        engine.close()
    return out


#: The two largest batches timed, as keys of the record's figures (see :func:`record`).
LARGEST = {"stores into empty entries": "stores", "removals +": "removals-and-stores"}


def run(args: argparse.Namespace, url: str, seed: int, hash_algorithm: str) -> dict[str, Any]:
    """Fuzz ``args.batches`` batches of ``hash_algorithm`` hashes from ``seed``; the counts."""
    layout = make_layout(hash_algorithm)
    rng = random.Random(seed)
    digest = {"fast": None, "sha256": 32, "xxh3_128": 16}[hash_algorithm]
    pair = Pair(layout, url)
    slowlog = SlowLog(
        url, pair.redis_backend._apply_script.sha, pair.redis_backend._query_script.sha
    )
    history, recent = History(rng, digest), deque(maxlen=30)
    counts = {"batches": 0, "crashes": 0, "divergences": 0, "steps": 0}
    reports: list[str] = []
    started = time.monotonic()
    try:
        while counts["batches"] < args.batches:
            step = history.step()
            recent.append(step)
            counts["steps"] += 1
            counts["batches"] += step["action"] == "submit"
            try:
                alike = pair.run(history, step)
                if alike and counts["steps"] % args.check_every == 0:
                    alike = pair.same_state(history, rng)
                problem = None if alike else "divergence"
            except Exception:
                problem, alike = "crash", False
                reports.append(traceback.format_exc())
            if problem is not None:
                counts["crashes" if problem == "crash" else "divergences"] += 1
                if len(reports) < 5:
                    reports.append(f"{problem} after: " + "\n".join(map(repr, recent)))
                if args.stop:
                    break
            if problem is not None or counts["steps"] % args.fresh_every == 0:
                pair.close()
                pair, history = Pair(layout, url), History(rng, digest)
            if counts["steps"] % 2000 == 0:
                slowlog.read()
                rate = counts["batches"] / (time.monotonic() - started)
                print(
                    f"{counts['batches']:,} batches, {counts['crashes']} crashes, "
                    f"{counts['divergences']} divergences, {rate:,.0f} batches/s",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        pair.close()
        slowlog.close()
    return {
        **counts,
        "seed": seed,
        "hash": hash_algorithm,
        "wall_s": round(time.monotonic() - started, 1),
        "longest_apply_ms": slowlog.longest["apply"] / 1000,
        "longest_query_ms": slowlog.longest["query"] / 1000,
        "apply_calls_over_100_ms": slowlog.over_100_ms,
        "first_reports": reports[:5],
    }


def summary(result: dict[str, Any]) -> str:
    """One fuzz run's counts and longest Redis calls, as printed."""
    return (
        f"{result['batches']:,} batches ({result['hash']} hashes, seed {result['seed']}) in "
        f"{result['wall_s']:,.0f} s: {result['crashes']} crashes, {result['divergences']} "
        f"divergences; longest Redis call: {result['longest_apply_ms']:.1f} ms for a batch "
        f"({result['apply_calls_over_100_ms']} over 100 ms), {result['longest_query_ms']:.1f} ms "
        "for a query"
    )


def record(recorder: Recorder, runs: list[dict[str, Any]], largest: list[dict[str, float]]) -> None:
    """The record's figures and table, from every fuzz run and round of the largest batches.

    ``fuzz.*``: over all runs, ``batches``, ``crashes``, ``divergences``,
    ``longest-batch`` and ``longest-query`` (the longest Redis call of each
    kind, ms), ``over-100-ms`` (batch calls that long). ``largest.stores``
    and ``largest.removals-and-stores``: the range of the Redis time of that
    batch over every round and both kinds of hash (ms); the table
    ``largest`` gives each kind's range.
    """
    totals = {key: sum(r[key] for r in runs) for key in ("batches", "crashes", "divergences")}
    for key, value in totals.items():
        recorder.figure(f"fuzz.{key}", f"{value:,}")
    recorder.figure("fuzz.runs", f"{len(runs):,}")
    recorder.figure("fuzz.longest-batch", f"{max(r['longest_apply_ms'] for r in runs):.1f} ms")
    recorder.figure("fuzz.longest-query", f"{max(r['longest_query_ms'] for r in runs):.1f} ms")
    recorder.figure("fuzz.over-100-ms", f"{sum(r['apply_calls_over_100_ms'] for r in runs):,}")
    rows = []
    for marker, key in LARGEST.items():
        times = [ms for rnd in largest for what, ms in rnd.items() if marker in what]
        recorder.figure(f"largest.{key}", span(min(times), max(times), "{:.0f}", " ms"))
        for what in (w for w in largest[0] if marker in w):
            hashes, batch = what.split(": ", 1)
            one = [rnd[what] for rnd in largest]
            rows.append([batch, hashes, span(min(one), max(one), "{:.1f}", " ms")])
    recorder.tables["largest"] = table(
        f"Redis time of the largest batches, {len(largest)} rounds",
        ["batch (16,384 hashes)", "hashes", "Redis time"],
        rows,
    )
    recorder.data.update(runs=runs, largest_batches_ms=largest)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--batches",
        type=positive_int,
        default=1_000_000,
        help="batches per run (one run per --hash)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the first run's seed (then +1)")
    parser.add_argument(
        "--hash",
        choices=HASHES,
        nargs="+",
        default=["fast"],
        help="one run per hash, one after the other",
    )
    parser.add_argument(
        "--largest-rounds",
        type=positive_int,
        default=4,
        metavar="N",
        help="rounds of the largest batches (each: both kinds of hash)",
    )
    parser.add_argument("--redis", metavar="URL")
    parser.add_argument("--check-every", type=positive_int, default=10, metavar="STEPS")
    parser.add_argument("--fresh-every", type=positive_int, default=5_000, metavar="STEPS")
    parser.add_argument("--stop", action="store_true", help="stop at the first problem")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--record", action="store_true", help=f"write benchmarks/results/{RECORD}.json"
    )
    args = parser.parse_args(argv)
    # Refusals are the point here: the index's warnings about them are not news.
    logging.getLogger("kvcore.cluster").setLevel(logging.ERROR)
    # main(argv) from a test records argv, not the test runner's command line.
    ran = command_line([__file__, *(sys.argv[1:] if argv is None else argv)])
    recorder = Recorder(RECORD, enabled=args.record, command=ran)
    process = None
    url = args.redis
    if url is None:
        url, process = start_redis()
    try:
        runs = [run(args, url, args.seed + i, name) for i, name in enumerate(args.hash)]
        largest = [largest_batches(url) for _ in range(args.largest_rounds)]
    finally:
        if process is not None:
            process.kill()
            process.wait()
    for report in (r for one in runs for r in one["first_reports"]):
        print(report, file=sys.stderr)
    with recorder.section("summary"):
        for one in runs:
            print(summary(one))
        for index, rnd in enumerate(largest):
            for what, ms in rnd.items():
                print(f"  largest batch, round {index + 1}, {what}: {ms:.1f} ms of Redis time")
        print_load()
    record(recorder, runs, largest)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"runs": runs, "largest_batches_ms": largest}, handle, indent=2)
    recorder.write()
    return 0 if all(r["crashes"] == r["divergences"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
