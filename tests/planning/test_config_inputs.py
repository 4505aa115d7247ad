"""Bad ``config.json`` inputs: a named kvcore error naming the file, the field and the fix.

Each case used to escape as a raw Python exception (UnicodeDecodeError,
RecursionError, ZeroDivisionError, ValueError) or to be silently truncated
(a fractional head count) or reported on (a model without layers).
"""

from __future__ import annotations

import json
import re
import types

import pytest
from planning_helpers import BUILTIN_PLUGINS, registry

import kvcore
from kvcore._cli.main import main
from kvcore.errors import InvalidConfigError, UnknownSpecError

BASE = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 256,
    "max_position_embeddings": 1024,
}


def write(tmp_path, **fields) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE, **fields}))
    return str(path)


def refusal(path: str) -> str:
    with pytest.raises(InvalidConfigError) as info:
        kvcore.plan(path, memory="1GiB", registry=registry())
    message = str(info.value)
    assert path in message or repr(path) in message, message
    return message


def test_a_config_that_is_not_utf8(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"num_hidden_layers": 2, "name": "caf\xe9"}')
    message = refusal(str(path))
    assert "is not UTF-8 text (byte 0xe9 at offset 37); save the config.json as UTF-8" in message


def test_deeply_nested_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nests JSON values too deeply to read" in refusal(str(path))


