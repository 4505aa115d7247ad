"""Model configs → layer kinds → specs, and the errors of unplannable inputs."""

from __future__ import annotations

import json
import sys
import types

import pytest
from planning_helpers import BUILTIN_PLUGINS, registry

import kvcore
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    InvalidSpecError,
    PluginConflictError,
    UnknownSpecError,
)
from kvcore_plugins.full_attention import FullAttentionSpec


def kinds(model: str) -> list[str]:
    return [layer.kind for layer in kvcore.planning.load_model_config(model).layers]


def test_layer_kinds_derived_from_each_config_style():
    # gpt-oss lists layer_types with Hugging Face's name for the kind, "sliding_attention".
    assert kinds("gpt-oss-20b")[:4] == ["sliding_window", "full_attention"] * 2
    assert kinds("gemma-2-9b")[:3] == ["sliding_window", "full_attention", "sliding_window"]
    gemma3 = kinds("gemma-3-27b")
    assert [i for i, k in enumerate(gemma3) if k == "full_attention"] == list(range(5, 62, 6))
    llama4 = kinds("llama-4-scout")
    assert [i for i, k in enumerate(llama4) if k == "full_attention"] == list(range(3, 48, 4))
    assert set(llama4) == {"full_attention", "chunked_local"}
    jamba = kinds("jamba-v0.1")
    assert [i for i, k in enumerate(jamba) if k == "full_attention"] == [4, 12, 20, 28]
    qwen = kinds("qwen3-next-80b")
    assert [i for i, k in enumerate(qwen) if k == "full_attention"] == list(range(3, 48, 4))
    assert set(kinds("mistral-7b")) == {"sliding_window"}
    assert set(kinds("deepseek-v3")) == {"mla"}
    assert set(kinds("llama-3-8b")) == {"full_attention"}


def test_encoder_decoder_layers_have_self_and_cross_attention():
    config = kvcore.planning.load_model_config("whisper-large-v3")
    assert [(layer.name, layer.kind) for layer in config.layers[:2]] == [
        ("model.decoder.layers.0.self_attn", "full_attention"),
        ("model.decoder.layers.0.encoder_attn", "cross_attention"),
    ]
    assert (config.max_model_len, config.max_num_encoder_tokens) == (448, 1500)


def test_nested_text_config_is_merged_and_vision_dropped():
    config = kvcore.planning.load_model_config("gemma-3-27b")
    assert config.config["num_hidden_layers"] == 62
    assert config.dtype == "bfloat16"
    assert "vision_config" not in config.config


def test_specs_built_by_the_plugins():
    config = kvcore.planning.load_model_config("deepseek-v3")
    specs = kvcore.planning.build_layer_specs(config, registry(), block_size=64)
    spec = specs["model.layers.0.self_attn"]
    assert (type(spec).__name__, spec.head_size, spec.num_kv_heads, spec.block_size) == (
        "MLAAttentionSpec",
        576,
        1,
        64,
    )
    config = kvcore.planning.load_model_config("qwen3-next-80b")
    specs = kvcore.planning.build_layer_specs(config, registry(), block_size=16, dtype="fp8")
    state = specs["model.layers.0.linear_attn"]
    assert state.shapes == ((3, 8192), (32, 128, 128))
    assert state.dtypes == ("bfloat16", "bfloat16")  # states keep the model dtype
    assert specs["model.layers.3.self_attn"].dtype == "float8_e4m3fn"


def test_a_config_path_and_its_directory(tmp_path):
    data = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "max_position_embeddings": 1024,
        "torch_dtype": "float16",
    }
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    for source in (folder, folder / "config.json", str(folder / "config.json")):
        p = kvcore.plan(source, memory="1GiB", registry=registry())
        assert p.model == "tiny-model"
        assert p.groups[0].page_sizes == (16 * 4 * 128 * 2,)


def write_config(tmp_path, **fields) -> str:
    base = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 256,
        "max_position_embeddings": 1024,
        # The page sizes below are worked out for 2-byte elements.
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **fields}))
    return str(path)


# -- unplannable inputs -------------------------------------------------------------------


