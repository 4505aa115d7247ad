"""The eviction benchmark's lockstep replays: same results as one after another, taking turns."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark
from simhelpers import assert_refused

from kvcore._sim import SchedulerConfig, SimulationOptions, load_workload, simulate


@pytest.fixture(scope="module")
def bench_eviction():
    return load_benchmark("bench_eviction")


def options(policy: str) -> SimulationOptions:
    return SimulationOptions(
        model="gpt-oss-20b",
        memory="2GiB",
        max_model_len=8192,
        eviction=policy,
        scheduler=SchedulerConfig(),
    )


POLICIES = ("lru", "frequency", "cost")


def test_lockstep_replays_give_what_sequential_ones_give(bench_eviction):
    workload = load_workload(None, limit=40)
    reports = bench_eviction.replay_in_lockstep(
        workload, [options(policy) for policy in POLICIES], chunk=4
    )
    assert len(reports) == len(POLICIES)
    for policy, report in zip(POLICIES, reports, strict=True):
        alone = simulate(workload, options(policy))
        assert report.eviction.policy == policy
        assert report.prefix_cache.hit_tokens == alone.prefix_cache.hit_tokens
        assert report.preemptions == alone.preemptions
        assert {kind: op.count for kind, op in report.manager.ops.items()} == {
            kind: op.count for kind, op in alone.manager.ops.items()
        }


def test_lockstep_replays_take_turns_of_chunk_steps(bench_eviction, monkeypatch):
    """Replay k runs steps ``chunk`` at a time, then the next live replay runs."""
    seen: list[str] = []
    real_simulate = bench_eviction.simulate

    def recording_simulate(workload, opts, *, attach):
        def recording_attach(plan, manager):
            on_step = attach(plan, manager)

            def step(scheduled):
                seen.append(opts.eviction)
                on_step(scheduled)

            return step

        return real_simulate(workload, opts, attach=recording_attach)

    monkeypatch.setattr(bench_eviction, "simulate", recording_simulate)
    workload = load_workload(None, limit=12)
    chunk = 5
    bench_eviction.replay_in_lockstep(workload, [options(p) for p in POLICIES], chunk=chunk)
    steps = {policy: seen.count(policy) for policy in POLICIES}
    assert all(steps.values())
    # The runs of one policy, in order: each has ``chunk`` steps while the
    # others are still running, then the order goes round.
    runs: list[tuple[str, int]] = []
    for policy in seen:
        if runs and runs[-1][0] == policy:
            runs[-1] = (policy, runs[-1][1] + 1)
        else:
            runs.append((policy, 1))
    done = {policy: 0 for policy in POLICIES}
    live = list(POLICIES)
    expected_next = 0
    for policy, length in runs:
        assert policy == live[expected_next % len(live)]
        done[policy] += length
        if done[policy] == steps[policy]:
            # Its last run may be short (the last replay left runs to the
            # end in one go); then it leaves the rotation.
            assert length <= chunk or len(live) == 1
            index = live.index(policy)
            live.remove(policy)
            expected_next = index
        else:
            assert length == chunk
            expected_next = live.index(policy) + 1
    assert not live


@pytest.mark.parametrize("chunk", [0, -3, 2.5, "8"])
def test_a_turn_of_no_whole_positive_number_of_steps_is_refused(bench_eviction, chunk):
    workload = load_workload(None, limit=2)
    with pytest.raises(ValueError, match=r"chunk must be an integer >= 1 .* got"):
        bench_eviction.replay_in_lockstep(workload, [options("lru")], chunk=chunk)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repeats", "0"], "--repeats: must be an integer >= 1, got '0'"),
        (["--jobs", "-2"], "--jobs: must be an integer >= 1, got '-2'"),
        (["--limit", "ten"], "--limit: must be an integer >= 1, got 'ten'"),
    ],
)
def test_bad_arguments_are_refused_by_name(bench_eviction, capsys, argv, message):
    assert_refused(bench_eviction.main, argv, message, capsys)
