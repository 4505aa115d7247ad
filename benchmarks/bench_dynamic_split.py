"""The two-level pool's dynamic split against static splits, on a workload whose mix shifts.

A two-level pool moves memory between its page classes a large page at a
time, as the requests need it. A static split (each class confined to a
fixed number of large pages, as pools sized once at start-up are) must be
chosen in advance. This script replays one workload in three phases, short
prompts, then long ones, then short again (built-in generator requests split
by prompt length, each phase's requests all waiting from the start, phases
in order), under the two-level pool and under every static split of a sweep
(:meth:`TwoLevelBlockPool.limit_classes`), and counts preemptions per phase
(a preemption belongs to the phase of the request preempted).

For each phase it reports the best static split chosen with hindsight for
that phase alone (the fewest preemptions in it) and the two-level pool's
preemptions against it, with the simulated time each took to serve the
phase (from its first scheduled request to its last finished one), and the
best static split among those no slower than the two-level pool there: a
split can avoid preemptions by holding fewer requests at once, and then
takes longer. A split under which some request never fits is left out.

Run::

    python benchmarks/bench_dynamic_split.py            # qwen3-next-80b, 8 GiB
    python benchmarks/bench_dynamic_split.py --record   # writes the docs' record
    python benchmarks/bench_dynamic_split.py --max-num-seqs 32 --record
        # every pool at most 32 requests at once: bench-dynamic-split-32-running.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from _common import positive_int, print_load
from _record import Recorder, percent, table

import kvcore
from kvcore._kv_cache_manager import KVCacheManager
from kvcore._sim.generator import GeneratorConfig, generate_workload
from kvcore._sim.scheduler import (
    Scheduler,
    SchedulerConfig,
    SimRequest,
    UnservableRequestError,
)
from kvcore._trace import TraceRequest
from kvcore._two_level_pool import TwoLevelBlockPool

PHASES = ("short", "long", "short again")
#: The simulator's cap on running requests; a record made under another cap names it.
DEFAULT_MAX_NUM_SEQS = SchedulerConfig().max_num_seqs


def phased_workload(
    num_short: int, num_long: int, short_below: int, long_from: int, seed: int
) -> list[tuple[str, TraceRequest]]:
    """``(phase, request)``: short prompts, long ones, then other short ones, in that order.

    The requests are the built-in generator's (so conversations share
    prefixes), kept in arrival order within a phase.
    """
    generated = generate_workload(GeneratorConfig(num_requests=20_000, seed=seed))
    short = [r for r in generated if r.input_length < short_below]
    long = [r for r in generated if r.input_length >= long_from]
    if len(short) < 2 * num_short or len(long) < num_long:
        msg = f"the generator gave {len(short)} short and {len(long)} long prompts: ask for fewer"
        raise SystemExit(msg)
    phases = (short[:num_short], long[:num_long], short[num_short : 2 * num_short])
    return [(name, r) for name, requests in zip(PHASES, phases, strict=True) for r in requests]


class _PhaseScheduler(Scheduler):
    """The simulator's scheduler, counting per phase preemptions and when its last request ended.

    A preemption counts in the phase of the request preempted; the clock is
    the simulated one (the step cost of :class:`SchedulerConfig`).
    """

    def __init__(self, *arguments: Any, phase_of: Sequence[str], **options: Any) -> None:
        super().__init__(*arguments, **options)
        self.phase_of = phase_of
        self.per_phase = dict.fromkeys(PHASES, 0)
        self.started_ms: dict[str, float] = {}
        self.ended_ms = dict.fromkeys(PHASES, 0.0)
        self.first_preemption: dict[str, Any] | None = None

    def _preempt(self, victim: SimRequest, durations: object) -> int:
        self.per_phase[self.phase_of[victim.index]] += 1
        if self.first_preemption is None:
            self.first_preemption = memory_snapshot(self.manager.block_pool, len(self.running))
        return super()._preempt(victim, durations)

    def _run(self, step: Any) -> None:
        super()._run(step)
        for entry, _ in step.scheduled:
            phase = self.phase_of[entry.index]
            self.started_ms.setdefault(phase, self.clock_ms)
            if entry.finished:
                self.ended_ms[phase] = max(self.ended_ms[phase], self.clock_ms)


def memory_snapshot(pool: Any, running: int) -> dict[str, Any]:
    """Where a two-level pool's memory is, per class: pages owned, partly used, small pages free.

    A large page can move to another class only once none of its small
    pages is in use; the small pages free in partly used pages are memory
    no other class can get.
    """
    pages = pool.pages
    snapshot: dict[str, Any] = {"running": running, "free large pages": len(pages.free)}
    for klass, class_pool in enumerate(pool.pools):
        per = pages.per_page[klass]
        partly = sum(
            1
            for page, owner in enumerate(pages.owner)
            if owner == klass and 0 < pages.in_use[page] < per
        )
        snapshot[f"class {klass}"] = {
            "large pages owned": pages.owned[klass],
            "small pages per large page": per,
            "small pages in use": class_pool.num_in_use,
            "small pages free in its pages": class_pool.own_free(),
            "large pages partly in use": partly,
            "fully free large pages": len(pages.fully_free[klass]),
        }
    return snapshot


class Outcome:
    """One replay: preemptions and simulated seconds per phase."""

    def __init__(self, scheduler: _PhaseScheduler) -> None:
        self.preemptions = scheduler.per_phase
        self.first_preemption = scheduler.first_preemption
        started_ms, ended_ms = scheduler.started_ms, scheduler.ended_ms
        # A phase lasts from its first scheduled request to its last finished one
        # (phases overlap where one's first requests run beside the last of the one before).
        self.seconds = {
            phase: (ended_ms[phase] - started_ms.get(phase, 0.0)) / 1000.0 for phase in PHASES
        }


def replay(
    plan: kvcore.KVCachePlan,
    workload: Sequence[tuple[str, TraceRequest]],
    limits: Sequence[int | None] | None,
    config: SchedulerConfig,
) -> Outcome:
    """Preemptions and time per phase under ``limits`` (``None``: the dynamic split)."""
    manager = KVCacheManager(plan.kv_cache_config, plan.max_model_len, hash_algorithm="fast")
    pool = manager.block_pool
    assert isinstance(pool, TwoLevelBlockPool)
    if limits is not None:
        pool.limit_classes(limits)
    requests = []
    for index, (_, trace) in enumerate(workload):
        room = plan.max_model_len - trace.input_length
        requests.append(SimRequest(trace, max(1, min(trace.output_length, room)), index))
    scheduler = _PhaseScheduler(
        manager, config, requests, phase_of=[phase for phase, _ in workload]
    )
    scheduler.run()
    pool.check_invariants()
    return Outcome(scheduler)


def class_names(plan: kvcore.KVCachePlan) -> list[str]:
    """Each page class named by its groups' kinds."""
    page_pool = plan.kv_cache_config.page_pool
    assert page_pool is not None
    names: list[set[str]] = [set() for _ in range(page_pool.num_classes)]
    for group, klass in zip(
        plan.kv_cache_config.kv_cache_groups, page_pool.group_classes, strict=True
    ):
        names[klass].add(group.kv_cache_spec.kind)
    return ["+".join(sorted(n)) for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen3-next-80b", help="a model with two page classes")
    parser.add_argument("--memory", default="8GiB")
    parser.add_argument("--short", type=positive_int, default=400, help="requests per short phase")
    parser.add_argument("--long", type=positive_int, default=120, help="requests of the long phase")
    parser.add_argument("--short-below", type=positive_int, default=2048, help="tokens")
    parser.add_argument("--long-from", type=positive_int, default=8192, help="tokens")
    parser.add_argument("--steps", type=positive_int, default=20, help="static splits swept")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--max-num-seqs", type=positive_int, default=DEFAULT_MAX_NUM_SEQS,
        help="most requests running at once, the same for every pool (default: the simulator's)",
    )  # fmt: skip
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/bench-dynamic-split.json"
    )
    args = parser.parse_args(argv)
    name = "bench-dynamic-split"
    if args.max_num_seqs != DEFAULT_MAX_NUM_SEQS:
        name += f"-{args.max_num_seqs}-running"
    recorder = Recorder(name, enabled=args.record)
    with recorder.section("table"):
        _run(args, recorder)
    recorder.write()
    return 0


