"""The release-floor benchmark: its loops count like the release and change nothing they time."""

from __future__ import annotations

import pytest
from simhelpers import assert_refused, load_benchmark

from kvcore._eviction.credit import CreditQueues
from kvcore._sim import SchedulerConfig, SimulationOptions, load_workload, simulate

LIMIT = 60
MEMORY = "1GiB"
MAX_MODEL_LEN = 8192


def frequency_options() -> SimulationOptions:
    return SimulationOptions(
        model="gpt-oss-20b",
        memory=MEMORY,
        max_model_len=MAX_MODEL_LEN,
        eviction="frequency",
        scheduler=SchedulerConfig(),
    )


@pytest.fixture(scope="module")
def floor():
    return load_benchmark("eviction_release_floor")


@pytest.fixture(scope="module")
def plain():
    """The replay without any timing installed."""
    return simulate(
        load_workload(None, limit=LIMIT),
        frequency_options(),
    )


@pytest.mark.parametrize("variant", ["lru", "release", "classify"])
def test_a_timed_replay_takes_the_plain_replays_decisions(floor, plain, variant):
    durations, report = floor.replay(variant, "frequency", MEMORY, LIMIT, MAX_MODEL_LEN)
    assert plain.eviction.evicted_blocks > 0  # the pool is tight enough to evict
    assert len(durations) > 0
    assert report.prefix_cache.hit_tokens == plain.prefix_cache.hit_tokens
    assert report.eviction.evicted_blocks == plain.eviction.evicted_blocks
    assert report.preemptions == plain.preemptions
    # The real release is put back.
    assert CreditQueues.release_table.__name__ == "release_table"


def test_classify_releases_the_blocks_the_release_does(floor, monkeypatch):
    """Counted down on copies of the counts, the floor frees exactly the release's blocks."""
    checked = []
    real = CreditQueues.release_table

    def compare(self, ref, table, classes, state, hash_of=(), join_maps=()):
        counts = list(ref)
        klass_of = bytearray(len(self._class))
        floor._classify(klass_of, counts, table, classes, state)
        released = real(self, ref, table, classes, state, hash_of, join_maps)
        freed = [block for block in table if counts[block] == 0]
        assert sorted(freed) == sorted(released)
        assert [counts[block] for block in table] == [ref[block] for block in table]
        checked.append(len(released))
        return released

    monkeypatch.setattr(CreditQueues, "release_table", compare)
    simulate(
        load_workload(None, limit=LIMIT),
        frequency_options(),
    )
    assert sum(checked) > 100


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "--rounds: must be an integer >= 1, got '0'"),
        (["--limit", "1.5"], "--limit: must be an integer >= 1, got '1.5'"),
        (["--policy", "lru"], "--policy: invalid choice: 'lru'"),
    ],
)
def test_bad_arguments_are_refused_by_name(floor, capsys, argv, message):
    assert_refused(floor.main, argv, message, capsys)
