"""Every tiny model, in every layout and both pools, computes exactly what no cache computes.

Each run serves 14 synthetic requests through a pool of 1.2 times what one
longest request needs, so the run has chunked prefill, decode, prefix hits
between requests, evictions, preemptions (some resumed from their own cached
blocks) and a prefix-cache reset; the manager's invariants are checked after
every step, and every computed position is compared bit for bit (float64)
with the dense run of the same model.
"""

from __future__ import annotations

import pytest
from exechelpers import run_engine, tiny_plan

from kvcore.executor import tiny_models
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.hidden_state import HiddenStateCacheSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.mla import MLAAttentionSpec
from kvcore_plugins.sink_full_attention import SinkFullAttentionSpec

CASES = [
    (name, layout, True) for name in tiny_models() for layout in ("layer_outer", "block_outer")
] + [
    ("tiny-gemma", "layer_outer", False),
    ("tiny-mla", "layer_outer", False),
    ("tiny-hidden", "block_outer", False),
]

# Runs in which a preempted request finds its own blocks again when it resumes
# (in both pools).
RESUMED_WITH_HITS = {
    ("tiny-gemma", "layer_outer", True),
    ("tiny-hybrid", "layer_outer", True),
    ("tiny-mla-fallback", "layer_outer", True),
}


# Under the two-level pool the state groups keep a state every 8 tokens (2 blocks),
# so the states' grid differs from the attention blocks'; tiny-hybrid's chunked
# layers refuse hits aligned past their block, so its states keep the block size.
CHECKPOINTS = {"tiny-qwen-next": 8, "tiny-three-pages": 8}


@pytest.mark.parametrize("pool", ["shared", "two-level"])
@pytest.mark.parametrize(("name", "layout", "hybrid"), CASES)
def test_paged_run_equals_the_dense_oracle(name, layout, hybrid, pool):
    checkpoint = CHECKPOINTS.get(name) if pool == "two-level" else None
    plan = tiny_plan(
        name, layout=layout, hybrid=hybrid, pressure=1.2, pool=pool, mamba_checkpoint=checkpoint
    )
    assert (plan.page_classes is not None) == (pool == "two-level")
    executor, engine, report = run_engine(plan)

    assert report.num_mismatches == 0, [m.describe() for m in report.mismatches]
    assert report.null_block_writes == ()
    assert report.ok
    stats = engine.stats
    assert stats.finished == 14
    # Every position of every request was computed and checked at least once.
    prompt_and_output = sum(len(r.all_token_ids) - 1 for r in engine.finished)
    assert report.positions_checked >= prompt_and_output - stats.hit_tokens
    # The run exercised the engine features the executor is there to check.
    assert stats.prefill_chunks > 0
    assert stats.decode_steps > 0
    assert stats.preemptions > 0
    assert stats.resets == 1
    if executor.manager.enable_caching:
        assert stats.hit_admissions > 0
        assert stats.evicted_blocks > 0
    if (name, layout, hybrid) in RESUMED_WITH_HITS:
        assert stats.resumed_with_hit > 0


# Under the shared pool the other models' state blocks grow past half a step's
# 32 tokens, so no step crosses two boundaries and nothing would be left out.
@pytest.mark.parametrize(
    ("name", "pool"),
    [
        ("tiny-qwen-next", "two-level"),
        ("tiny-hybrid", "shared"),
        ("tiny-hybrid", "two-level"),
        ("tiny-three-pages", "two-level"),
    ],
)
def test_selective_prefill_states_are_bit_exact(name, pool):
    """States kept only where prefixes are reused still resume every hit exactly.

    The run must also have left boundaries without a state (null blocks
    inside a Mamba table), or it would not test the selective rule.
    """
    checkpoint = CHECKPOINTS.get(name) if pool == "two-level" else None
    plan = tiny_plan(
        name,
        pressure=1.2,
        pool=pool,
        mamba_checkpoint=checkpoint,
        plan_options={"mamba.prefill_states": "selective"},
    )
    states = [s for s in plan.layer_specs.values() if isinstance(s, MambaSpec)]
    assert states
    assert {s.prefill_states for s in states} == {"selective"}
    interior_nulls = []

    def watch(engine):
        for group in engine.manager.coordinator.managers:
            if isinstance(group.spec, MambaSpec):
                for table in group.req_to_blocks.values():
                    held = [i for i, block in enumerate(table) if block]
                    if held and 0 in table[held[0] : held[-1]]:
                        interior_nulls.append(table)

    executor, engine, report = run_engine(plan, on_step=watch)
    assert report.num_mismatches == 0, [m.describe() for m in report.mismatches]
    assert report.null_block_writes == ()
    assert engine.stats.finished == 14
    assert engine.stats.hit_admissions > 0
    assert interior_nulls


def _groups(plan):
    return plan.kv_cache_config.kv_cache_groups


def _layer_specs(plan):
    return [spec for group in _groups(plan) for _, spec in group.items()]


def test_tiny_hybrid_raises_the_block_size_and_pads_the_mamba_pages():
    plan = tiny_plan("tiny-hybrid")
    kinds = {spec.kind for spec in plan.layer_specs.values()}
    assert kinds == {"full_attention", "sliding_window", "chunked_local", "mamba"}
    # 2 KV heads x (4 + 4) x 8 bytes = 128 bytes per token; the Mamba-2 state is
    # (3 x 16 + 2 x 4 x 4) x 8 = 640 bytes: 16 x ceil(640 / (16 x 128)) = 16 tokens.
    assert {group.kv_cache_spec.block_size for group in _groups(plan)} == {16}
    states = [s for s in _layer_specs(plan) if isinstance(s, MambaSpec)]
    assert len(states) == 2
    assert all(s.real_page_size_bytes == 640 and s.page_size_bytes == 2048 for s in states)