def test_an_integer_too_long_to_convert(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    assert "is not valid JSON: " in refusal(str(path))


def test_zero_attention_heads_without_head_dim(tmp_path):
    """Formerly ZeroDivisionError: head size = hidden size / heads."""
    message = refusal(write(tmp_path, num_attention_heads=0))
    assert message.startswith(f"model '{tmp_path.name}' ({tmp_path / 'config.json'}): ")
    assert (
        "layer 'model.layers.0.self_attn' (full_attention): num_attention_heads must be an "
        "integer >= 1, got 0; fix num_attention_heads in the config.json"
    ) in message


@pytest.mark.parametrize(
    ("fields", "field", "value"),
    [
        ({"num_key_value_heads": "eight"}, "num_key_value_heads", "'eight'"),
        ({"head_dim": "64"}, "head_dim", "'64'"),
        ({"max_position_embeddings": "lots"}, "max_position_embeddings", "'lots'"),
        ({"num_hidden_layers": "two"}, "num_hidden_layers", "'two'"),
        (
            {"sliding_window": "big", "layer_types": ["sliding_attention"] * 2},
            "sliding_window",
            "'big'",
        ),
        ({"num_key_value_heads": True}, "num_key_value_heads", "True"),
    ],
)
def test_words_in_numeric_fields(tmp_path, fields, field, value):
    """Formerly ValueError from int(), or True taken as 1."""
    message = refusal(write(tmp_path, **fields))
    assert f"{field} must be an integer >= 1, got {value}; fix {field} in the config.json" in (
        message
    )


@pytest.mark.parametrize("field", ["num_key_value_heads", "num_attention_heads", "head_dim"])
def test_fractional_head_counts(tmp_path, field):
    """Formerly truncated by int(): 2.5 heads planned as 2."""
    message = refusal(write(tmp_path, **{field: 2.5}))
    assert f"{field} must be an integer >= 1, got 2.5" in message


def test_integral_floats_are_whole_numbers(tmp_path):
    p = kvcore.plan(write(tmp_path, num_key_value_heads=2.0), memory="1GiB", registry=registry())
    # 16 tokens x 2 KV heads x (64 + 64) x 4 bytes (float32: the config names no dtype)
    assert p.groups[0].page_sizes == (16384,)


def test_a_hidden_size_the_heads_do_not_divide(tmp_path):
    message = refusal(write(tmp_path, num_attention_heads=3))
    assert "the hidden size (256) is not a multiple of num_attention_heads (3)" in message
    assert "give head_dim in the config.json" in message


def test_a_zero_layer_model_is_refused(tmp_path):
    message = refusal(write(tmp_path, num_hidden_layers=0))
    assert "num_hidden_layers must be an integer >= 1, got 0" in message
    fields = {"is_encoder_decoder": True, "decoder_layers": 0, "max_source_positions": 8}
    assert "decoder_layers must be an integer >= 1, got 0" in refusal(write(tmp_path, **fields))


def test_a_model_whose_layers_hold_no_cache_is_refused(tmp_path):
    def kvcore_model_layers(model):
        return []  # e.g. a plugin that knows the model's layers keep no KV cache

    recognizer = types.SimpleNamespace(kvcore_model_layers=kvcore.hookimpl(kvcore_model_layers))
    plugins = kvcore.load_registry(only=[*BUILTIN_PLUGINS, "empty"], plugins={"empty": recognizer})
    with pytest.raises(InvalidConfigError, match="the config describes no cache-holding layer"):
        kvcore.planning.load_model_config(write(tmp_path), plugins)


def test_layer_types_that_are_not_strings(tmp_path):
    message = refusal(write(tmp_path, layer_types=["full_attention", 7]))
    assert "layer_types must list one kind per layer (2 layers, num_hidden_layers), as strings" in (
        message
    )


def test_a_bad_dtype_names_the_file(tmp_path):
    message = refusal(write(tmp_path, torch_dtype="float13"))
    assert "torch_dtype: unknown dtype 'float13'" in message
    assert "fix torch_dtype in the config.json" in message


def test_the_cli_prints_it_in_one_line(tmp_path, capsys):
    path = write(tmp_path, num_attention_heads=2.5)
    assert main(["plan", path, "--only", ",".join(BUILTIN_PLUGINS)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"kvcore: error: model '{tmp_path.name}' ({path}): layer ")
    assert "num_attention_heads must be an integer >= 1, got 2.5" in err


# -- kinds, aliases and the recognition hook ------------------------------------------------


def test_hugging_face_kind_names_are_accepted_silently(tmp_path):
    # pytest turns warnings into errors: an alias of the HF vocabulary must not warn.
    path = write(
        tmp_path,
        sliding_window=64,
        attention_chunk_size=64,
        layer_types=["sliding_attention", "chunked_attention"],
    )
    config = kvcore.planning.load_model_config(path, registry())
    assert [layer.kind for layer in config.layers] == ["sliding_window", "chunked_local"]


def test_a_former_kvcore_kind_name_warns_and_still_plans(tmp_path):
    path = write(
        tmp_path,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        layer_types=["mla_attention", "mla_attention"],
    )
    with pytest.warns(
        DeprecationWarning,
        match=re.escape("layer kind 'mla_attention' is deprecated; it is now called 'mla'"),
    ):
        p = kvcore.plan(path, memory="1GiB", registry=registry())
    assert [(g.kind, g.num_layers) for g in p.groups] == [("mla", 2)]


def test_a_plain_decoder_is_not_assumed_when_its_fields_say_otherwise():
    only_full = kvcore.load_registry(only=["full_attention"])
    with pytest.raises(UnknownSpecError) as info:
        kvcore.planning.load_model_config("mistral-7b", only_full)
    message = str(info.value)
    assert "no selected kvcore plugin recognizes its layers (plugins asked: full_attention)" in (
        message
    )
    assert "Installed but not selected: " in message
    assert "sliding_window" in message
    assert [
        layer.kind for layer in kvcore.planning.load_model_config("llama-3-8b", only_full).layers
    ] == ["full_attention"] * 32


def test_the_first_recognizer_wins_in_pluggy_order():
    """MLA is asked first (tryfirst): with kv_lora_rank its full-attention layers cache latents."""
    asked = [call.plugin for call in registry().hook_calls["kvcore_model_layers"]]
    assert asked[0] == "mla"
    assert asked[-1] == "full_attention"
    assert set(asked) == {
        "mla",
        "sliding_window",
        "mamba",
        "cross_attention",
        "chunked_local",
        "full_attention",
    }


# -- plan options ----------------------------------------------------------------------


def test_plan_options_reach_the_builders_of_their_plugin():
    aligned = kvcore.plan("jamba-v0.1", memory="8GiB", registry=registry())
    single = kvcore.plan(
        "jamba-v0.1", memory="8GiB", registry=registry(), options={"mamba.cache_mode": "none"}
    )
    state = next(s for s in single.layer_specs.values() if s.kind == "mamba")
    assert (state.mamba_cache_mode, state.block_size) == ("none", single.max_model_len)
    state = next(s for s in aligned.layer_specs.values() if s.kind == "mamba")
    assert (state.mamba_cache_mode, state.block_size) == ("align", 16)


def test_an_option_of_an_unselected_plugin_is_named():
    without = kvcore.load_registry(only=["full_attention"])
    with pytest.raises(
        InvalidConfigError,
        match=r"plan option 'mamba\.cache_mode' belongs to plugin 'mamba', which is installed but "
        "not selected",
    ):
        kvcore.plan("llama-3-8b", registry=without, options={"mamba.cache_mode": "none"})


def test_a_builder_reading_an_undeclared_option_is_named():
    layer = kvcore.planning.LayerConfig(
        name="x",
        index=0,
        kind="k",
        model="m",
        config={},
        block_size=16,
        dtype="float16",
        state_dtype="float16",
        max_model_len=64,
        options={"cache_mode": "align"},
    )
    assert layer.option("cache_mode") == "align"
    undeclared = r"reads plan option 'mode', .*\(declared: cache_mode\)"
    with pytest.raises(InvalidConfigError, match=undeclared):
        layer.option("mode")


# -- alignment rules live on the spec classes -----------------------------------------


def test_a_state_follows_the_attention_block_size_only_when_its_class_says_so():
    """Formerly guessed by comparing block sizes: a "none"-mode state of 16 tokens followed."""
    from kvcore._planning.alignment import align_state_pages
    from kvcore_plugins.full_attention import FullAttentionSpec
    from kvcore_plugins.mamba import MambaSpec

    attention = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype="float16")
    # A 4,096-byte state; attention: 256 bytes per token, so blocks grow to 16.
    state = {"shapes": ((1024,),), "dtypes": ("float32",)}
    aligned = align_state_pages(
        {
            "attn": attention,
            "align": MambaSpec(block_size=16, mamba_cache_mode="align", **state),
            "none": MambaSpec(block_size=16, mamba_cache_mode="none", **state),
        }
    )
    assert aligned["attn"].block_size == 16
    # Twice the state: attention blocks grow to 32 tokens; only the aligned state follows.
    big = {"shapes": ((2048,),), "dtypes": ("float32",)}
    aligned = align_state_pages(
        {
            "attn": attention,
            "align": MambaSpec(block_size=16, mamba_cache_mode="align", **big),
            "none": MambaSpec(block_size=16, mamba_cache_mode="none", **big),
        }
    )
    assert aligned["attn"].block_size == 32
    assert aligned["align"].block_size == 32
    assert aligned["none"].block_size == 16
    assert aligned["align"].page_size_bytes == aligned["none"].page_size_bytes == 8192


def test_a_config_without_a_dtype_is_planned_in_float32_as_transformers_builds_it(tmp_path):
    # transformers builds a model whose config names no dtype in float32 (torch's
    # default); its cache must hold float32 too, not bfloat16.
    cfg = kvcore.planning.load_model_config(write(tmp_path), registry=registry())
    assert cfg.dtype == "float32"
    p = kvcore.plan(write(tmp_path), memory="1GiB", registry=registry())
    assert p.kv_cache_config.kv_cache_groups[0].kv_cache_spec.dtype == "float32"
    named = kvcore.plan(write(tmp_path, torch_dtype="bfloat16"), memory="1GiB", registry=registry())
    assert named.kv_cache_config.kv_cache_groups[0].kv_cache_spec.dtype == "bfloat16"
