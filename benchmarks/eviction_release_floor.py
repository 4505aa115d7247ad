"""How cheap can a value policy's free be in Python? Its release loop against the floor.

A finished request's free is where the built-in policies lose the most time to
LRU (docs/explanation/eviction.rst). This replays the built-in workload
(gpt-oss-20b, 8 GiB) under one policy and, for every block table the credit
queues release, times one of the loops below on that same table, first (so it
meets the caches the way the real release does). Each variant is its own
replay and every replay takes the same decisions: a variant other than
``release`` writes only to arrays of its own, puts the counts back (untimed)
and lets the real release run after it (untimed).

``lru``
    LRU's own release of the table (``LRUFreeQueue.release_table`` on a
    queue of its own): count the blocks down, append the freed ones with one
    list extend.
``release``
    The credit queues' release (what the policy runs).
``classify``
    Count the blocks down, read each freed block's class from its state byte
    (a run of one class goes without dispatch, as in the real loop) and
    record the class: the least per-block work the built-in policies' rules
    need, with no queue at all. A queue could add to it as little as a list
    extend per run of one class, if a revived block's entry were left in its
    list and counted as stale, as LRU's queue does.

Prints microseconds per released table and the ratio to ``lru``. Run::

    python benchmarks/eviction_release_floor.py                 # frequency
    python benchmarks/eviction_release_floor.py --policy cost --rounds 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Hashable, Mapping, Sequence

from _common import positive_int
from _record import Recorder, ratio
from bench_eviction import BUILTIN_MAX_MODEL_LEN, BUILTIN_MODEL, replay_options

from kvcore._eviction import credit
from kvcore._eviction.credit import JOIN, CreditQueues
from kvcore._free_queue import LRUFreeQueue
from kvcore._sim import SimulationReport, load_workload, simulate

VARIANTS = ("lru", "release", "classify")


class Shadow:
    """The class array a floor loop writes instead of the policy's, sized on first use."""

    def __init__(self) -> None:
        self.klass = bytearray()
        self.lru: LRUFreeQueue | None = None

    def ensure(self, num_blocks: int) -> None:
        if len(self.klass) != num_blocks:
            self.klass = bytearray(num_blocks)
            self.lru = LRUFreeQueue(num_blocks)


def _classify(
    klass_of: bytearray,
    ref: list[int],
    table: Sequence[int],
    classes: bytes | bytearray,
    state: bytes | bytearray,
) -> None:
    """Count ``table`` down, last block first, and classify the freed blocks in runs."""
    remaining = reversed(table)
    block: int | None = next(remaining)
    while block is not None:
        count = ref[block] - 1
        ref[block] = count
        if count:
            block = next(remaining, None)
            continue
        entry = classes[state[block]]
        klass = entry % JOIN
        klass_of[block] = klass
        for block in remaining:
            if ref[block] != 1 or classes[state[block]] != entry:
                break
            ref[block] = 0
            klass_of[block] = klass
        else:
            block = None


def install(variant: str, shadow: Shadow, durations: list[int]) -> None:
    """Time ``variant`` on every table the credit queues release (see the module doc)."""
    real = CreditQueues.release_table
    clock = time.perf_counter_ns

    def timed_release(
        self: CreditQueues,
        ref: list[int],
        table: Sequence[int],
        classes: bytes | bytearray,
        state: bytes | bytearray,
        hash_of: Sequence[Hashable | None] = (),
        join_maps: Sequence[Mapping[Hashable, int]] = (),
    ) -> list[int]:
        if variant == "release":
            start = clock()
            released = real(self, ref, table, classes, state, hash_of, join_maps)
            durations.append(clock() - start)
            return released
        shadow.ensure(len(self._class))
        if variant == "lru":
            assert shadow.lru is not None
            start = clock()
            shadow.lru.release_table(ref, table)
            durations.append(clock() - start)
        else:
            start = clock()
            _classify(shadow.klass, ref, table, classes, state)
            durations.append(clock() - start)
        # Every block of the table was counted down once: put the counts back.
        for block in table:
            ref[block] += 1
        return real(self, ref, table, classes, state, hash_of, join_maps)

    credit.CreditQueues.release_table = timed_release  # type: ignore[method-assign]


def replay(
    variant: str, policy: str, memory: str, limit: int, max_model_len: int = BUILTIN_MAX_MODEL_LEN
) -> tuple[list[int], SimulationReport]:
    """One replay of the built-in workload timing ``variant``: the durations (ns) and its report."""
    durations: list[int] = []
    original = CreditQueues.release_table
    install(variant, Shadow(), durations)
    try:
        report = simulate(
            load_workload(None, limit=limit),
            replay_options(BUILTIN_MODEL, memory, max_model_len, policy),
        )
    finally:
        credit.CreditQueues.release_table = original  # type: ignore[method-assign]
    return durations, report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--policy",
        default="frequency",
        choices=("admit", "frequency", "cost"),
        help="a policy of the credit queues (default frequency)",
    )
    parser.add_argument("--memory", default="8GiB")
    parser.add_argument(
        "--limit", type=positive_int, default=2000, help="built-in workload requests"
    )
    parser.add_argument("--rounds", type=positive_int, default=2, help="replays per variant")
    parser.add_argument("--record", action="store_true",
                        help="write benchmarks/results/eviction-release-floor-POLICY.json")
    args = parser.parse_args(argv)
    recorder = Recorder(f"eviction-release-floor-{args.policy}", enabled=args.record)
    means: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    calls: dict[str, int] = {}
    for _ in range(args.rounds):
        for variant in VARIANTS:
            durations, _ = replay(variant, args.policy, args.memory, args.limit)
            means[variant].append(sum(durations) / len(durations) / 1e3)
            calls[variant] = len(durations)
    lru = statistics.median(means["lru"])
    print(f"{args.policy}, built-in workload ({args.limit} requests), {args.memory}")
    print(f"{'variant':10} {'tables':>7} {'us/table':>9} {'x lru':>6}")
    for variant in VARIANTS:
        mean = statistics.median(means[variant])
        print(f"{variant:10} {calls[variant]:7} {mean:9.2f} {mean / lru:6.2f}")
        recorder.figure(f"{variant}.us", f"{mean:.2f} µs")
        recorder.figure(f"{variant}.ratio", ratio(mean / lru))
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
