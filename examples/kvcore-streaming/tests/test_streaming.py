"""The streaming example plugin, installed as its own distribution, end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kvcore_streaming import StreamingManager, StreamingSpec

import kvcore
from kvcore.testing import admit, check_plugin

PLUGINS = ["streaming", "full_attention"]


def spec(**overrides: object) -> StreamingSpec:
    fields: dict[str, object] = {
        "block_size": 4,
        "num_kv_heads": 1,
        "head_size": 8,
        "dtype": "float16",
        "sink_tokens": 4,
        "sliding_window": 8,
    }
    fields.update(overrides)
    return StreamingSpec(**fields)  # type: ignore[arg-type]


def registry() -> kvcore.Registry:
    return kvcore.load_registry(only=PLUGINS)


def test_it_is_discovered_through_its_entry_point():
    (plugin,) = [p for p in registry().plugins if p.name == "streaming"]
    assert (plugin.distribution, plugin.module) == ("kvcore-streaming", "kvcore_streaming")
    assert registry().manager_class(spec()) is StreamingManager
    assert [kind.name for kind in plugin.layer_kinds] == ["streaming"]


def test_a_query_reads_the_sinks_and_the_window():
    s = spec()
    assert s.tokens_read(3) == (range(3),)
    assert s.tokens_read(10) == (range(4), range(4, 10))  # the window reaches the sinks
    assert s.tokens_read(20) == (range(4), range(13, 20))


def test_the_gap_between_sinks_and_window_is_freed():
    """Block 4, 1 sink block, window 8: after 24 tokens the next query reads 0-3 and 17-24."""
    config = kvcore.KVCacheConfig.from_specs(16, [spec()])
    manager = kvcore.KVCacheManager(config, 128, registry=registry())
    request = kvcore.Request("a", list(range(24)))
    admit(manager, request)
    assert manager.get_block_ids("a") == ([1, 2, 3, 4, 5, 6],)
    request.append_output_token_ids(99)
    manager.allocate_slots(request, 1)
    # Tokens 4-15 (blocks 1-3 of the table) are read by no later query.
    assert manager.get_block_ids("a") == ([1, 0, 0, 0, 5, 6, 7],)
    assert manager.num_free_blocks == 16 - 1 - 4


def test_a_hit_needs_only_the_sinks_and_the_window():
    config = kvcore.KVCacheConfig.from_specs(16, [spec()])
    manager = kvcore.KVCacheManager(config, 128, registry=registry())
    first = kvcore.Request("a", list(range(24)))
    admit(manager, first)
    first.append_output_token_ids(99)
    manager.allocate_slots(first, 1)  # caches the 6 full blocks, frees blocks 2-4
    manager.free(first)
    second = kvcore.Request("b", [*range(24), 7, 7, 7, 7])
    hit, num_hit = manager.get_computed_blocks(second)
    # A hit of 24 tokens needs block 0 (sinks) and blocks 4-5 (tokens 17-23).
    assert (num_hit, hit.get_block_ids()) == (24, ([1, 0, 0, 0, 5, 6],))


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"block_size": 16, "sink_tokens": 4, "sliding_window": 64},
        {"block_size": 16, "sink_tokens": 20, "sliding_window": 100},
        {"block_size": 16, "sink_tokens": 32, "sliding_window": 32},
    ],
    ids=repr,
)
def test_it_passes_the_conformance_kit(fields):
    report = check_plugin(spec(**fields), registry=registry(), num_ops=200)
    assert report.skipped == ()
    assert "hybrid_workload" in report.passed


def write_config(tmp_path, **fields):
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 512,
        "max_position_embeddings": 4096,
        "streaming_sink_tokens": 4,
        "streaming_window": 256,
        **fields,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_it_is_planned_from_a_config_next_to_full_attention(tmp_path):
    path = write_config(tmp_path, layer_types=["streaming", "full_attention"] * 2)
    plan = kvcore.plan(path, memory="64MiB", max_num_batched_tokens=512, registry=registry())
    # Per request of 4096 tokens: 1 sink block + ceil((255 + 512) / 16) = 48 + 1 partial = 50.
    assert [(g.kind, g.num_layers, g.pages_per_request) for g in plan.groups] == [
        ("streaming", 2, 50),
        ("full_attention", 2, 256),
    ]
    state = plan.layer_specs["model.layers.0.self_attn"]
    assert (state.sink_tokens, state.sliding_window) == (4, 256)


def test_its_own_fields_are_recognized_without_layer_types(tmp_path):
    config = kvcore.planning.load_model_config(write_config(tmp_path), registry())
    assert config.kinds == {"streaming": 4}


def test_a_missing_field_is_named(tmp_path):
    path = write_config(tmp_path, streaming_window=None, layer_types=["streaming"] * 4)
    with pytest.raises(kvcore.errors.InvalidConfigError, match="needs 'streaming_window'"):
        kvcore.plan(path, registry=registry())


def test_it_is_simulated(tmp_path):
    path = write_config(tmp_path, layer_types=["streaming", "full_attention"] * 2)
    argv = ["simulate", path, "--memory", "64MiB", "--limit", "40", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "kvcore", *argv, "--only", ",".join(PLUGINS)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(out)
    groups = {g["kind"]: g for g in report["blocks"]["groups"]}
    assert set(groups) == {"streaming", "full_attention"}
    # The windowed group holds far fewer blocks than the full-attention one.
    assert groups["streaming"]["peak"] < groups["full_attention"]["peak"]
    assert report["finished"] > 0