def _run(args: argparse.Namespace, recorder: Recorder) -> None:
    plan = kvcore.plan(args.model, memory=args.memory, pool="two-level")
    page_pool = plan.kv_cache_config.page_pool
    if page_pool is None or page_pool.num_classes != 2:
        msg = f"{args.model} does not plan two page classes: give a model that does"
        raise SystemExit(msg)
    names = class_names(plan)
    usable = page_pool.num_large_pages - 1
    workload = phased_workload(args.short, args.long, args.short_below, args.long_from, args.seed)
    config = SchedulerConfig(arrival="asap", max_num_seqs=args.max_num_seqs)
    print(
        f"{args.model} in {args.memory}, at most {args.max_num_seqs} running: {usable} usable "
        f"large pages; class 0 {names[0]}, "
        f"class 1 {names[1]}. Phases: {args.short} prompts under {args.short_below} tokens, "
        f"{args.long} from {args.long_from}, {args.short} under {args.short_below}; all waiting "
        "from the start, phase after phase."
    )
    print_load()
    dynamic = replay(plan, workload, None, config)
    print(f"  two-level: {_line(dynamic)}", flush=True)
    static: dict[int, Outcome] = {}
    for step in range(1, args.steps):
        second = round(usable * step / args.steps)
        try:
            static[second] = replay(plan, workload, [usable - second, second], config)
        except UnservableRequestError:
            print(f"  static, class 1 {second:>4} large pages: a request never fits")
            continue
        print(f"  static, class 1 {second:>4} large pages: {_line(static[second])}", flush=True)
    rows = [_compare(phase, dynamic, static, usable, recorder) for phase in PHASES]
    header = [
        "phase",
        "two-level preemptions",
        "its simulated s",
        "best static preemptions",
        "its split (class 0 / 1 large pages)",
        "its simulated s",
        "two-level over best",
        "best static at most as slow: preemptions (split)",
    ]
    capped = (
        ""
        if args.max_num_seqs == DEFAULT_MAX_NUM_SEQS
        else f", at most {args.max_num_seqs} running"
    )
    recorder.tables["phases"] = table(
        f"{args.model} in {args.memory}{capped}: preemptions per phase", header, rows
    )
    recorder.data["static"] = {
        str(k): {"preemptions": v.preemptions, "seconds": v.seconds} for k, v in static.items()
    }
    recorder.data["dynamic"] = {
        "preemptions": dynamic.preemptions,
        "seconds": dynamic.seconds,
        "first preemption": dynamic.first_preemption,
    }
    print("  " + " | ".join(header))
    for row in rows:
        print("  " + " | ".join(str(cell) for cell in row))
    _print_snapshot(dynamic.first_preemption)
    if dynamic.first_preemption is not None:
        classes = [v for k, v in dynamic.first_preemption.items() if k.startswith("class")]
        recorder.tables["first-preemption"] = table(
            f"The two-level pool at its first preemption ({args.model}, {args.memory})",
            ["class", *classes[0]],
            [[f"{k} ({names[k]})", *c.values()] for k, c in enumerate(classes)],
        )


