"""The engine loop's features through the executor: speculative decoding, same-step hits, modes."""

from __future__ import annotations

import pytest
from exechelpers import run_engine, tiny_plan

import kvcore
from kvcore.errors import InvalidConfigError, InvalidRequestError
from kvcore.executor import (
    EngineConfig,
    EngineRequest,
    Executor,
    ReferenceEngine,
    Scheduled,
    tiny_model_path,
)


@pytest.mark.parametrize("name", ["tiny-gemma", "tiny-mla", "tiny-sink"])
def test_speculative_decoding_with_lookahead_slots(name):
    plan = tiny_plan(name, pressure=1.3)
    config = EngineConfig(num_speculative_tokens=3, reset_prefix_cache_at=(15,))
    executor, engine, report = run_engine(plan, use_eagle=True, config=config, max_output=20)
    assert executor.manager.use_eagle
    stats = engine.stats
    assert report.ok, [m.describe() for m in report.mismatches]
    assert stats.draft_tokens > 0
    assert 0 < stats.accepted_draft_tokens < stats.draft_tokens
    # Rejected drafts were computed, written to the cache, and later overwritten.
    assert report.positions_discarded == stats.draft_tokens - stats.accepted_draft_tokens
    assert stats.preemptions > 0
    assert stats.hit_admissions > 0


def twin_requests():
    # Two identical 40-token prompts arriving in the same step: the second one's
    # lookup finds the first one's blocks, cached by the first one's allocation.
    prompt = list(range(100, 140))
    return [
        EngineRequest(request_id="a", prompt_token_ids=prompt, max_output_tokens=3),
        EngineRequest(request_id="b", prompt_token_ids=prompt, max_output_tokens=3),
    ]


def serve(plan, requests, **config):
    executor = Executor.from_plan(plan)
    engine = ReferenceEngine(executor, requests, EngineConfig(max_num_batched_tokens=64, **config))
    engine.run()
    return engine, executor.check()


def test_a_state_cached_in_the_same_step_is_read_before_it_is_written():
    """The hazard the engine loop defers around, caught by the executor when it does not.

    kvcore's Mamba manager (as vLLM 0.14's) caches a state block when the step
    that fills it is scheduled. A request admitted in the same step can hit it,
    and its recurrent layers read the state when the step starts: before the
    first request's step writes it. Here both prompts are 40 tokens, blocks are
    16 tokens, so "b" hits 32 tokens and reads the state after 32 tokens from
    the block "a" fills in the same step.
    """
    plan = tiny_plan("tiny-qwen-next", pressure=3)
    engine, report = serve(plan, twin_requests(), defer_same_step_hits=False)
    assert engine.stats.hit_tokens == 32
    assert engine.stats.deferred_admissions == 0
    assert not report.ok
    first = report.mismatches[0]
    assert (first.request_id, first.position, first.kind) == ("b", 32, "mamba")
    assert first.step == 1

    engine, report = serve(plan, twin_requests())
    assert engine.stats.deferred_admissions == 1
    assert engine.stats.hit_tokens == 32
    assert report.ok


def test_attention_reads_a_block_written_in_the_same_step_in_time():
    plan = tiny_plan("tiny-gemma", pressure=3)
    engine, report = serve(plan, twin_requests(), defer_same_step_hits=False)
    assert engine.stats.hit_tokens == 36  # 9 blocks of 4, the last token recomputed
    assert engine.stats.deferred_admissions == 0
    assert report.ok


def test_mamba_without_prefix_caching_keeps_one_state_per_request():
    path = tiny_model_path("tiny-qwen-next")
    plan = kvcore.plan(
        path,
        memory="1MiB",
        block_size=4,
        max_num_batched_tokens=32,
        options={"mamba.cache_mode": "none"},
        pool="shared",
    )
    states = [g.kv_cache_spec for g in plan.kv_cache_config.kv_cache_groups]
    assert {s.block_size for s in states if s.kind == "mamba"} == {plan.max_model_len}
    executor = Executor.from_plan(plan, enable_caching=False)
    requests = [
        EngineRequest(request_id=f"r{i}", prompt_token_ids=[i] * 30, max_output_tokens=6)
        for i in range(5)
    ]
    ReferenceEngine(executor, requests, EngineConfig(max_num_batched_tokens=16)).run()
    assert executor.check().ok


def test_requests_that_do_not_fit_are_refused():
    executor = Executor.from_plan(tiny_plan("tiny-gemma"))
    too_long = EngineRequest(request_id="x", prompt_token_ids=[1] * 120, max_output_tokens=9)
    with pytest.raises(
        InvalidRequestError, match=r"'x': 120 prompt \+ 9 output tokens exceed max_model_len=128"
    ):
        ReferenceEngine(executor, [too_long])
    twice = EngineRequest(request_id="y", prompt_token_ids=[1], max_output_tokens=1)
    with pytest.raises(InvalidRequestError, match="share the id 'y'"):
        ReferenceEngine(executor, [twice, twice])


def test_engine_options_are_validated():
    with pytest.raises(InvalidConfigError, match="draft_acceptance"):
        EngineConfig(draft_acceptance=1.5)
    with pytest.raises(InvalidConfigError, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=0)


def test_a_scheduled_entry_must_match_its_tokens():
    executor = Executor.from_plan(tiny_plan("tiny-gemma"))
    request = kvcore.Request("r", [1, 2, 3])
    executor.manager.allocate_slots(request, 3)
    with pytest.raises(InvalidRequestError, match="3 positions scheduled from 0, but 2 token ids"):
        executor.step([Scheduled(request=request, num_tokens=3, token_ids=(1, 2))])


def test_buffers_of_another_config_are_refused():
    first = Executor.from_plan(tiny_plan("tiny-gemma"))
    other = Executor.from_plan(tiny_plan("tiny-gemma", pressure=2))
    with pytest.raises(InvalidConfigError, match="another KVCacheConfig"):
        Executor(first.model, first.manager, other.buffers)