def test_unknown_model_lists_the_shipped_ones():
    with pytest.raises(InvalidConfigError) as info:
        kvcore.plan("gemma-4-1t", registry=registry())
    message = str(info.value)
    assert "unknown model 'gemma-4-1t'" in message
    assert "gemma-3-27b, gpt-oss-120b" in message


def test_memory_below_one_request_states_the_minimum():
    with pytest.raises(kvcore.errors.InsufficientMemoryError) as info:
        kvcore.plan("llama-3-8b", memory="1GiB", max_model_len=8192, registry=registry())
    message = str(info.value)
    assert "needs 1075838976 bytes (1.00 GiB)" in message
    assert "give at least 1.01 GiB (1075838976 bytes), or lower max_model_len to at most 8176" in (
        message
    )


def test_memory_below_one_token_states_the_minimum():
    with pytest.raises(kvcore.errors.InsufficientMemoryError, match="max_model_len=1 tokens needs"):
        kvcore.plan("llama-3-8b", memory="3MiB", registry=registry())


def test_layer_kind_no_plugin_recognizes(tmp_path):
    path = write_config(tmp_path, layer_types=["full_attention", "dilated_attention"])
    with pytest.raises(UnknownSpecError) as info:
        kvcore.plan(path, registry=registry())
    message = str(info.value)
    assert "layer 'model.layers.1.self_attn' has kind 'dilated_attention'" in message
    assert "sliding_window (sliding_window; also sliding_attention)" in message
    assert "kvcore_layer_kinds hook" in message


def test_layer_kind_of_an_unselected_plugin():
    only_full = kvcore.load_registry(only=["full_attention"])
    with pytest.raises(UnknownSpecError, match=r"Installed but not selected: .*sliding_window"):
        kvcore.plan("gemma-3-27b", registry=only_full)


def test_missing_config_field_is_named(tmp_path):
    path = write_config(tmp_path, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(InvalidConfigError, match=r"needs 'sliding_window' in its config\.json"):
        kvcore.plan(path, registry=registry())
    path = write_config(tmp_path, layer_types=["full_attention"])
    with pytest.raises(InvalidConfigError, match=r"one kind per layer \(2 layers"):
        kvcore.plan(path, registry=registry())


def test_pages_that_cannot_be_unified(tmp_path):
    # MLA rows (576 bf16 = 1152 bytes/token) cannot be padded to a chunked
    # layer's 8 × 256 × 2 = 4096 bytes/token page, and chunked layers rule out
    # the allocation-only fallback.
    path = write_config(
        tmp_path,
        num_key_value_heads=8,
        head_dim=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        attention_chunk_size=64,
        layer_types=["full_attention", "chunked_attention"],
    )
    with pytest.raises(InvalidConfigError) as info:
        kvcore.plan(path, registry=registry(), pool="shared")
    message = str(info.value)
    assert "layer 'model.layers.0.self_attn' (MLAAttentionSpec, page 18432 bytes)" in message
    assert "layout='block_outer'" in message
    p = kvcore.plan(path, registry=registry(), layout="block_outer", pool="shared")
    assert [g.num_layers for g in p.groups] == [1, 1]
    # The two-level pool (the default for pages that differ) needs no unification:
    # each layer keeps its page in a class of its own.
    p = kvcore.plan(path, registry=registry())
    assert p.pool == "two-level"
    assert [(g.kind, g.page_sizes) for g in p.groups] == [
        ("mla", (18_432,)),
        ("chunked_local", (65_536,)),
    ]
    assert p.page_classes.class_page_bytes == (18_432, 65_536)


def test_bad_options():
    cases = [
        ({"memory": "80G"}, "ambiguous"),
        ({"block_size": 0}, "block_size must be a positive integer"),
        ({"max_model_len": -5}, "max_model_len must be a positive integer"),
        ({"group_size_rule": "best"}, "group_size_rule must be one of reference, gcd"),
        ({"dtype": "float13"}, "dtype: unknown dtype 'float13'"),
        ({"layout": "diagonal"}, "layout must be one of layer_outer, block_outer"),
        ({"options": {"mamba.cache_mode": "all"}}, "'mamba.cache_mode' must be one of 'align'"),
        ({"options": {"mamba.mode": "none"}}, "unknown plan option 'mamba.mode'"),
    ]
    for options, message in cases:
        with pytest.raises(InvalidConfigError, match=message):
            kvcore.plan("gpt-oss-20b", registry=registry(), **options)


def test_hybrid_disabled_plan_and_unplannable_unified_mode(tmp_path):
    p = kvcore.plan("gpt-oss-20b", memory="8GiB", hybrid=False, registry=registry())
    assert p.notes[0].startswith(
        "12 sliding_window layers allocated as full_attention because the hybrid manager is "
        "disabled"
    )
    assert [g.kind for g in p.groups] == ["full_attention"]
    assert p.groups[0].num_layers == 24
    path = write_config(
        tmp_path,
        sliding_window=64,
        attention_chunk_size=64,
        layer_types=["sliding_attention", "chunked_attention"],
    )
    with pytest.raises(InvalidConfigError, match="hybrid KV cache manager is disabled"):
        kvcore.plan(path, hybrid=False, registry=registry())


# -- the kvcore_layer_kinds hook -------------------------------------------------------------


def _module_plugin(name: str, **hooks) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, kvcore.hookimpl(function))
    sys.modules[name] = module
    return module


