"""Two-level plans: page classes, the large page, large-page sizing and waste, worked by hand.

Every figure below is derived in the docstrings from the shipped configs'
page sizes (the shared-pool tests in ``test_planning_models`` derive the
same pages): 16-token attention blocks, states checkpointed every 512 tokens
(the default), 8,192 batched tokens per step, 80 GiB.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from planning_helpers import GIB, P, full, mamba, registry

import kvcore
from kvcore._planning.grouping import natural_page_groups
from kvcore._planning.page_classes import (
    MAX_CLASS_PADDING,
    MAX_LARGE_PAGE_MULTIPLE,
    choose_large_page,
    page_classes,
)
from kvcore._planning.two_level import two_level_config
from kvcore._utils import format_bytes
from kvcore.errors import InsufficientMemoryError, InvalidConfigError
from kvcore_plugins.mamba import MambaSpec

MEMORY = 80 * GIB  # 85,899,345,920 bytes


def plan(model: str, **options) -> kvcore.KVCachePlan:
    options.setdefault("memory", MEMORY)
    return kvcore.plan(model, registry=registry(), **options)


def shape(p: kvcore.KVCachePlan) -> list[tuple[str, int, int]]:
    return [(g.kind, g.num_layers, g.block_size) for g in p.groups]


def test_qwen3_next_80b_by_hand():
    """12 full-attention layers (2,048 bytes per token) and 36 gated-delta-net states.

    Pages: attention 16 × 2,048 = 32,768 = 2^15; state 1,097,728 = 2^14 × 67.
    Their lcm, 2^15 × 67 = 2,195,456, is twice the state page: no padding,
    67 attention pages or 2 states per large page. Groups of 12 (3 state
    groups, 1 attention group), so 12 runs: a large page id costs 12 ×
    2,195,456 = 26,345,472 bytes and 80 GiB holds 3,260 (3,260.5). At
    262,144 tokens a request holds 16,384 attention pages, ceil(16,384 / 67)
    = 245 large pages, and per state group ceil(8,192 / 512) + 1 = 17
    states, 51 in all, ceil(51 / 2) = 26 large pages: 271, and with large
    page 0 272 × 26,345,472 = 7,165,968,384 bytes. Concurrency: 3,259 usable
    large pages over 16,384 / 67 + 51 / 2 = 270.04 per request = 12.069.
    Waste: large page 0 only, 1 / 3,260 of the pool.
    """
    p = plan("qwen3-next-80b")
    assert p.pool == "two-level"
    assert shape(p) == [("mamba", 12, 512)] * 3 + [("full_attention", 12, 16)]
    classes = p.page_classes
    assert classes.class_page_bytes == classes.natural_page_bytes == (32_768, 1_097_728)
    assert classes.group_classes == (1, 1, 1, 0)
    assert (classes.large_page_bytes, classes.num_runs, classes.lcm) == (2_195_456, 12, True)
    assert [classes.pages_per_large_page(c) for c in (0, 1)] == [67, 2]
    assert p.num_blocks == 3260
    assert p.kv_cache_config.size_bytes == 3260 * 26_345_472
    assert (p.blocks_per_request, p.large_pages_per_request) == (16_384 + 51, 271)
    assert p.memory_needed_bytes == 7_165_968_384
    assert p.max_concurrency == pytest.approx(3259 / (16_384 / 67 + 51 / 2))
    assert round(p.max_concurrency, 3) == 12.069
    assert p.wasted_bytes == 26_345_472
    assert p.waste_fraction == pytest.approx(1 / 3260)
    assert p.hit_alignment == 512
    assert p.mamba_checkpoint == 512
    pool = p.kv_cache_config.page_pool
    assert pool.num_large_pages == p.kv_cache_config.num_blocks == 3260
    assert [pool.num_blocks(c) for c in (0, 1)] == [3260 * 67, 3260 * 2]


def test_jamba_v0_1_by_hand():
    """4 attention layers (4,096 bytes per token) and 28 Mamba-1 states of 311,296 bytes.

    Pages 65,536 = 2^16 and 311,296 = 2^14 × 19: lcm 2^16 × 19 = 1,245,184,
    19 attention pages or 4 states per large page. Groups of 4 (7 state
    groups): 4 runs, 4,980,736 bytes per large page id, 17,246 in 80 GiB. A
    262,144-token request: ceil(16,384 / 19) = 863 large pages of attention
    and ceil(7 × 17 / 4) = 30 of states, 893. Concurrency 17,245 / (16,384 /
    19 + 119 / 4) = 19.33 (the shared pool's 80-token blocks: 16.36).
    """
    p = plan("jamba-v0.1")
    assert shape(p) == [("mamba", 4, 512)] * 7 + [("full_attention", 4, 16)]
    classes = p.page_classes
    assert classes.class_page_bytes == (65_536, 311_296)
    assert classes.large_page_bytes == 1_245_184
    assert [classes.pages_per_large_page(c) for c in (0, 1)] == [19, 4]
    assert p.num_blocks == 17_246
    assert p.large_pages_per_request == 893
    assert p.max_concurrency == pytest.approx(17_245 / (16_384 / 19 + 119 / 4))
    assert round(p.max_concurrency, 2) == 19.33
    assert round(plan("jamba-v0.1", pool="shared").max_concurrency, 2) == 16.36
    assert p.wasted_bytes == 4_980_736  # large page 0


def test_nvfp4_hybrid_8b_wastes_only_the_reserved_large_page():
    """bf16 sliding windows (page 65,536 = 2^16) beside NVFP4 (18,432 = 2^11 × 9).

    lcm 2^16 × 9 = 589,824: 9 bf16 pages or 32 NVFP4 pages per large page, no
    padding. Groups of 8: 8 runs, 4,718,592 bytes per large page id, 18,204
    in 80 GiB. A 131,072-token request: 8,192 NVFP4 pages = 256 large pages
    and 3 × 577 = 1,731 window pages, ceil(1,731 / 9) = 193: 449. The waste
    is large page 0, 1 / 18,204 = 0.0055 % (59.34 % in the shared pool).
    """
    p = plan("nvfp4-hybrid-8b")
    assert shape(p) == [("sliding_window", 8, 16)] * 3 + [("nvfp4_attention", 8, 16)]
    assert p.page_classes.class_page_bytes == (18_432, 65_536)
    assert p.page_classes.large_page_bytes == 589_824
    assert (p.num_blocks, p.large_pages_per_request) == (18_204, 449)
    assert p.wasted_bytes == 4_718_592
    assert round(p.waste_fraction, 6) == 0.000055
    assert p.notes == ()


def test_block_outer_classes_are_the_groups_blocks():
    """Block-outer: one run, a small page is a group's whole block.

    nvfp4-hybrid-8b: a window group's block is 8 × 65,536 = 524,288 bytes, the
    NVFP4 group's 8 × 18,432 = 147,456; lcm 2^19 × 9 = 4,718,592, 9 and 32
    per large page: the same large page id as in the layer-outer plan.
    """
    p = plan("nvfp4-hybrid-8b", layout="block_outer")
    classes = p.page_classes
    assert classes.class_page_bytes == (147_456, 524_288)
    assert (classes.large_page_bytes, classes.num_runs) == (4_718_592, 1)
    assert p.num_blocks == 18_204
    assert p.padding_slots == 0
    assert p.wasted_bytes == 4_718_592


def test_the_summary_shows_16_token_attention_blocks_and_the_page_classes():
    text = plan("qwen3-next-80b").summary()
    lines = text.splitlines()
    attention = next(line for line in lines if "full_attention   " in line).split()
    assert attention[4:7] == ["16", "32.00", "KiB"]
    assert ", two-level pool" in lines[1]
    assert (
        "page classes:    2, in large pages of 2.09 MiB in each of 12 runs (the lcm of the "
        "class pages)"
    ) in lines
    assert "  class 0:       32.00 KiB pages, 67 per large page, no padding; group 3" in lines
    assert "  class 1:       1.05 MiB pages, 2 per large page, no padding; groups 0, 1, 2" in lines
    assert (
        "large pages:     3260 of 25.12 MiB (79.99 GiB in all), large page 0 reserved for the "
        "null blocks"
    ) in lines
    assert "one request:     16435 blocks in 271 large pages, 6.67 GiB at 262144 tokens" in lines
    assert (
        "prefix hits:     multiples of 512 tokens (the lcm of the cached groups' block sizes)"
        in lines
    )
    wasted = next(line for line in lines if line.startswith("wasted:"))
    assert wasted.startswith("wasted:          25.12 MiB (0.03% of the pool when every block")
    assert "reserved large page 25.12 MiB, class padding 0 B" in wasted


def test_the_json_carries_the_page_pool():
    data = json.loads(json.dumps(plan("qwen3-next-80b").to_dict()))
    assert data["pool"] == "two-level"
    assert data["kv_cache_config"]["page_pool"] == {
        "large_page_bytes": 2_195_456,
        "num_large_pages": 3260,
        "class_page_bytes": [32_768, 1_097_728],
        "group_classes": [1, 1, 1, 0],
    }
    classes = data["page_classes"]
    assert classes["pages_per_large_page"] == [67, 2]
    assert classes["large_pages_per_request"] == 271
    assert classes["waste_breakdown"]["reserved large page"] == 26_345_472
    assert [g["page_class"] for g in data["groups"]] == [1, 1, 1, 0]
    tensors = data["kv_cache_config"]["kv_cache_tensors"]
    assert {t["num_blocks"] for t in tensors} == {3260 * 67, 3260 * 2}
    assert json.loads(json.dumps(plan("llama-3-8b").to_dict()))["page_classes"] is None


@pytest.mark.parametrize("model", kvcore.planning.list_models())
def test_auto_is_the_shared_plan_where_pages_agree(model):
    auto = plan(model)
    pages = {spec.page_size_bytes for spec in auto.layer_specs.values()}
    if len(pages) > 1:
        assert auto.pool == "two-level"
        return
    assert auto.pool == "shared"
    assert auto.to_dict() == plan(model, pool="shared").to_dict()


def test_auto_plans_two_level_where_one_page_still_pads_layer_slots():
    """gemma-3-27b block-outer: every layer's page is 16 x 16 x 256 x 2 = 131,072 bytes.

    The shared pool pads 8 layer slots (groups of 9 and 8 layers beside 10):
    3.96 % of the pool. Block-outer, a group's page is its layers' pages side
    by side: 8, 9 and 10 x 131,072 bytes, three classes; their lcm, 360 x
    131,072 = 47,185,920 bytes, holds 45, 40 and 36 of them. 80 GiB buys
    85,899,345,920 // 47,185,920 = 1,820 large pages, and only large page 0
    holds no KV: 1 / 1,820 of the pool. ``auto`` takes it; ``shared`` stays
    the reference's plan; layer-outer, a two-level pool keeps the padding
    slots (10 runs), so ``auto`` keeps the shared plan there; with
    ``num_blocks`` given (blocks of the shared pool) it does not switch.
    """
    auto = plan("gemma-3-27b", layout="block_outer")
    assert auto.pool == "two-level"
    classes = auto.page_classes
    assert classes is not None
    assert classes.class_page_bytes == (8 * 131_072, 9 * 131_072, 10 * 131_072)
    assert classes.large_page_bytes == 47_185_920
    assert [classes.pages_per_large_page(c) for c in range(3)] == [45, 40, 36]
    assert auto.num_blocks == 1820
    assert auto.wasted_bytes == 47_185_920
    assert auto.waste_fraction == pytest.approx(1 / 1820)
    shared = plan("gemma-3-27b", pool="shared", layout="block_outer")
    assert shared.pool == "shared"
    assert shared.num_blocks == 65_536
    assert shared.waste_fraction == pytest.approx(8 * 577 / (60 * 577 + 10 * 8192))
    assert auto.notes[0] == (
        "planned for the two-level pool although every layer has one page: the shared pool "
        f"would waste {format_bytes(shared.wasted_bytes)} (3.96% of the pool) in "
        "padding layer slots, this one 45.00 MiB; pool='shared' plans it as the reference does"
    )
    assert plan("gemma-3-27b").to_dict() == plan("gemma-3-27b", pool="shared").to_dict()
    given_blocks = plan("gemma-3-27b", layout="block_outer", num_blocks=1000)
    assert given_blocks.pool == "shared"


@pytest.mark.parametrize("model", kvcore.planning.list_models())
def test_two_level_waste_is_under_one_percent(model):
    """Every shipped model's two-level plan: at most 1 % of the pool holds no KV.

    gemma-3-27b layer-outer is the exception: its layers share one page, so
    ``auto`` keeps the shared pool, and its waste is the 8 padding layer slots of its
    sliding groups of 9 and 8 layers beside groups of 10 (3.96 %), which a
    layer-outer two-level pool keeps too (a block id costs one page in each
    of 10 runs); laid out block-outer the two-level pool has no padding slots
    (and ``auto`` picks it).
    """
    p = plan(model, pool="two-level")
    if model == "gemma-3-27b":
        assert p.waste_breakdown["padding layer slots"] > 0.03 * p.kv_cache_config.size_bytes
        outer = plan(model, pool="two-level", layout="block_outer")
        assert outer.waste_fraction <= 0.01
        return
    assert p.waste_fraction <= 0.01, p.waste_breakdown


def test_a_fitted_length_counts_whole_large_pages():
    """qwen3-next-80b in 2 GiB: 2,147,483,648 // 26,345,472 = 81 large pages.

    Large page 0 and 26 for the states leave 54 for attention: 54 × 67 =
    3,618 pages of 16 tokens, 57,888 tokens.
    """
    p = plan("qwen3-next-80b", memory="2GiB")
    assert p.num_blocks == 81
    assert p.max_model_len == 57_888
    assert p.notes[-1] == (
        "max_model_len lowered from the model's 262144 to 57888 tokens, the longest request "
        "that fits"
    )
    with pytest.raises(InsufficientMemoryError) as info:
        plan("qwen3-next-80b", memory="2GiB", max_model_len=262_144)
    message = str(info.value)
    assert "needs 7165968384 bytes (6.67 GiB) of KV cache, including large page 0" in message
    assert "in large pages of 26345472 bytes" in message
    assert message.endswith("lower max_model_len to at most 57888")


def test_num_blocks_counts_large_pages():
    """A 1-token request needs large page 0, one of attention and ceil(3 / 2) = 2 of states.

    With 4 large pages that holds up to 512 tokens (one state per group, 32
    attention pages); at 513 each state group holds 2 states, 3 large pages.
    """
    p = plan("qwen3-next-80b", num_blocks=300, max_model_len=1024)
    assert p.num_blocks == p.kv_cache_config.page_pool.num_large_pages == 300
    assert p.kv_cache_config.size_bytes == 300 * 26_345_472
    with pytest.raises(InsufficientMemoryError, match=r"needs 105381888 bytes \(100.50 MiB\)"):
        plan("qwen3-next-80b", num_blocks=3)
    assert plan("qwen3-next-80b", num_blocks=4).max_model_len == 512


def test_the_mamba_checkpoint_sets_the_state_grid():
    """A state every 1,024 tokens: ceil(8,192 / 1,024) + 1 = 9 per group; hits on 1,024."""
    p = plan("jamba-v0.1", mamba_checkpoint=1024)
    assert {g.block_size for g in p.groups if g.kind == "mamba"} == {1024}
    assert {g.pages_per_request for g in p.groups if g.kind == "mamba"} == {9}
    assert p.hit_alignment == 1024
    assert p.notes == (
        "recurrent states cached every 1024 tokens (mamba_checkpoint), not every attention block",
    )
    custom = plan("jamba-v0.1", block_size=48)
    assert {g.block_size for g in custom.groups} == {48, 528}  # 512 rounded up to 11 × 48
    assert custom.hit_alignment == 528


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"mamba_checkpoint": 100},
            r"positive multiple of the attention block size \(16 tokens\)"
            r": 16, 32, 48, \.\.\. \(default 512\); got 100",
        ),
        ({"mamba_checkpoint": 0}, "positive multiple"),
        ({"mamba_checkpoint": "512"}, "positive multiple"),
        (
            {"mamba_checkpoint": 512, "pool": "shared"},
            r"under pool='shared' the cached states follow the attention block size, 80 tokens "
            r"for jamba-v0.1; give 80 or leave mamba_checkpoint unset",
        ),
        (
            {"mamba_checkpoint": 512, "options": {"mamba.cache_mode": "none"}},
            "no layer of jamba-v0.1 keeps recurrent states cached on a grid",
        ),
        ({"pool": "two_level"}, "pool must be one of auto, shared, two-level, got 'two_level'"),
    ],
)
def test_bad_pool_options_are_refused(options, message):
    with pytest.raises(InvalidConfigError, match=message):
        plan("jamba-v0.1", **options)


def test_a_checkpoint_equal_to_the_shared_block_is_accepted():
    p = plan("jamba-v0.1", pool="shared", mamba_checkpoint=80)
    assert p.to_dict()["groups"] == plan("jamba-v0.1", pool="shared").to_dict()["groups"]
    with pytest.raises(InvalidConfigError, match="no layer of llama-3-8b keeps recurrent states"):
        plan("llama-3-8b", mamba_checkpoint=512)


def test_layer_specs_keep_their_natural_pages():
    """No state is padded, no attention block raised: the specs are the built ones."""
    config = plan("qwen3-next-80b").kv_cache_config
    for group in config.kv_cache_groups:
        assert all(config.layer_spec(name).page_size_padded is None for name in group.layer_names)


# -- the large page ----------------------------------------------------------------------


def test_the_lcm_is_the_large_page_while_it_is_small():
    assert choose_large_page([32_768, 1_097_728]) == (2_195_456, (32_768, 1_097_728))
    # 64 × the largest page is still the lcm: 4,096 and 64 × 4,097 (= 262,208).
    assert choose_large_page([64, 4097]) == (64 * 4097, (64, 4097))


def test_a_large_lcm_pads_the_smaller_class():
    """4,096 and 65,584 = 2^4 × 4,099 (a prime): the lcm is 256 × 65,584, over 64x.

    m = 1: the divisors of 65,584 from 4,096 up start at 4,099, 3 bytes of
    padding per page (0.07 %, under 0.5 %): the large page is 65,584.
    """
    assert choose_large_page([4096, 65_584]) == (65_584, (4099, 65_584))


def test_when_no_multiple_pads_little_the_least_padding_wins():
    """The same pages with 2-byte elements: a padded page must stay even.

    Every divisor of m × 65,584 = 16 m × 4,099 (m ≤ 64) that is at least
    4,096 is a multiple of 4,099 (16 m ≤ 1,024 < 4,096), so the smallest even
    one is 8,198 whatever m: 50 % padding; the first multiple is kept.
    """
    assert choose_large_page([4096, 65_584], [2, 2]) == (65_584, (8198, 65_584))


def test_page_classes_round_a_page_up_to_its_elements():
    """A state of 3 float64 and 5 float32 values ends at byte 24 + 20 = 44.

    Its small pages must start on 8 bytes: rounded to 48, whose lcm with a
    1,024-byte attention page (1 token, 2 heads of 128 float32 keys and
    values) is 3,072: 64 states or 3 attention pages per large page.
    """
    state = MambaSpec(block_size=16, shapes=((3,), (5,)), dtypes=("float64", "float32"))
    groups = [
        kvcore.KVCacheGroupSpec(layer_names=["m"], kv_cache_spec=state),
        kvcore.KVCacheGroupSpec(layer_names=["a"], kv_cache_spec=full(block_size=1)),
    ]
    classes = page_classes(groups, "layer_outer")
    assert classes.natural_page_bytes == (44, 1024)
    assert classes.class_page_bytes == (48, 1024)
    assert (classes.large_page_bytes, classes.lcm) == (3072, False)
    assert classes.padding_bytes(0) == 4


def test_bounds_are_what_the_docs_say():
    assert MAX_LARGE_PAGE_MULTIPLE == 64
    assert MAX_CLASS_PADDING == 0.005


@pytest.mark.parametrize(
    "pages",
    [[P, P // 2 * 3], [P, 3 * P, 7 * P], [512, 640, 2048], [18_432, 65_536, 311_296]],
)
def test_every_class_divides_the_large_page(pages):
    large, padded = choose_large_page(pages)
    assert large == math.lcm(*pages)
    assert all(large % q == 0 and q == p for p, q in zip(pages, padded, strict=True))


def test_specs_planned_by_hand_size_by_large_pages():
    """A 16 KiB attention page and a 24 KiB state, one layer each, no grouping change.

    lcm(16,384, 24,576) = 49,152: 3 attention pages or 2 states per large page,
    one run. 10 large pages: 30 attention and 20 state small-page ids, each
    view strided by its own page.
    """
    specs = {"a": full(), "m": mamba(3 * P // 2)}
    groups = natural_page_groups(specs)
    assert [(g.layer_names, g.kv_cache_spec) for g in groups] == [
        (("a",), specs["a"]),
        (("m",), specs["m"]),
    ]
    classes = page_classes(groups, "layer_outer")
    assert (classes.large_page_bytes, classes.num_runs) == (49_152, 1)
    config = two_level_config(groups, classes, 10 * 49_152 + 100)
    assert config.num_blocks == 10
    assert [(t.layers, t.block_stride, t.num_blocks) for t in config.kv_cache_tensors] == [
        (("a",), P, 30),
        (("m",), 3 * P // 2, 20),
    ]
    # One page size for both instead pads the attention page to the state's.
    shared = kvcore.planning.get_kv_cache_groups(specs)
    assert {g.kv_cache_spec.page_size_bytes for g in shared} == {3 * P // 2}


def _brute_force_large_page(pages: list[int]) -> tuple[int, tuple[int, ...]]:
    """The rule of the planning page, evaluated by trying every divisor of every multiple."""
    largest = max(pages)
    lcm = math.lcm(*pages)
    if lcm <= 64 * largest:
        return lcm, tuple(pages)
    best = None
    for m in range(1, 65):
        large = m * largest
        small = [d for d in range(1, math.isqrt(large) + 1) if large % d == 0]
        divisors = sorted({*small, *(large // d for d in small)})
        padded = tuple(next(d for d in divisors if d >= p) for p in pages)
        worst = max((q - p) / q for p, q in zip(pages, padded, strict=True))
        if worst < 0.005:
            return large, padded
        if best is None or worst < best[0]:
            best = (worst, large, padded)
    assert best is not None
    return best[1], best[2]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=5000), min_size=1, max_size=4))
def test_the_large_page_follows_the_rule(pages):
    large, padded = choose_large_page(pages)
    assert (large, padded) == _brute_force_large_page(pages)
    assert all(q >= p and large % q == 0 for p, q in zip(pages, padded, strict=True))
    assert large % max(pages) == 0


def test_the_default_grid_gives_way_to_a_manager_that_refuses_it():
    """tiny-hybrid's chunked layers need hits aligned to their 4-token block.

    States every 512 tokens would align hits to 512, so the default grid is
    the block size there; a grid given explicitly is kept (the manager
    refuses it when prefix caching is on).
    """
    from kvcore.executor import tiny_model_path

    path = tiny_model_path("tiny-hybrid")
    p = kvcore.plan(path, block_size=4, memory="1MiB", registry=registry())
    assert p.mamba_checkpoint == p.hit_alignment == 4
    assert p.notes[0].startswith(
        "recurrent states cached every 4 tokens, every attention block, not every 512: with "
        "prefix caching on, ChunkedLocalAttentionManager needs cache hits aligned to its own "
        "block size (4 tokens)"
    )
    given = kvcore.plan(path, block_size=4, memory="1MiB", registry=registry(), mamba_checkpoint=8)
    assert given.mamba_checkpoint == given.hit_alignment == 8
    with pytest.raises(InvalidConfigError, match="align hits to 8 tokens"):
        kvcore.KVCacheManager(given.kv_cache_config, given.max_model_len, registry=registry())
