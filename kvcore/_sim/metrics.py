"""What a simulation measures: manager time per operation and per step, usage over time.

Manager time is the wall-clock time spent inside :class:`~kvcore.KVCacheManager`
calls, measured around each call with ``time.perf_counter_ns`` minus the
timer's own cost (calibrated at start). The simulator is single-threaded, so
this is the CPU time the manager would cost an engine's scheduler; everything
else (the simulator's queues, token lists, sampling) is counted apart as
simulator overhead.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

__all__ = [
    "OP_KINDS",
    "OpSummary",
    "OpTimes",
    "Sample",
    "Sampler",
    "first_interval",
    "percentile",
    "timer_overhead_ns",
]

#: Manager operations timed separately, in report order.
OP_KINDS = ("lookup", "admit", "prefill", "decode", "free", "preempt")


def timer_overhead_ns(rounds: int = 2001) -> int:
    """The median cost of an empty ``perf_counter_ns`` interval, in nanoseconds."""
    clock = time.perf_counter_ns
    gaps = []
    for _ in range(rounds):
        start = clock()
        gaps.append(clock() - start)
    gaps.sort()
    return gaps[len(gaps) // 2]


def first_interval(min_steps: int, capacity: int) -> int:
    """The largest power of two ``i`` with ``i × capacity <= min_steps`` (at least 1).

    A :class:`Sampler` started at that interval, in a run known to take at
    least ``min_steps`` steps, keeps the same samples as one started at 1.
    """
    interval = 1
    while 2 * interval * capacity <= min_steps:
        interval *= 2
    return interval


def percentile(
    sorted_values: Sequence[int] | Sequence[float] | NDArray[np.int64], fraction: float
) -> float:
    """The ``fraction`` quantile (nearest rank) of already sorted values; 0.0 if empty."""
    if not len(sorted_values):
        return 0.0
    rank = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return float(sorted_values[rank])


@attrs.frozen(kw_only=True)
class OpSummary:
    """Durations of one kind of manager call.

    Attributes:
        count: Calls.
        total_ms: Their total, in milliseconds.
        mean_us: Mean, in microseconds.
        p50_us: Median, in microseconds.
        p99_us: 99th percentile, in microseconds.
    """

    count: int
    total_ms: float
    mean_us: float
    p50_us: float
    p99_us: float


class OpTimes:
    """Durations of one kind of manager operation, in nanoseconds."""

    __slots__ = ("durations",)

    def __init__(self) -> None:
        self.durations = array("q")

    def summary(self) -> OpSummary:
        """Count, total (ms) and mean / p50 / p99 (µs)."""
        # numpy sorts the machine integers in place: a long replay times some
        # 4 M decode calls, and sorted() would make an int object of each.
        import numpy as np

        values = np.sort(np.frombuffer(self.durations, dtype=np.int64))
        count = len(values)
        total = int(values.sum())
        return OpSummary(
            count=count,
            total_ms=total / 1e6,
            mean_us=total / count / 1e3 if count else 0.0,
            p50_us=percentile(values, 0.50) / 1e3,
            p99_us=percentile(values, 0.99) / 1e3,
        )


@attrs.frozen
class Sample:
    """The state of the simulation after one step.

    Attributes:
        step: Step number (1-based).
        time_s: Simulated time at the end of the step, in seconds.
        used_blocks: Blocks held by requests, over the whole pool (in a
            two-level pool: large pages with a small page in use).
        group_blocks: Distinct blocks held by requests, per KV cache group
            (small pages of the group's class in a two-level pool).
        running: Running requests.
        waiting: Arrived requests waiting for admission.
        hit_rate: Prompt tokens hit / prompt tokens, over first admissions so far.
        class_pages: Large pages each page class owns, by class (a two-level
            pool; empty for a shared pool).
    """

    step: int
    time_s: float
    used_blocks: int
    group_blocks: tuple[int, ...]
    running: int
    waiting: int
    hit_rate: float
    class_pages: tuple[int, ...] = ()


class Sampler:
    """Keeps at most ``capacity`` evenly spaced samples of a run of unknown length.

    Sampling every step would cost more than the step for large pools (counting
    distinct blocks per group walks every block table), so a sample is taken
    every ``interval`` steps; when the buffer is full, every other sample is
    dropped and the interval doubles. The samples stay evenly spaced and the
    total cost is O(capacity × log(steps / interval)).

    Args:
        capacity: Most samples kept.
        interval: The first interval, a power of two. A run of at least
            ``interval × capacity`` steps keeps exactly the samples it would
            keep from an interval of 1, without taking the ones dropped on
            the way (see :func:`first_interval`).
    """

    __slots__ = ("capacity", "interval", "samples")

    def __init__(self, capacity: int = 512, interval: int = 1) -> None:
        if interval < 1 or interval & (interval - 1):
            msg = f"interval must be a power of two, got {interval}"
            raise ValueError(msg)
        self.capacity = capacity
        self.interval = interval
        self.samples: list[Sample] = []

    def wants(self, step: int) -> bool:
        """Whether a sample should be taken after ``step``."""
        return step % self.interval == 0

    def add(self, sample: Sample) -> None:
        """Record a sample, thinning the buffer when it is full."""
        self.samples.append(sample)
        if len(self.samples) >= self.capacity:
            self.samples = [s for s in self.samples if s.step % (2 * self.interval) == 0]
            self.interval *= 2