def test_a_third_party_plugin_claims_its_own_kind(tmp_path):
    def build(layer):
        return FullAttentionSpec(
            block_size=layer.block_size, num_kv_heads=1, head_size=32, dtype=layer.dtype
        )

    def kvcore_layer_kinds():
        return {"dilated_attention": build}

    plugin = _module_plugin("kvtest_dilated_kinds", kvcore_layer_kinds=kvcore_layer_kinds)
    try:
        extended = kvcore.load_registry(
            only=[*BUILTIN_PLUGINS, "dilated"], plugins={"dilated": plugin}
        )
        path = write_config(tmp_path, layer_types=["full_attention", "dilated_attention"])
        p = kvcore.plan(path, memory="1GiB", registry=extended)
        assert p.layer_specs["model.layers.1.self_attn"].head_size == 32
    finally:
        del sys.modules["kvtest_dilated_kinds"]


def test_two_plugins_claiming_one_kind_conflict():
    def kvcore_layer_kinds():
        return {"full_attention": lambda layer: None}

    plugin = _module_plugin("kvtest_dup_kinds", kvcore_layer_kinds=kvcore_layer_kinds)
    try:
        # Refused when the registry is built, before any model is planned.
        with pytest.raises(
            PluginConflictError,
            match="layer kind 'full_attention' is claimed by plugin 'dup' and by plugin "
            "'full_attention'",
        ):
            kvcore.load_registry(only=[*BUILTIN_PLUGINS, "dup"], plugins={"dup": plugin})
    finally:
        del sys.modules["kvtest_dup_kinds"]


def test_builders_must_return_specs(tmp_path):
    def kvcore_layer_kinds():
        return {"full_attention": lambda layer: "not a spec"}

    plugin = _module_plugin("kvtest_bad_kinds", kvcore_layer_kinds=kvcore_layer_kinds)
    try:
        bad = kvcore.load_registry(only=["bad"], plugins={"bad": plugin})
        path = write_config(tmp_path, layer_types=["full_attention"] * 2)
        with pytest.raises(HookImplementationError, match="returned 'not a spec'"):
            kvcore.plan(path, registry=bad)
    finally:
        del sys.modules["kvtest_bad_kinds"]


def test_layer_config_helpers():
    layer = kvcore.planning.LayerConfig(
        name="x",
        index=0,
        kind="full_attention",
        model="m",
        config={"num_attention_heads": 8, "hidden_size": 512},
        block_size=16,
        dtype="bfloat16",
        state_dtype="bfloat16",
        max_model_len=128,
    )
    assert (layer.num_kv_heads, layer.head_size) == (8, 64)
    assert layer.get("missing", "hidden_size") == 512
    with pytest.raises(InvalidConfigError, match=r"model 'm': layer 'x' .* needs 'window'"):
        layer.require("window")