def test_tiny_gemma_has_a_padding_slot_and_unified_mode_records_the_window():
    plan = tiny_plan("tiny-gemma")
    # 2 full and 3 sliding layers: group size 2, the sliding bucket splits in two groups.
    assert plan.padding_slots == 1
    assert len(_groups(plan)) == 3
    unified = tiny_plan("tiny-gemma", hybrid=False)
    (group,) = _groups(unified)
    assert isinstance(group.kv_cache_spec, FullAttentionSpec)
    assert group.kv_cache_spec.compute_spec.sliding_window == 6


def test_tiny_mla_unifies_pages_by_scaling_the_mla_block_size():
    plan = tiny_plan("tiny-mla")
    sizes = {type(g.kv_cache_spec).__name__: g.kv_cache_spec.block_size for g in _groups(plan)}
    # MLA: 4 x 8 x 8 = 256-byte page at block 4, sliding window 512: MLA doubles its block.
    assert sizes == {"MLAAttentionSpec": 8, "SlidingWindowSpec": 4}
    packed = tiny_plan("tiny-mla", layout="block_outer")
    pages = {g.kv_cache_spec.page_size_bytes for g in _groups(packed)}
    assert pages == {256, 512}  # block-outer packing: no unification needed


def test_tiny_mla_fallback_allocates_the_windows_as_full_attention():
    plan = tiny_plan("tiny-mla-fallback")
    (group,) = _groups(plan)
    # MLA's 192-byte page (6-wide latent) and the 512-byte window page do not divide.
    specs = group.layer_specs
    assert [type(s).__name__ for s in specs] == [
        "MLAAttentionSpec",
        "FullAttentionSpec",
        "FullAttentionSpec",
        "MLAAttentionSpec",
    ]
    assert specs[1].compute_spec.sliding_window == 10
    assert isinstance(specs[0], MLAAttentionSpec)


def test_tiny_hidden_gets_its_own_group_with_a_padded_page():
    plan = tiny_plan("tiny-hidden")
    hidden = [s for s in _layer_specs(plan) if isinstance(s, HiddenStateCacheSpec)]
    assert len(hidden) == 1
    # one 6-wide float64 vector per token: 4 x 48 = 192 bytes, padded to the 512 of attention.
    assert hidden[0].real_page_size_bytes == 192
    assert hidden[0].page_size_bytes == 512


def test_tiny_sink_reserves_the_sink_blocks():
    plan = tiny_plan("tiny-sink")
    sinks = [g for g in _groups(plan) if isinstance(g.kv_cache_spec, SinkFullAttentionSpec)]
    assert [g.kv_cache_spec.pool_reserved_blocks for g in sinks] == [2]  # 8 sink tokens / 4


def test_a_bfloat16_cache_is_bit_exact_too():
    # Keys, values and latents are rounded to bfloat16 where they are stored, in
    # the paged and the dense run alike; states stay in the model's float64.
    plan = tiny_plan("tiny-hybrid", dtype="bfloat16", pressure=1.2)
    attention = [g.kv_cache_spec for g in _groups(plan) if g.kv_cache_spec.kind != "mamba"]
    assert {spec.dtype for spec in attention} == {"bfloat16"}
    _, engine, report = run_engine(plan)
    assert report.ok, [m.describe() for m in report.mismatches]
    assert engine.stats.hit_admissions > 0


def test_tiny_three_pages_has_three_page_classes():
    """Pages at 4-token blocks, 2 KV heads of 16, float64 model.

    Full attention 4 × 2 × 32 × 8 = 2,048 bytes; NVFP4 4 × 2 × (16 + 2) = 144;
    the Mamba-2 state (3 × 16 + 2 × 4 × 4) × 8 = 640. Their lcm 92,160 =
    2^11 × 45: 45, 640 and 144 small pages per large page, no padding.
    """
    plan = tiny_plan("tiny-three-pages", pool="two-level", mamba_checkpoint=8)
    classes = plan.page_classes
    assert classes.class_page_bytes == (144, 640, 2048)
    assert classes.large_page_bytes == 92_160
    assert [classes.pages_per_large_page(c) for c in range(3)] == [640, 144, 45]
    kinds = [(g.kind, g.block_size) for g in plan.groups]
    assert kinds == [("full_attention", 4), ("nvfp4_attention", 4), ("mamba", 8)]
    assert classes.group_classes == (2, 0, 1)
    shared = tiny_plan("tiny-three-pages")
    assert shared.page_classes is None
    assert len({g.kv_cache_spec.page_size_bytes for g in _groups(shared)}) == 1


def test_three_page_sizes_with_bfloat16_full_attention_are_bit_exact():
    """bf16 full attention (4 × 2 × 32 × 2 = 512 bytes), NVFP4 (144), float64 states (640).

    Three classes, lcm(144, 512, 640) = 23,040: 160, 45 and 36 small pages
    per large page.
    """
    plan = tiny_plan(
        "tiny-three-pages", dtype="bfloat16", pool="two-level", mamba_checkpoint=8, pressure=1.2
    )
    classes = plan.page_classes
    assert classes.class_page_bytes == (144, 512, 640)
    assert [classes.pages_per_large_page(c) for c in range(3)] == [160, 45, 36]
    _, engine, report = run_engine(plan)
    assert report.ok, [m.describe() for m in report.mismatches]
    assert engine.stats.hit_admissions > 0
    assert engine.stats.preemptions > 0
