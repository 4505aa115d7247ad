"""A continuous-batching scheduler that drives a :class:`~kvcore.KVCacheManager` like an engine.

Each step, as the reference engine's scheduler does (after announcing the
step with :meth:`~kvcore.KVCacheManager.new_step_starts`, so a Mamba state
cached in a step is not adopted before that step has run):

1. **Running requests first**, in order: each asks for its remaining
   tokens (a prefill chunk, or one decode token), capped by what is left
   of the step's token budget. ``allocate_slots(request, n)`` either gives
   slots or says no; on no, the *last* running request is preempted (its
   blocks freed, its computed tokens reset to 0, put at the front of the
   waiting queue) and the allocation retried, until it succeeds or the
   request preempted itself.
2. **Waiting requests**, first come first served, only if nothing was
   preempted this step and while there is budget and fewer than
   ``max_num_seqs`` running: ``get_computed_blocks`` finds the cached
   prefix, then ``allocate_slots(request, n, num_hit, hit_blocks)`` adopts
   the hit and allocates the first chunk (``n`` = uncached tokens, capped by
   the budget). If it says no, admission stops for this step (no request
   overtakes the head of the queue).
3. **The step runs**: every scheduled request's computed tokens advance by
   what it was given. A request whose computed tokens reach its length
   samples one output token (a new token id, unique in the run); a request
   that has all its output tokens is freed.

A preempted request is recomputed when it is admitted again, prompt and
output so far; its lookup usually finds its own blocks still cached.

Time: arrivals by timestamp advance a simulated clock by a linear step cost
(``step_ms`` + ``token_us`` per scheduled token); the clock jumps to the next
arrival when the engine is idle. With ``arrival="asap"`` every request is
waiting from the start (the clock still advances, for the time axis).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import attrs

from kvcore._kv_cache_manager import KVCacheManager
from kvcore._request import Request
from kvcore._sim.metrics import (
    OP_KINDS,
    OpTimes,
    Sample,
    Sampler,
    first_interval,
    timer_overhead_ns,
)
from kvcore._trace import TraceRequest
from kvcore._two_level_pool import TwoLevelBlockPool
from kvcore.errors import InvalidConfigError

__all__ = ["ARRIVAL_MODES", "SchedulerConfig", "SimRequest", "Scheduler", "UnservableRequestError"]

#: How requests enter the waiting queue.
ARRIVAL_MODES = ("timestamp", "asap")

_LOOKUP, _ADMIT, _PREFILL, _DECODE, _FREE, _PREEMPT = range(len(OP_KINDS))


class UnservableRequestError(InvalidConfigError):
    """A request cannot be scheduled even with the whole pool free."""


def _positive_int(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or value < 1:
        msg = f"{attribute.name} must be a positive integer, got {value!r}"
        raise InvalidConfigError(msg)


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 <= value < float("inf")
    ):
        msg = f"{attribute.name} must be a finite number >= 0, got {value!r}"
        raise InvalidConfigError(msg)


def _arrival_mode(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in ARRIVAL_MODES:
        msg = f"arrival must be one of {', '.join(ARRIVAL_MODES)}, got {value!r}"
        raise InvalidConfigError(msg)


_T = TypeVar("_T")


class _Step:
    """What one scheduling step has decided so far."""

    __slots__ = (
        "budget",
        "has_prefill",
        "manager_ns",
        "num_tokens",
        "only_decodes",
        "preempted",
        "scheduled",
    )

    def __init__(self, budget: int) -> None:
        self.budget = budget  # tokens still schedulable
        self.scheduled: list[tuple[SimRequest, int]] = []
        self.manager_ns = 0
        self.preempted = False
        # Every scheduled request decoded one token (no admission, no prefill chunk).
        self.only_decodes = True
        self.num_tokens = 0
        self.has_prefill = False

    def schedule(self, entry: SimRequest, num_new: int) -> None:
        self.scheduled.append((entry, num_new))
        self.budget -= num_new


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """Scheduler limits and the simulated step cost.

    Attributes:
        max_num_batched_tokens: Token budget of one step (prefill chunks plus
            decode tokens).
        max_num_seqs: Most requests running at once.
        arrival: ``"timestamp"`` (requests arrive at their trace time) or
            ``"asap"`` (all waiting from the start).
        step_ms: Simulated fixed cost of a step, in milliseconds.
        token_us: Simulated cost per scheduled token, in microseconds.
    """

    max_num_batched_tokens: int = attrs.field(default=8192, validator=_positive_int)
    max_num_seqs: int = attrs.field(default=256, validator=_positive_int)
    arrival: str = attrs.field(default="timestamp", validator=_arrival_mode)
    step_ms: float = attrs.field(default=5.0, validator=_non_negative)
    token_us: float = attrs.field(default=20.0, validator=_non_negative)


class SimRequest:
    """A workload request as the scheduler tracks it.

    Attributes:
        trace: The workload entry.
        request: The kvcore request (created when first considered for
            admission, dropped when finished so its tokens can be freed).
        output_target: Output tokens to produce (capped by ``max_model_len``).
        num_output: Output tokens produced so far.
        first_hit: Cache-hit tokens at its first admission (``None`` before).
        finished: Whether it has finished and been freed.
        index: Position in the workload's arrival order.
    """

    __slots__ = (
        "finished",
        "first_hit",
        "index",
        "num_output",
        "output_target",
        "request",
        "trace",
    )

    def __init__(self, trace: TraceRequest, output_target: int, index: int = 0) -> None:
        self.trace = trace
        self.index = index
        self.request: Request | None = None
        self.output_target = output_target
        self.num_output = 0
        self.first_hit: int | None = None
        self.finished = False


def held_per_group(
    tables: Sequence[Mapping[str, Sequence[int]]], used: int | None = None
) -> tuple[int, ...]:
    """Distinct blocks (null block not counted) in each group's block tables.

    Args:
        tables: Per group, the block table of each request.
        used: The shared pool's blocks in use, when every one of them is in
            exactly one group's tables (a shared pool, between steps). The
            group with the longest tables is then counted as ``used`` minus
            the others, without a set of its blocks: the cost of a sample
            is that of the small groups (a sliding window's few blocks per
            request beside full attention's hundreds).
    """
    lengths = [sum(len(table) for table in group.values()) for group in tables]
    derived = lengths.index(max(lengths)) if used is not None and lengths else None
    counts = []
    for index, group in enumerate(tables):
        if index == derived:
            counts.append(0)
            continue
        held: set[int] = set()
        for table in group.values():
            held.update(table)
        held.discard(0)
        counts.append(len(held))
    if derived is not None and used is not None:
        counts[derived] = used - sum(counts)
    return tuple(counts)


class Scheduler:
    """Runs a workload through a manager step by step and records what happened.

    Args:
        manager: The KV cache manager to drive (fresh, no request allocated).
        config: Scheduler limits and step cost.
        requests: The requests to serve, in arrival order, each with a prompt
            and output that fit ``manager.max_model_len``.
        sample_capacity: Most usage samples kept (see :class:`Sampler`).
        on_step: Called with every step's ``(request, tokens scheduled)``
            pairs after the step's allocations and before it runs (how
            ``--execute`` computes each step).
        on_lookup: Called with each waiting request just before its cache
            lookup (the offline oracle follows the replay through it).
    """

    def __init__(
        self,
        manager: KVCacheManager,
        config: SchedulerConfig,
        requests: Sequence[SimRequest],
        *,
        sample_capacity: int = 512,
        on_step: Callable[[Sequence[tuple[Request, int]]], None] | None = None,
        on_lookup: Callable[[SimRequest], None] | None = None,
    ) -> None:
        self.manager = manager
        self.on_step = on_step
        self.on_lookup = on_lookup
        self.config = config
        self.requests = requests
        self.pending: deque[SimRequest] = deque(requests)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.clock_ms = 0.0
        self.step_count = 0
        self.num_finished = 0
        self.op_times = [OpTimes() for _ in OP_KINDS]
        self._durations = [times.durations for times in self.op_times]
        self.step_manager_ns: list[int] = []
        self.sampler = Sampler(
            sample_capacity, first_interval(self._min_steps(requests, config), sample_capacity)
        )
        self.timer_overhead_ns = timer_overhead_ns()
        # Preemption accounting.
        self.num_preemptions = 0
        self.preempted_ids: set[str] = set()
        self.lost_tokens = 0  # computed tokens thrown away by preemptions
        self.resume_hit_tokens = 0  # of those, found again in the cache on resume
        # First-admission hits, in prompt tokens.
        self.hit_tokens = 0
        self.prompt_tokens = 0
        # Exact per-step pool use and load. A two-level pool counts large
        # pages: one is used while any of its small pages is in use.
        pool = manager.block_pool
        self._pool = pool
        self.usable_blocks = pool.num_blocks - 1
        self.peak_used_blocks = 0
        self.sum_used_blocks = 0
        # The memory held by blocks in use, as a share of the pool (small
        # pages by their size in a two-level pool; used / usable otherwise).
        self.peak_memory_usage = 0.0
        self.sum_memory_usage = 0.0
        self.sum_running = 0
        self.peak_running = 0
        self.prefill_steps = 0
        # Steps in which every scheduled request decoded one token (no
        # admission, no prefill chunk), and the manager time they took.
        self.decode_steps = 0
        self.decode_step_ns = 0
        self.scheduled_tokens = 0
        self._next_token = -1
        if config.arrival == "asap":
            self.waiting.extend(self.pending)
            self.pending.clear()

    @staticmethod
    def _min_steps(requests: Sequence[SimRequest], config: SchedulerConfig) -> int:
        """Steps the run takes at least.

        A request samples at most one token per step it is in, and a step
        holds at most ``max_num_seqs`` requests.
        """
        return sum(entry.output_target for entry in requests) // config.max_num_seqs

    # -- one step ---------------------------------------------------------------------

    def _admit_arrivals(self) -> None:
        pending = self.pending
        if not pending:
            return
        if not self.running and not self.waiting and pending[0].trace.arrival_ms > self.clock_ms:
            self.clock_ms = pending[0].trace.arrival_ms  # idle: jump to the next arrival
        clock_ms = self.clock_ms
        waiting = self.waiting
        while pending and pending[0].trace.arrival_ms <= clock_ms:
            waiting.append(pending.popleft())

    def step(self) -> None:
        """Schedule and run one step.

        Raises:
            UnservableRequestError: the head of the queue cannot be admitted
                although no request is running (the pool is too small for it).
        """
        self._admit_arrivals()
        self.manager.new_step_starts()
        step = _Step(self.config.max_num_batched_tokens)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        if not step.scheduled:
            # After a self-preemption the next step retries with the pool to itself.
            if self.waiting and not self.running and not step.preempted:
                raise self._unservable(self.waiting[0])
            return
        if self.on_step is not None:
            self.on_step([(e.request, n) for e, n in step.scheduled if e.request is not None])
        self._run(step)
        self._account(step)

    def _timed(self, kind: int, step: _Step, call: Callable[..., _T], *arguments: Any) -> _T:
        """``call(*arguments)``, its time (less the clock's) counted for ``kind`` and ``step``."""
        clock = time.perf_counter_ns
        start = clock()
        result = call(*arguments)
        elapsed = clock() - start - self.timer_overhead_ns
        self.op_times[kind].durations.append(elapsed)
        step.manager_ns += elapsed
        return result

    def _schedule_running(self, step: _Step) -> None:
        """Give every running request its next tokens, preempting the newest when full.

        The loop runs once per running request per step (millions of times
        in a long replay), so it times the allocation inline rather than
        through :meth:`_timed`; the measured interval is the same.
        """
        running = self.running
        allocate = self.manager.allocate_slots
        clock = time.perf_counter_ns
        overhead = self.timer_overhead_ns
        durations = self._durations
        scheduled = step.scheduled
        budget = step.budget
        manager_ns = 0
        only_decodes = True
        # A preemption pops the list's tail: the loop then ends sooner.
        for entry in running:
            if budget <= 0:
                break
            request = entry.request
            assert request is not None
            num_new = request.num_tokens - request.num_computed_tokens
            kind = _DECODE if num_new == 1 and entry.num_output else _PREFILL
            only_decodes = only_decodes and kind == _DECODE
            if num_new > budget:  # not min(): see the note in kvcore.managers
                num_new = budget
            start = clock()
            blocks = allocate(request, num_new)
            elapsed = clock() - start - overhead
            durations[kind].append(elapsed)
            manager_ns += elapsed
            if blocks is None:
                step.manager_ns += manager_ns
                manager_ns = 0
                if not self._preempt_until_fits(step, entry, kind, num_new):
                    break
            scheduled.append((entry, num_new))
            budget -= num_new
        step.budget = budget
        step.manager_ns += manager_ns
        step.only_decodes = only_decodes

    def _preempt_until_fits(self, step: _Step, entry: SimRequest, kind: int, num_new: int) -> bool:
        """Preempt the newest running requests until ``entry`` gets its slots.

        Returns False if ``entry`` had to preempt itself (it is then waiting).
        """
        running = self.running
        request = entry.request
        assert request is not None
        while True:
            victim = running.pop()
            step.manager_ns += self._preempt(victim, self.op_times[_PREEMPT].durations)
            step.preempted = True
            if victim is entry:
                return False
            if self._timed(kind, step, self.manager.allocate_slots, request, num_new) is not None:
                return True

    def _schedule_waiting(self, step: _Step) -> None:
        """Admit waiting requests, head first, while they fit the budget and the pool."""
        manager = self.manager
        waiting = self.waiting
        while waiting and step.budget > 0 and len(self.running) < self.config.max_num_seqs:
            entry = waiting[0]
            request = entry.request
            if request is None:
                trace = entry.trace
                request = entry.request = Request(trace.request_id, trace.prompt_token_ids)
            if self.on_lookup is not None:
                self.on_lookup(entry)
            hit_blocks, num_hit = self._timed(_LOOKUP, step, manager.get_computed_blocks, request)
            num_new = request.num_tokens - num_hit
            if num_new > step.budget:
                num_new = step.budget
            blocks = self._timed(
                _ADMIT, step, manager.allocate_slots, request, num_new, num_hit, hit_blocks
            )
            if blocks is None:
                return
            waiting.popleft()
            self.running.append(entry)
            step.only_decodes = False
            request.num_computed_tokens = num_hit
            self._count_hit(entry, request, num_hit)
            step.schedule(entry, num_new)

    def _count_hit(self, entry: SimRequest, request: Request, num_hit: int) -> None:
        if entry.first_hit is None:
            entry.first_hit = num_hit
            self.hit_tokens += num_hit
            self.prompt_tokens += request.num_tokens
        else:
            self.resume_hit_tokens += num_hit

    def _unservable(self, head: SimRequest) -> UnservableRequestError:
        msg = (
            f"request {head.trace.request_id!r} ({head.trace.input_length} prompt "
            f"tokens) cannot be admitted even with every block free "
            f"({self.usable_blocks} {self.pool_unit}); raise --memory or lower --max-model-len"
        )
        return UnservableRequestError(msg)

    def _run(self, step: _Step) -> None:
        """Run the step: advance computed tokens, sample, free the finished requests."""
        finished: list[SimRequest] = []
        num_tokens = 0
        has_prefill = False
        next_token = self._next_token
        for entry, num_new in step.scheduled:
            request = entry.request
            assert request is not None
            num_tokens += num_new
            has_prefill = has_prefill or num_new > 1
            computed = request.num_computed_tokens + num_new
            request.num_computed_tokens = computed
            if computed < request.num_tokens:
                continue  # a prefill chunk that does not reach the end yet
            if entry.num_output < entry.output_target:
                request.append_output_token_ids(next_token)
                next_token -= 1
                entry.num_output += 1
            if entry.num_output >= entry.output_target:
                finished.append(entry)
        self._next_token = next_token
        step.num_tokens = num_tokens
        step.has_prefill = has_prefill
        if finished:
            self._finish(step, finished)

    def _finish(self, step: _Step, finished: list[SimRequest]) -> None:
        """Free the finished requests and drop them from the running list."""
        free = self.manager.free
        for entry in finished:
            self._timed(_FREE, step, free, entry.request)
            entry.finished = True
            entry.request = None
        self.running = [e for e in self.running if not e.finished]
        self.num_finished += len(finished)

    def _account(self, step: _Step) -> None:
        """Count the step: its manager time, tokens, clock, and the pool's use."""
        self.step_count += 1
        self.step_manager_ns.append(step.manager_ns)
        if step.only_decodes:
            self.decode_steps += 1
            self.decode_step_ns += step.manager_ns
        self.scheduled_tokens += step.num_tokens
        self.prefill_steps += step.has_prefill
        config = self.config
        self.clock_ms += config.step_ms + step.num_tokens * config.token_us / 1000.0
        used = self.usable_blocks - self._pool.get_num_free_blocks()
        self.sum_used_blocks += used
        self.peak_used_blocks = max(self.peak_used_blocks, used)
        memory = self._pool.get_usage()
        self.sum_memory_usage += memory
        self.peak_memory_usage = max(self.peak_memory_usage, memory)
        running = len(self.running)
        self.sum_running += running
        self.peak_running = max(self.peak_running, running)
        if self.sampler.wants(self.step_count):
            self.sampler.add(self._sample(used))

    def _preempt(self, victim: SimRequest, durations: object) -> int:
        request = victim.request
        assert request is not None
        clock = time.perf_counter_ns
        start = clock()
        self.manager.free(request)
        elapsed = clock() - start - self.timer_overhead_ns
        durations.append(elapsed)  # type: ignore[attr-defined]
        self.lost_tokens += request.num_computed_tokens
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.preempted_ids.add(request.request_id)
        self.waiting.appendleft(victim)
        return elapsed

    def _sample(self, used: int) -> Sample:
        pool = self._pool
        pages = pool.pages if isinstance(pool, TwoLevelBlockPool) else None
        tables = [manager.req_to_blocks for manager in self.manager.coordinator.managers]
        return Sample(
            step=self.step_count,
            time_s=self.clock_ms / 1000.0,
            used_blocks=used,
            group_blocks=held_per_group(tables, None if pages is not None else used),
            class_pages=tuple(pages.owned) if pages is not None else (),
            running=len(self.running),
            waiting=len(self.waiting),
            hit_rate=self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
        )

    @property
    def pool_unit(self) -> str:
        """What :attr:`usable_blocks` counts: ``"blocks"``, or ``"large pages"`` (two-level)."""
        return "large pages" if isinstance(self._pool, TwoLevelBlockPool) else "blocks"

    # -- the whole run ----------------------------------------------------------------

    @property
    def done(self) -> bool:
        """Whether every request has finished."""
        return not (self.pending or self.waiting or self.running)

    def run(self, progress: Callable[[Scheduler], None] | None = None) -> None:
        """Step until every request has finished.

        Args:
            progress: Called about every 0.2 s of wall time with the scheduler.
        """
        step = self.step
        if progress is None:
            while not self.done:
                step()
            return
        next_report = time.monotonic()
        while not self.done:
            step()
            if self.step_count & 63 == 0 and time.monotonic() >= next_report:
                progress(self)
                next_report = time.monotonic() + 0.2
        progress(self)