def test_allocation_only_fallback_through_a_config(tmp_path):
    # MLA pages (18,432 bytes) do not divide the window layer's (65,536) and
    # MLA cannot pad: the window is allocated as full attention instead.
    path = write_config(
        tmp_path,
        num_key_value_heads=8,
        head_dim=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        sliding_window=128,
        layer_types=["full_attention", "sliding_attention"],
    )
    p = kvcore.plan(path, memory="1GiB", registry=registry(), pool="shared")
    (group,) = p.groups
    assert group.num_layers == 2
    assert group.page_sizes == (18_432, 65_536)
    assert p.notes == (
        "1 sliding_window layers allocated as full_attention because their pages cannot be "
        "unified with the others (allocation-only fallback); their attention compute is "
        "unchanged, their memory savings are lost",
    )
    promoted = p.kv_cache_config.layer_spec("model.layers.1.self_attn")
    assert type(promoted).__name__ == "FullAttentionSpec"
    assert promoted.compute_spec == p.layer_specs["model.layers.1.self_attn"]
    assert promoted.compute_spec.sliding_window == 128


def test_a_shipped_name_wins_over_a_folder_of_the_same_name(tmp_path, monkeypatch):
    (tmp_path / "llama-3-8b").mkdir()
    monkeypatch.chdir(tmp_path)
    assert kvcore.planning.load_model_config("llama-3-8b").source.endswith("models/llama-3-8b.json")
    with pytest.raises(InvalidConfigError, match=r"no model config at '\./llama-3-8b'"):
        kvcore.planning.load_model_config("./llama-3-8b")


def test_hidden_state_and_mamba2_kinds_from_a_config(tmp_path):
    path = write_config(
        tmp_path,
        num_hidden_layers=4,
        sliding_window=128,
        num_hidden_state_vectors=3,
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_d_conv=4,
        layer_types=["full_attention", "sliding_attention", "mamba2", "hidden_state"],
    )
    p = kvcore.plan(path, memory="1GiB", max_model_len=1024, registry=registry(), pool="shared")
    specs = p.layer_specs
    assert specs["model.layers.2.self_attn"].shapes == ((3, 512 + 2 * 128), (8, 64, 128))
    assert specs["model.layers.3.self_attn"].num_kv_heads == 3
    assert [g.kind for g in p.groups] == [
        "full_attention",
        "sliding_window",
        "mamba",
        "hidden_state",
    ]
    # State (3 × 768 + 8 × 64 × 128) × 2 bytes = 135,680; attention 4 × 128 × 2 = 1,024
    # bytes per token: the block grows to 16 × ceil(135,680 / 16,384) = 144 tokens.
    assert {g.block_size for g in p.groups[:3]} == {144}
    assert {g.page_sizes for g in p.groups} == {(147_456,)}
    # Hidden states, 3 × 256 × 2 = 1,536 bytes per token: at most 96 tokens fit the
    # page, and the largest divisor of 144 up to 96 is 72.
    assert p.groups[3].block_size == 72


def test_sink_length_the_raised_block_size_does_not_divide(tmp_path):
    path = write_config(
        tmp_path,
        sink_len=64,
        mamba_n_heads=8,
        mamba_d_head=64,
        mamba_d_state=128,
        mamba_d_conv=4,
        layer_types=["sink_full_attention", "mamba2"],
    )
    with pytest.raises(
        InvalidSpecError,
        match=r"layer 'model.layers.0.self_attn': the attention block size must grow to 144 "
        r"tokens .*sink_len \(64\) must be a multiple of block_size \(144\)",
    ):
        kvcore.plan(path, registry=registry(), pool="shared")


def test_sink_blocks_are_reserved_by_the_manager_as_planned(tmp_path):
    path = write_config(tmp_path, sink_len=64, layer_types=["sink_full_attention"] * 2)
    # 97 blocks: 3 requests of 512 tokens (32 blocks) would fit without the 4 sink
    # blocks and the null block; with them, 2.
    p = kvcore.plan(path, num_blocks=97, max_model_len=512, registry=registry())
    assert p.memory_needed_bytes == (32 + 4 + 1) * p.bytes_per_block
    assert p.max_concurrency == (97 - 4) / 32
    manager = kvcore.KVCacheManager(p.kv_cache_config, p.max_model_len, registry=registry())
    admitted = 0
    for i in range(3):
        request = kvcore.Request(f"r{i}", prompt_token_ids=list(range(512)))
        if manager.allocate_slots(request, 512) is not None:
            admitted += 1
    assert admitted == int(p.max_concurrency) == 2
