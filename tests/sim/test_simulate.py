"""Whole simulations: plan, replay, report."""

from __future__ import annotations

import pytest
from simhelpers import explicit

from kvcore._plugin_loader import load_registry
from kvcore._sim import SimulationOptions, load_workload, simulate
from kvcore._sim.report import format_report
from kvcore._sim.simulate import plan_for
from kvcore._sim.workload import Workload
from kvcore.errors import InvalidConfigError

TIMES = ("manager", "timing")


def without_times(report):
    return {k: v for k, v in report.to_dict().items() if k not in TIMES}


def test_same_seed_same_report():
    options = SimulationOptions(memory="2GiB", max_model_len=32768)
    first = simulate(load_workload(limit=150, seed=3), options)
    second = simulate(load_workload(limit=150, seed=3), options)
    assert without_times(first) == without_times(second)
    other = simulate(load_workload(limit=150, seed=4), options)
    assert without_times(other) != without_times(first)


def test_report_fields_add_up():
    report = simulate(
        load_workload(limit=200), SimulationOptions(memory="1GiB", max_model_len=32768)
    )
    assert report.finished == 200
    pc = report.prefix_cache
    assert 0 < pc.hit_rate <= pc.ceiling_rate < 1
    assert pc.hit_tokens <= pc.ceiling_tokens
    assert pc.prompt_tokens == report.workload.prompt_tokens
    ops = report.manager.ops
    assert ops["lookup"].count == ops["admit"].count >= 200
    assert ops["free"].count == 200
    assert ops["preempt"].count == report.preemptions.count
    assert ops["decode"].count > 0
    assert report.blocks.peak <= report.blocks.usable
    assert sorted(g.kind for g in report.blocks.groups) == ["full_attention", "sliding_window"]
    assert report.steps.count >= max(r.output_length for r in load_workload(limit=200).requests)
    assert report.eviction.policy == "lru"
    assert report.eviction.belady_hit_tokens is None
    timeline = report.to_dict()["timeline"]
    assert len(timeline["step"]) == report.blocks.samples > 10
    text = format_report(report)
    assert "prefix hits" in text
    assert "unbounded-cache ceiling" in text
    assert "decode" in text
    assert "p99" in text


def test_small_memory_preempts_and_lowers_the_hit_rate():
    workload = load_workload(limit=300)
    roomy = simulate(workload, SimulationOptions(memory="8GiB", max_model_len=32768))
    tight = simulate(workload, SimulationOptions(memory="1GiB", max_model_len=32768))
    assert roomy.preemptions.count == 0
    assert tight.preemptions.count > 0
    assert tight.finished == roomy.finished == 300
    assert tight.prefix_cache.hit_rate < roomy.prefix_cache.hit_rate
    assert tight.eviction.evicted_blocks > roomy.eviction.evicted_blocks


def test_too_long_prompts_are_rejected_and_outputs_capped():
    workload = Workload(
        name="hand",
        requests=(
            explicit("fits", range(100), 10),
            explicit("capped", range(1000, 1090), 50),
            explicit("too-long", range(2000, 2128), 1),
        ),
    )
    report = simulate(workload, SimulationOptions(model="llama-3-8b", max_model_len=128))
    assert report.workload.rejected_too_long == 1
    assert report.workload.output_capped == 1
    assert report.finished == 2
    assert report.workload.output_tokens == 10 + 38


def test_memory_too_small_states_the_minimum():
    options = SimulationOptions(memory="10MiB", max_model_len=32768)
    with pytest.raises(InvalidConfigError, match=r"give at least 963.75 MiB"):
        simulate(load_workload(limit=5), options)


def test_every_request_too_long_is_an_error():
    # 10 MiB fits max_model_len=192 (lowered to fit); the prompts are longer.
    with pytest.raises(InvalidConfigError, match=r"every request .* max_model_len=192"):
        simulate(load_workload(limit=5), SimulationOptions(memory="10MiB"))


def test_prefix_caching_off_hits_nothing():
    report = simulate(
        load_workload(limit=100), SimulationOptions(memory="2GiB", enable_caching=False)
    )
    assert report.prefix_cache.hit_tokens == 0
    assert report.prefix_cache.ceiling_rate > 0.3
    assert report.finished == 100


def test_a_model_with_uncacheable_groups_needs_caching_off():
    with pytest.raises(InvalidConfigError, match=r"\(cross_attention\).*--no-prefix-caching"):
        simulate(load_workload(limit=5), SimulationOptions(model="whisper-large-v3"))


def test_no_hybrid_plans_windowed_layers_as_full_attention():
    workload = load_workload(limit=50)
    report = simulate(workload, SimulationOptions(memory="2GiB", hybrid=False))
    assert [g.kind for g in report.plan.groups] == ["full_attention"]
    assert report.plan.groups[0].layers == 24
    assert report.finished == 50


def test_plan_options_reach_the_plan():
    options = SimulationOptions(
        model="qwen3-next-80b", pool="two-level", plan_options={"mamba.prefill_states": "selective"}
    )
    plan = plan_for(options, load_registry())
    states = [s for s in plan.layer_specs.values() if s.kind == "mamba"]
    assert len(states) == 36
    assert {s.prefill_states for s in states} == {"selective"}


@pytest.mark.parametrize("value", [5, 1.5, "mamba.prefill_states=selective", None])
def test_plan_options_must_be_a_mapping(value):
    with pytest.raises(InvalidConfigError, match=r"plan_options must be a mapping .* got "):
        SimulationOptions(plan_options=value)


def test_a_plan_option_value_no_plugin_accepts_is_refused():
    options = SimulationOptions(model="qwen3-next-80b", plan_options={"mamba.prefill_states": 3})
    with pytest.raises(InvalidConfigError, match=r"must be one of 'every', 'selective', got 3"):
        simulate(load_workload(limit=5), options)


# Half as much again as one request of 4,096 tokens needs (its InsufficientMemoryError
# says how much): deepseek-v3 and llama-4-scout preempt at this size.
MEMORY_MIB = {
    "deepseek-v3": 412,
    "gemma-3-27b": 3372,
    "gpt-oss-20b": 288,
    "jamba-v0.1": 781,
    "llama-4-scout": 1152,
    "nvfp4-hybrid-8b": 771,
    "qwen3-next-80b": 630,
}


@pytest.mark.parametrize("model", sorted(MEMORY_MIB))
@pytest.mark.parametrize("pool", ["shared", "two-level"])
def test_blocks_per_group_derived_from_the_pool_equal_the_tables(model, pool, monkeypatch):
    """A shared pool's largest group is counted as blocks in use minus the others.

    That holds only if every block in use is in exactly one group's tables:
    checked here at every sample, on every hybrid and with preemptions,
    against the sets of every group's blocks.
    """
    import kvcore._sim.scheduler as scheduler_module

    counted = scheduler_module.held_per_group
    calls = []

    def both(tables, used=None):
        calls.append(used)
        assert counted(tables, used) == counted(tables)
        return counted(tables, used)

    monkeypatch.setattr(scheduler_module, "held_per_group", both)
    memory = f"{MEMORY_MIB[model]}MiB"
    options = SimulationOptions(model=model, memory=memory, max_model_len=4096, pool=pool)
    report = simulate(load_workload(limit=40, seed=5), options)
    workload = report.workload
    assert report.finished == workload.requests - workload.rejected_too_long > 20
    assert len(calls) > report.blocks.samples > 300
    assert all((used is None) == (pool == "two-level") for used in calls)
