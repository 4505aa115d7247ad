"""Randomized engine traffic over every attention type, invariants checked after every op.

:class:`kvcore.testing.RandomWorkload` admits (with cache lookups, tokens a KV
connector loads and chunked prefill), decodes with lookahead slots, preempts,
finishes and resets, and after every operation checks the pool and manager
invariants, that each allocation took exactly the blocks it predicted, that a
refused allocation changed nothing and that hits are aligned and shorter than
the prompt. Each run must also have exercised hits (with caching), external
tokens, refusals and preemptions.
"""

from __future__ import annotations

import pytest
from kvplugin_helpers import chunked, cross, full, hidden, make_manager, mamba, mla, sink, sw

from kvcore.testing import RandomWorkload

# (id, specs, blocks per group, manager options, workload options)
CONFIGS = [
    # every type alone
    ("full", [full(4)], 40, {}, {}),
    ("sliding_window", [sw(24, 4)], 40, {}, {}),
    ("chunked_local", [chunked(16, 4)], 12, {}, {}),
    ("mamba_align", [mamba(4)], 40, {}, {}),
    ("mamba_none", [mamba(512, mode="none", spec_blocks=1)], 6, {"enable_caching": False}, {}),
    ("cross_attention", [cross(4)], 30, {"enable_caching": False}, {"num_encoder_tokens": 40}),
    ("sink_full_attention", [sink(8, 4)], 42, {}, {}),
    ("mla", [mla(4, "fp8_ds_mla")], 40, {}, {}),
    ("hidden_state", [hidden(4)], 40, {}, {}),
    # full attention with each other type
    ("full+sliding_window", [full(4), sw(17, 4)], 35, {}, {}),
    ("full+chunked_local", [full(4), chunked(8, 4)], 35, {}, {}),
    ("full+mamba_align", [full(4), mamba(4, spec_blocks=1)], 35, {}, {}),
    (
        "full+mamba_none",
        [full(4), mamba(512, mode="none")],
        30,
        {"enable_caching": False},
        {},
    ),
    (
        "full+cross_attention",
        [full(4), cross(4)],
        30,
        {"enable_caching": False},
        {"num_encoder_tokens": 20},
    ),
    ("full+sink_full_attention", [full(4), sink(8, 4)], 35, {}, {}),
    ("full+mla", [full(4), mla(4)], 35, {}, {}),
    ("full+hidden_state", [full(4), hidden(4)], 35, {}, {}),
    # three types, different block sizes, EAGLE
    ("full+sliding_window+mamba_align", [full(4), sw(13, 4), mamba(4)], 30, {}, {}),
    ("full8+sliding_window4", [full(8), sw(16, 4)], 35, {}, {}),
    ("full4+mamba8", [full(4), mamba(8)], 35, {}, {}),
    # selective prefill states: nulls between kept states
    ("mamba_selective", [mamba(4, prefill_states="selective")], 14, {}, {}),
    (
        "full+mamba_selective",
        [full(4), mamba(4, spec_blocks=1, prefill_states="selective")],
        35,
        {},
        {},
    ),
    ("full4+mamba8_selective", [full(4), mamba(8, prefill_states="selective")], 35, {}, {}),
    ("full8+sw4+mamba8", [full(8), sw(9, 4), mamba(8)], 30, {}, {}),
    ("eagle:full+sliding_window", [full(4), sw(17, 4)], 35, {"use_eagle": True}, {}),
    ("eagle:full8+sw4", [full(8), sw(12, 4)], 35, {"use_eagle": True}, {}),
    (
        "eagle:full+sw+sw+mamba",
        [full(4), sw(9, 4), sw(21, 4), mamba(4)],
        25,
        {"use_eagle": True},
        {},
    ),
    ("eagle:sliding_window", [sw(24, 4)], 40, {"use_eagle": True}, {}),
    ("two_windows", [sw(8, 4), sw(24, 4)], 35, {}, {}),
]


@pytest.mark.parametrize(
    ("specs", "blocks_per_group", "options", "workload_options"),
    [pytest.param(*config[1:], id=config[0]) for config in CONFIGS],
)
def test_random_workload_keeps_every_invariant(specs, blocks_per_group, options, workload_options):
    num_blocks = blocks_per_group * len(specs) + sum(s.pool_reserved_blocks for s in specs)
    manager = make_manager(specs, num_blocks, 512, hash_algorithm="fast", **options)
    seed = sum(map(ord, repr(specs)))
    workload = RandomWorkload(manager, seed=seed, max_running=6, **workload_options)
    stats = workload.run(2000)
    assert stats.admitted > 60
    assert stats.finished > 10
    assert stats.refused_admissions + stats.refused_decodes > 5
    assert stats.preemptions > 5
    assert stats.external_tokens > 0
    if options.get("enable_caching", True):
        assert stats.hit_tokens > 0
    else:
        assert stats.hit_tokens == 0
