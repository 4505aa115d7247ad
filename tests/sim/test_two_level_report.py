"""What ``kvcore simulate`` reports for a two-level pool, worked out by hand.

qwen3-next-80b plans, at the planner's defaults: under ``pool="two-level"``
a 16-token full-attention group (class 0: 32 KiB pages, 67 to a large page)
and three Mamba groups checkpointed every 512 tokens (class 1: 1.05 MiB
pages, 2 to a large page); under ``pool="shared"`` four groups of 544-token
blocks. Both pools' finest block is 16 tokens (the layers as built).
"""

from __future__ import annotations

import pytest
from simhelpers import explicit

from kvcore._plugin_loader import load_registry
from kvcore._sim import SimulationOptions, simulate
from kvcore._sim.plot import group_shares
from kvcore._sim.report import format_report
from kvcore._sim.simulate import plan_for
from kvcore._sim.workload import Workload

MODEL = "qwen3-next-80b"


def _options(pool: str, memory: str = "2GiB") -> SimulationOptions:
    return SimulationOptions(model=MODEL, memory=memory, max_model_len=8192, pool=pool)


def _prefix_pair() -> Workload:
    """A 1,000-token prompt, then one sharing its first 600 tokens, arriving after it ended."""
    first = explicit("a", range(1000), 3)
    second = explicit("b", [*range(600), *range(5000, 5400)], 3, at_ms=10_000.0)
    return Workload(name="hand", requests=(first, second))


@pytest.mark.parametrize(
    ("pool", "grid", "ceiling", "hit"),
    [
        # The hit grid is lcm(16, 512) = 512: 600 shared tokens give one 512 block.
        ("two-level", 512, 512, 512),
        # One 544-token block of the 600 shared ones.
        ("shared", 544, 544, 544),
    ],
)
def test_the_ceiling_is_given_at_the_hit_grid_and_at_16_tokens(pool, grid, ceiling, hit):
    report = simulate(_prefix_pair(), _options(pool))
    pc = report.prefix_cache
    assert (pc.ceiling_block_size, pc.ceiling_tokens) == (grid, ceiling)
    # 600 shared tokens hold 37 whole 16-token blocks: 592 tokens, whatever the pool.
    assert (pc.fine_block_size, pc.fine_ceiling_tokens) == (16, 592)
    assert pc.hit_tokens == hit
    assert pc.prompt_tokens == 2000
    assert pc.fine_ceiling_rate == pytest.approx(592 / 2000)
    assert pc.fraction_of_fine_ceiling == pytest.approx(hit / 592)
    text = format_report(report)
    assert f"at {grid}-token blocks" in text
    assert "at 16-token blocks" in text
    data = report.to_dict()["prefix_cache"]
    assert data["fine_ceiling_tokens"] == 592
    assert data["fraction_of_fine_ceiling"] == pytest.approx(hit / 592)


def test_one_request_in_a_two_level_pool_is_counted_in_large_pages_and_by_class():
    # A 1,000-token prompt with three output tokens runs three steps:
    # step 1 prefills it: 63 attention pages (1,000 / 16 rounded up) in one
    #   large page of class 0, and 2 states (1,000 / 512 rounded up) in each
    #   of the three Mamba groups: 6 class-1 pages, 3 large pages;
    # step 2 decodes: the Mamba groups free the state at 512 (every token it
    #   covers is behind the last computed one), 3 class-1 pages are left,
    #   one in each of the 3 large pages;
    # step 3 decodes the last token and frees the request.
    workload = Workload(name="hand", requests=(explicit("a", range(1000), 3),))
    options = _options("two-level")
    report = simulate(workload, options)
    usable = plan_for(options, load_registry()).num_blocks - 1
    blocks = report.blocks
    assert blocks.unit == "large pages"
    assert blocks.usable == usable
    assert report.steps.count == 3
    assert blocks.peak == 4  # large pages holding a block in use, steps 1 and 2
    assert blocks.mean == pytest.approx((4 + 4 + 0) / 3)
    step_1 = 63 / 67 + 6 / 2  # large pages' worth of memory in blocks in use
    step_2 = 63 / 67 + 3 / 2
    assert blocks.peak_memory_usage == pytest.approx(step_1 / usable)
    assert blocks.mean_memory_usage == pytest.approx((step_1 + step_2) / 3 / usable)
    # The cached prefixes keep every page owned after the request ends.
    owned = [(c.page_class, c.groups, c.peak) for c in blocks.classes]
    assert owned == [(0, (3,), 1), (1, (0, 1, 2), 3)]
    assert [s.class_pages for s in report.samples] == [(1, 3)] * 3
    assert [g.peak for g in blocks.groups] == [2, 2, 2, 63]
    shares = group_shares(report)
    assert shares[tuple(n / 2 / usable for n in (2, 1, 0))] == list(blocks.groups[:3])
    assert shares[tuple(n / 67 / usable for n in (63, 63, 0))] == [blocks.groups[3]]
    text = format_report(report)
    assert f"pool of {usable:,} large pages: peak 4" in text
    assert "class 1 (1.05 MiB pages, groups 0, 1, 2): peak 3" in text


def test_a_shared_pool_counts_blocks_and_its_memory_use_is_its_block_use():
    # 544-token blocks: step 1 holds 2 blocks in each of the four groups (8),
    # step 2 the Mamba groups free their first (5), step 3 frees the request.
    workload = Workload(name="hand", requests=(explicit("a", range(1000), 3),))
    report = simulate(workload, _options("shared"))
    blocks = report.blocks
    assert blocks.unit == "blocks"
    assert (blocks.peak, blocks.mean) == (8, pytest.approx(13 / 3))
    assert blocks.peak_memory_usage == pytest.approx(8 / blocks.usable)
    assert blocks.mean_memory_usage == pytest.approx(13 / 3 / blocks.usable)
    assert blocks.classes == ()
    assert "holding a block in use" not in format_report(report)


def test_peak_running_requests():
    # Three prompts arrive at once and are prefilled in step 1; with 2, 3 and
    # 4 output tokens they end in steps 2, 3 and 4: 3, 2, 1, 0 running.
    workload = Workload(
        name="hand",
        requests=tuple(
            explicit(name, range(1000 * i, 1000 * i + 100), output)
            for i, (name, output) in enumerate([("a", 2), ("b", 3), ("c", 4)])
        ),
    )
    report = simulate(workload, _options("two-level"))
    assert report.steps.count == 4
    assert report.steps.peak_running == 3
    assert report.steps.mean_running == pytest.approx((3 + 2 + 1 + 0) / 4)
    assert "3 at most" in format_report(report)


def test_the_offline_optimum_replays_a_two_level_pool():
    # One oracle per page class, sharing the future uses: with room for
    # everything it hits what LRU hits, the one 512-token block.
    options = SimulationOptions(
        model=MODEL, memory="2GiB", max_model_len=8192, pool="two-level", with_belady=True
    )
    report = simulate(_prefix_pair(), options)
    assert report.prefix_cache.hit_tokens == 512
    assert report.eviction.belady_hit_tokens == 512
