"""The seeded workload generator."""

from __future__ import annotations

import pytest

from kvcore._sim.generator import GeneratorConfig, generate_workload
from kvcore._sim.workload import load_workload, write_workload
from kvcore._trace import MOONCAKE_BLOCK_TOKENS, read_trace
from kvcore.errors import InvalidConfigError


def test_same_seed_same_workload_other_seed_other_workload():
    first = generate_workload(GeneratorConfig(num_requests=200, seed=1))
    assert first == generate_workload(GeneratorConfig(num_requests=200, seed=1))
    assert first != generate_workload(GeneratorConfig(num_requests=200, seed=2))


def test_shape_of_the_default_workload():
    requests = generate_workload()
    assert len(requests) == GeneratorConfig().num_requests
    arrivals = [r.arrival_ms for r in requests]
    assert arrivals == sorted(arrivals)
    assert len({r.request_id for r in requests}) == len(requests)
    lengths = sorted(r.input_length for r in requests)
    assert 1000 < lengths[len(lengths) // 2] < 10_000  # median prompt
    assert max(r.input_length + r.output_length for r in requests) <= 32_768
    assert any(r.request_id.endswith("t3") for r in requests)  # multi-turn


def test_equal_ids_mean_equal_content():
    """An id always sits at the same position after the same ids (the Mooncake contract)."""
    requests = generate_workload(GeneratorConfig(num_requests=500, seed=3))
    context_of: dict[int, tuple[int, ...]] = {}
    for request in requests:
        ids = request.hash_ids
        assert len(ids) == -(-request.input_length // MOONCAKE_BLOCK_TOKENS)
        for position, hash_id in enumerate(ids):
            assert context_of.setdefault(hash_id, ids[:position]) == ids[:position]


def test_a_later_turn_extends_the_earlier_one():
    requests = generate_workload(GeneratorConfig(num_requests=300, seed=4))
    by_id = {r.request_id: r for r in requests}
    pairs = [
        (by_id[r.request_id.replace("t1", "t0")], r)
        for r in requests
        if r.request_id.endswith("t1")
    ]
    assert pairs
    for first, second in pairs:
        assert second.arrival_ms > first.arrival_ms
        assert second.input_length > first.input_length + first.output_length
        shared = first.prompt_token_ids
        assert second.prompt_token_ids[: len(shared)] == shared


def test_written_workload_reads_back(tmp_path):
    requests = generate_workload(GeneratorConfig(num_requests=50, seed=9))
    path = tmp_path / "w.jsonl"
    assert write_workload(requests, path) == 50
    assert read_trace(path).requests == requests


def test_built_in_workload_options():
    workload = load_workload(limit=30, seed=7)
    assert len(workload.requests) == 30
    assert workload.name == "built-in (seed 7, 30 requests)"
    with pytest.raises(InvalidConfigError, match="--skip-bad-lines applies to a --trace"):
        load_workload(skip_bad_lines=True)
    with pytest.raises(InvalidConfigError, match="--limit must be a positive integer"):
        load_workload(limit=0)


def test_generator_config_is_validated():
    with pytest.raises(InvalidConfigError, match="conversations_per_s must be > 0"):
        GeneratorConfig(conversations_per_s=0)