def _print_snapshot(snapshot: dict[str, Any] | None) -> None:
    if snapshot is None:
        return
    print(
        f"  two-level pool at its first preemption ({snapshot['running']} running, "
        f"{snapshot['free large pages']} free large pages):"
    )
    for key, value in snapshot.items():
        if key.startswith("class"):
            print(f"    {key}: " + ", ".join(f"{k} {v}" for k, v in value.items()))


def _compare(
    phase: str, dynamic: Outcome, static: dict[int, Outcome], usable: int, recorder: Recorder
) -> list[object]:
    """One phase's row: the two-level pool against the best static split with hindsight.

    Also the best static split among those that served the phase no slower
    than the two-level pool (a split can avoid preemptions by running fewer
    requests at once).
    """

    def best_of(splits: list[int]) -> int:
        return min(splits, key=lambda s: (static[s].preemptions[phase], static[s].seconds[phase]))

    best = best_of(list(static))
    least = static[best].preemptions[phase]
    ours = dynamic.preemptions[phase]
    over = (ours - least) / least if least else None
    if over is not None:
        recorder.figure(f"over.{phase.replace(' ', '-')}", percent(over))
    fast = [s for s in static if static[s].seconds[phase] <= dynamic.seconds[phase]]
    fair = (
        f"{static[best_of(fast)].preemptions[phase]} ({usable - best_of(fast)} / {best_of(fast)})"
        if fast
        else "none"
    )
    return [
        phase,
        ours,
        f"{dynamic.seconds[phase]:.1f}",
        least,
        f"{usable - best} / {best}",
        f"{static[best].seconds[phase]:.1f}",
        percent(over) if over is not None else ("none either" if not ours else "n/a"),
        fair,
    ]


def _line(outcome: Outcome) -> str:
    return ", ".join(
        f"{phase} {outcome.preemptions[phase]} ({outcome.seconds[phase]:.1f} s)" for phase in PHASES
    )


if __name__ == "__main__":
    sys.exit(main())
