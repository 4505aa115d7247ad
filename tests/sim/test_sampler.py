"""The usage sampler: evenly spaced samples, and the same ones from a later first interval."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvcore._sim.metrics import Sample, Sampler, first_interval


def sampled_steps(sampler: Sampler, steps: int) -> tuple[list[int], int]:
    for step in range(1, steps + 1):
        if sampler.wants(step):
            sampler.add(
                Sample(
                    step=step,
                    time_s=0.0,
                    used_blocks=0,
                    group_blocks=(),
                    running=0,
                    waiting=0,
                    hit_rate=0.0,
                )
            )
    return [sample.step for sample in sampler.samples], sampler.interval


def test_a_full_buffer_drops_every_other_sample():
    # Capacity 4: steps 1-4 fill it, 2 and 4 stay; then every 2nd step: 6, 8 fill it again.
    assert sampled_steps(Sampler(4), 9) == ([4, 8], 4)


def test_first_interval_by_hand():
    assert first_interval(0, 512) == 1
    assert first_interval(1023, 512) == 1
    assert first_interval(1024, 512) == 2
    assert first_interval(16_101, 512) == 16  # 16 * 512 = 8,192 <= 16,101 < 32 * 512


@pytest.mark.parametrize("interval", [0, 3, 6])
def test_the_first_interval_is_a_power_of_two(interval):
    with pytest.raises(ValueError, match="interval must be a power of two"):
        Sampler(8, interval)


@given(
    capacity=st.integers(2, 40),
    steps=st.integers(1, 3000),
    known=st.floats(0.0, 1.0),
)
def test_starting_later_keeps_the_same_samples(capacity, steps, known):
    """Any lower bound on the run's length gives an interval that changes nothing kept."""
    interval = first_interval(int(known * steps), capacity)
    assert sampled_steps(Sampler(capacity, interval), steps) == sampled_steps(
        Sampler(capacity), steps
    )
