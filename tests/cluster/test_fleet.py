"""The fleet simulation: engines behind a router, events through the index (embedded or Redis)."""

from __future__ import annotations

import json

import attrs
import pytest
from protocol_adapters import ReferenceLRU

from kvcore._cli.main import main
from kvcore._sim.ceiling import prefix_reuse_ceiling
from kvcore._sim.fleet import FleetOptions, format_fleet_report, simulate_fleet
from kvcore._sim.simulate import SimulationOptions
from kvcore._sim.workload import Workload
from kvcore._trace import TraceRequest, trace_request_to_json
from kvcore.eviction import PoolInfo

OPTIONS = SimulationOptions(memory="4GiB", max_model_len=4096)


def conversations(num: int = 6, turns: int = 4) -> Workload:
    """Multi-turn conversations sharing a 64-token system prompt; turns 20 s apart."""
    system = list(range(1, 65))
    requests = []
    for turn in range(turns):
        for conv in range(num):
            own = [10_000 * (conv + 1) + i for i in range(48 * (turn + 1))]
            tokens = tuple(system + own)
            requests.append(
                TraceRequest(
                    request_id=f"c{conv}-t{turn}",
                    arrival_ms=20_000.0 * turn + 500.0 * conv,
                    input_length=len(tokens),
                    output_length=4,
                    token_ids=tokens,
                )
            )
    return Workload(name="conversations", requests=tuple(requests))


def test_prefix_routing_reaches_the_single_cache_ceiling_and_round_robin_does_not():
    workload = conversations(5, 4)
    # With room for everything, the best any router can do is what one
    # unbounded cache would hit (16-token blocks: gpt-oss-20b's).
    ceiling = prefix_reuse_ceiling(workload.requests, 16)
    prefix = simulate_fleet(workload, OPTIONS, FleetOptions(engines=3, router="prefix"))
    rr = simulate_fleet(workload, OPTIONS, FleetOptions(engines=3, router="round_robin"))
    assert prefix.hit_tokens == ceiling.reusable_tokens > 0
    assert rr.hit_tokens < prefix.hit_tokens
    # Round robin over 3 engines, 5 conversations a turn: conversation c's turn
    # t goes to engine (5t + c) mod 3, so turns 1 and 2 land where the
    # conversation never was (they find the 64-token system prompt) and turn 3
    # where turn 0 was (64 + 48 tokens). The first request on each engine
    # finds nothing: 17 requests x 64 + 5 x 48.
    assert rr.hit_tokens == 17 * 64 + 5 * 48
    assert sum(e.requests for e in prefix.engines) == len(workload.requests)
    assert prefix.index.queries == len(workload.requests)
    assert prefix.index.block_ops > 0
    assert prefix.preemptions == 0


def test_least_loaded_and_random_route_every_request():
    workload = conversations(3, 3)
    for router in ("least_loaded", "random"):
        report = simulate_fleet(workload, OPTIONS, FleetOptions(engines=2, router=router))
        assert sum(e.requests for e in report.engines) == 9
        assert report.index.queries == 0


def test_every_engine_of_a_fleet_uses_the_eviction_policy():
    built = []

    def recording_lru(info: PoolInfo) -> ReferenceLRU:
        built.append(info.num_blocks)
        return ReferenceLRU(info.num_blocks)

    options = attrs.evolve(OPTIONS, eviction=recording_lru)
    report = simulate_fleet(conversations(3, 2), options, FleetOptions(engines=3))
    assert built == [report.num_blocks] * 3


def test_a_redis_index_routes_exactly_as_the_embedded_one(redis_session):
    workload = conversations()
    embedded = simulate_fleet(workload, OPTIONS, FleetOptions(engines=3))
    redis = simulate_fleet(workload, OPTIONS, FleetOptions(engines=3, index=redis_session.url))
    assert redis.index.backend == "redis"
    assert [(e.requests, e.hit_tokens) for e in redis.engines] == [
        (e.requests, e.hit_tokens) for e in embedded.engines
    ]
    assert redis.index.block_ops == embedded.index.block_ops
    text = format_fleet_report(redis)
    assert "index redis (hybrid-aware)" in text


def write_trace(path, workload):
    path.write_text("".join(trace_request_to_json(r) + "\n" for r in workload.requests))
    return str(path)


def test_the_cli_runs_a_fleet(tmp_path, capsys):
    trace = write_trace(tmp_path / "conv.jsonl", conversations())
    argv = ["simulate", "--trace", trace, "--memory", "4GiB", "--max-model-len", "4096"]
    assert main([*argv, "--engines", "3", "--router", "round_robin"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kvcore simulate: gpt-oss-20b on ")
    assert "3 engines x 4GiB" in out
    assert "router round_robin" in out
    for label in ("fleet", "requests", "prefix hits", "load", "index", "wall time"):
        assert f"  {label}" in out
    assert main([*argv, "--engines", "2", "--scoring", "all-alike", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fleet"]["hybrid_aware"] is False
    assert len(report["engines"]) == 2
    assert report["requests"] == 24


def test_the_cli_runs_a_fleet_against_redis(tmp_path, capsys, redis_session):
    trace = write_trace(tmp_path / "conv.jsonl", conversations(3, 2))
    argv = ["simulate", "--trace", trace, "--memory", "4GiB", "--max-model-len", "4096"]
    assert main([*argv, "--engines", "2", "--index", redis_session.url]) == 0
    assert "index redis (hybrid-aware)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engines", "0"], "--engines must be an integer from 1 to 1024, got 0"),
        (["--engines", "2", "--index", "localhost:6379"], "--index takes redis://"),
        (["--engines", "2", "--time-scale", "0"], "--time-scale must be a number > 0"),
        (["--engines", "2", "--arrival", "asap"], "use --arrival timestamp"),
        (["--engines", "2", "--plot", "x.png"], "--plot draws one engine's run"),
        (["--engines", "2", "--execute"], "--execute checks one engine's cache with a tiny model"),
        (["--engines", "2", "--eviction", "belady"], "a fleet's engines take an online policy"),
        (["--engines", "2", "--with-belady"], "the offline optimum"),
        (["--engines", "2", "--eviction", "lur"], "unknown eviction policy 'lur'"),
        (["--router", "random"], "--router applies to a fleet; add --engines N"),
        (["--index", "redis://127.0.0.1:1"], "--index applies to a fleet; add --engines N"),
    ],
)
def test_bad_fleet_options_are_one_line_errors(capsys, extra, message):
    assert main(["simulate", "--limit", "5", "--memory", "4GiB", *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvcore: error: ")
    assert message in err


def test_an_unreachable_redis_is_a_clear_error(capsys):
    argv = ["simulate", "--limit", "5", "--memory", "4GiB", "--engines", "2"]
    assert main([*argv, "--index", "redis://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "redis backend is unreachable" in err
