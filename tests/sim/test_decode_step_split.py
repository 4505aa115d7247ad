"""The decode-step split benchmark: its parts add up to the simulator's own decode-step figures."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark
from simhelpers import assert_refused

from kvcore._sim import load_workload
from kvcore._sim import scheduler as scheduler_module


@pytest.fixture(scope="module")
def decode_steps():
    return load_benchmark("eviction_decode_steps")


def test_the_split_adds_up_to_each_replays_decode_steps(decode_steps):
    real_step = scheduler_module.Scheduler.step
    policies = ("lru", "frequency")
    splits, reports = decode_steps.measure(
        load_workload(None, limit=40), policies, "2GiB", max_model_len=8192
    )
    assert scheduler_module.Scheduler.step is real_step  # put back
    for policy in policies:
        split = splits[policy]
        manager = reports[policy].manager
        assert reports[policy].eviction.policy == policy
        assert split.steps == manager.decode_steps > 0
        # Every decode step decoded, and only decode, free, lookup, admit
        # and preempt calls can happen in one: no prefill.
        assert split.calls["decode"] >= split.steps
        assert split.calls["prefill"] == 0
        # An admission tried in a decode step was refused: one lookup each.
        assert split.calls["admit"] == split.calls["lookup"]
        total_us = sum(split.ns.values()) / 1e3
        assert total_us / split.steps == pytest.approx(manager.per_decode_step_mean_us)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "-1"], "--rounds: must be an integer >= 1, got '-1'"),
        (["--policies", "lru,lru"], "--policies needs distinct names"),
        (["--policies", ","], "--policies needs distinct names"),
    ],
)
def test_bad_arguments_are_refused_by_name(decode_steps, capsys, argv, message):
    assert_refused(decode_steps.main, argv, message, capsys)
