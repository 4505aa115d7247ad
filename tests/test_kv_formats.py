"""KV formats: the page a format gives, declared by spec classes, resolved by planning.

The page sizes are worked out by hand. The per-token-and-head fp8 layout is
the one the reference notes give for its quantized modes: the page grows by
``2 × block × heads × 4`` bytes of fp32 scales.
"""

from __future__ import annotations

import json
import types
from typing import Any, ClassVar

import attrs
import pytest

import kvcore
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    InvalidSpecError,
    PluginConflictError,
)
from kvcore.managers import PrefixManager
from kvcore.specs import AttentionSpec, KVFormat, PagePart, TokenLimits
from kvcore_plugins.nvfp4_attention import NVFP4, NVFP4AttentionSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec

BUILTIN = (
    "full_attention",
    "sliding_window",
    "chunked_local",
    "mamba",
    "cross_attention",
    "sink_full_attention",
    "mla",
    "hidden_state",
    "nvfp4_attention",
)

FP8_PER_TOKEN_HEAD = KVFormat(
    name="fp8_per_token_head", element_dtype="fp8", value_bits=8, scale_dtype="float32"
)
INT4_PER_TOKEN_HEAD = KVFormat(
    name="int4_per_token_head", element_dtype="uint8", value_bits=4, scale_dtype="float32"
)
FP8_OUTSIDE = KVFormat(name="fp8_tensor_scale", element_dtype="fp8", value_bits=8)


def test_fp8_with_a_scale_per_token_and_head_by_hand():
    """8 heads of 128: 256 fp8 bytes and 2 fp32 scales per head, 8 × 264 = 2,112 per token."""
    assert FP8_PER_TOKEN_HEAD.bytes_per_token(num_kv_heads=8, head_size=128, head_size_v=128) == (
        2 * 8 * 128 + 2 * 8 * 4
    )
    parts = FP8_PER_TOKEN_HEAD.page_parts(
        block_size=16, num_kv_heads=8, head_size=128, head_size_v=128
    )
    assert parts == (
        PagePart(name="kv", offset=0, shape=(16, 8, 256), dtype="float8_e4m3fn"),
        PagePart(name="kv_scale", offset=32_768, shape=(16, 8, 2), dtype="float32"),
    )


def test_int4_packs_two_values_a_byte_and_a_keyless_value_has_no_scale():
    """MLA-like rows (head_size_v 0): 576 values → 288 bytes and one fp32 scale = 292."""
    assert INT4_PER_TOKEN_HEAD.bytes_per_token(num_kv_heads=1, head_size=576, head_size_v=0) == 292
    parts = INT4_PER_TOKEN_HEAD.page_parts(
        block_size=64, num_kv_heads=1, head_size=576, head_size_v=0
    )
    assert [(p.name, p.offset, p.shape) for p in parts] == [
        ("kv", 0, (64, 1, 288)),
        ("kv_scale", 64 * 288, (64, 1, 1)),
    ]


def test_a_format_without_scales_in_the_page_is_the_plain_page():
    plain = FP8_OUTSIDE.page_parts(block_size=16, num_kv_heads=8, head_size=128, head_size_v=128)
    assert plain == (PagePart(name="kv", offset=0, shape=(16, 8, 256), dtype="float8_e4m3fn"),)


def test_scales_that_would_start_off_their_alignment_are_refused():
    """1 token × 1 head × (2 + 2) int4 values = 2 bytes: fp32 scales cannot start at byte 2."""
    with pytest.raises(InvalidSpecError, match="scales would start at byte 2, not a multiple"):
        INT4_PER_TOKEN_HEAD.page_parts(block_size=1, num_kv_heads=1, head_size=2, head_size_v=2)


@attrs.frozen(kw_only=True)
class QuantSlidingSpec(SlidingWindowSpec):
    """A third party's sliding window that also stores fp8 with per-token-head scales."""

    kind: ClassVar[str] = "quant_sliding"
    kv_formats: ClassVar[tuple[KVFormat, ...]] = (FP8_PER_TOKEN_HEAD,)


class QuantSlidingManager(SlidingWindowManager):
    pass


def _build_quant_sliding(layer: kvcore.planning.LayerConfig) -> QuantSlidingSpec:
    return QuantSlidingSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        sliding_window=layer.require_int("sliding_window"),
    )


def _plugin(*layer_types: kvcore.LayerType[Any], kinds: tuple[Any, ...] = ()) -> Any:
    hooks: dict[str, Any] = {"kvcore_layer_types": kvcore.hookimpl(lambda: list(layer_types))}
    if kinds:
        hooks["kvcore_layer_kinds"] = kvcore.hookimpl(lambda: list(kinds))
    return types.SimpleNamespace(**hooks)


QUANT_SLIDING = _plugin(
    kvcore.LayerType(QuantSlidingSpec, QuantSlidingManager),
    kinds=(kvcore.planning.LayerKind("quant_sliding", _build_quant_sliding),),
)


def test_the_registry_collects_the_declared_formats():
    registry = kvcore.load_registry(only=BUILTIN)
    assert dict(registry.kv_formats) == {"nvfp4": NVFP4}
    assert registry.spec_classes_storing("nvfp4") == (NVFP4AttentionSpec,)
    assert registry.spec_classes_storing(FP8_PER_TOKEN_HEAD) == ()
    assert registry.cache_dtype("nvfp4") is NVFP4
    assert registry.cache_dtype("bf16") == "bfloat16"
    assert registry.cache_dtype(NVFP4) is NVFP4
    without = kvcore.load_registry(only=[n for n in BUILTIN if n != "nvfp4_attention"])
    assert dict(without.kv_formats) == {}


def test_an_unknown_cache_dtype_names_the_plain_dtypes_and_the_formats():
    registry = kvcore.load_registry(only=BUILTIN)
    with pytest.raises(InvalidConfigError) as info:
        registry.cache_dtype("nvfp5")
    message = str(info.value)
    assert message.startswith("dtype: unknown dtype 'nvfp5'; known dtypes: bfloat16, ")
    assert message.endswith(
        "KV formats the selected plugins declare: nvfp4 (NVFP4AttentionSpec of plugin "
        "'nvfp4_attention')"
    )
    with pytest.raises(InvalidConfigError, match="'fp8_per_token_head' is declared by no"):
        registry.cache_dtype(FP8_PER_TOKEN_HEAD)
    without = kvcore.load_registry(only=["full_attention"])
    with pytest.raises(InvalidConfigError, match=r"the selected plugins declare: none$"):
        without.cache_dtype("nvfp4")


def test_two_plugins_may_declare_one_format_but_not_two_formats_under_one_name():
    equal = attrs.evolve(NVFP4, description="the same layout, described by another plugin")

    @attrs.frozen(kw_only=True)
    class OtherNvfp4(NVFP4AttentionSpec):
        kind: ClassVar[str] = "other_nvfp4"
        kv_formats: ClassVar[tuple[KVFormat, ...]] = (equal,)

    class OtherManager(PrefixManager[OtherNvfp4]):
        pass

    plugins = {"other": _plugin(kvcore.LayerType(OtherNvfp4, OtherManager))}
    registry = kvcore.load_registry(only=[*BUILTIN, "other"], plugins=plugins)
    assert registry.spec_classes_storing("nvfp4") == (NVFP4AttentionSpec, OtherNvfp4)

    different = attrs.evolve(NVFP4, values_per_scale=32)

    @attrs.frozen(kw_only=True)
    class Mxfp4(NVFP4AttentionSpec):
        kind: ClassVar[str] = "mxfp4"
        kv_formats: ClassVar[tuple[KVFormat, ...]] = (different,)

    class MxManager(PrefixManager[Mxfp4]):
        pass

    plugins = {"mx": _plugin(kvcore.LayerType(Mxfp4, MxManager))}
    with pytest.raises(PluginConflictError) as info:
        kvcore.load_registry(only=[*BUILTIN, "mx"], plugins=plugins)
    message = str(info.value)
    # Plugins load in name order: "mx" first.
    assert message.startswith("KV format 'nvfp4' is declared differently by plugin 'mx' (")
    assert "and by plugin 'nvfp4_attention' (kvcore_plugins.nvfp4_attention.spec." in message
    assert "one name must mean one page layout: disable one of the two plugins" in message
    both = _plugin(
        kvcore.LayerType(NVFP4AttentionSpec, PrefixManager), kvcore.LayerType(Mxfp4, MxManager)
    )
    with pytest.raises(HookImplementationError, match="declares two different KV formats named"):
        kvcore.load_registry(only=["full_attention", "both"], plugins={"both": both})


def _contract_error(**body: Any) -> str:
    namespace = {"kind": "broken_format", "__annotations__": {}, **body}
    cls = attrs.frozen(kw_only=True)(type("BrokenFormatSpec", (AttentionSpec,), namespace))
    cls.max_memory_usage_bytes = lambda self, limits: 0  # type: ignore[method-assign]
    plugin = _plugin(kvcore.LayerType(cls, PrefixManager))
    with pytest.raises(HookImplementationError) as info:
        kvcore.load_registry(only=["broken"], plugins={"broken": plugin})
    return str(info.value)


def test_the_contract_checks_the_declaration():
    assert "it must be a tuple of kvcore.specs.KVFormat" in _contract_error(kv_formats=[NVFP4])
    assert "declares two KV formats of one name" in _contract_error(
        kv_formats=(NVFP4, attrs.evolve(NVFP4, values_per_scale=32))
    )


def _quant_model(tmp_path: Any) -> Any:
    config = {
        "num_hidden_layers": 2,
        "layer_types": ["quant_sliding", "nvfp4_attention"],
        "hidden_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "sliding_window": 64,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_planning_with_a_format_a_third_party_declares(tmp_path):
    """Named as the dtype, the format reaches every layer; NVFP4 layers keep theirs."""
    registry = kvcore.load_registry(only=BUILTIN + ("quant",), plugins={"quant": QUANT_SLIDING})
    path = _quant_model(tmp_path)
    quantized = kvcore.plan(path, registry=registry, dtype="fp8_per_token_head", memory="1GiB")
    sliding, nvfp4 = quantized.layer_specs.values()
    assert sliding.dtype is FP8_PER_TOKEN_HEAD
    # 2 heads × (256 fp8 bytes + 2 fp32 scales) = 528 bytes per token.
    assert sliding.bytes_per_token == 528
    assert nvfp4.dtype is NVFP4
    plain = kvcore.plan(path, registry=registry, memory="1GiB")
    assert plain.layer_specs["model.layers.0.self_attn"].dtype == "bfloat16"
    data = json.loads(json.dumps(quantized.to_dict()))
    spec = data["kv_cache_config"]["kv_cache_groups"][0]["spec"]
    assert spec["dtype"]["name"] == "fp8_per_token_head"


def test_a_format_reaching_a_type_that_does_not_store_it_names_the_types_that_do(tmp_path):
    registry = kvcore.load_registry(only=BUILTIN)
    with pytest.raises(InvalidSpecError) as info:
        kvcore.plan("gpt-oss-20b", registry=registry, dtype="nvfp4")
    message = str(info.value)
    assert "layer 'model.layers.0.self_attn' (sliding_window)" in message
    assert "SlidingWindowSpec does not store the KV format 'nvfp4'" in message
    assert (
        "The KV format 'nvfp4' is stored by NVFP4AttentionSpec (kind 'nvfp4_attention', plugin "
        "'nvfp4_attention')" in message
    )


def test_a_spec_made_with_a_format_is_a_value():
    spec = QuantSlidingSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=FP8_PER_TOKEN_HEAD, sliding_window=8
    )
    assert spec == attrs.evolve(spec)
    assert spec.kv_format is FP8_PER_TOKEN_HEAD
    assert spec.max_memory_usage_bytes(TokenLimits(max_model_len=64)) > 0
    plain = attrs.evolve(spec, dtype="bfloat16")
    assert plain.kv_format is None
    assert plain.uniform_type_key == spec.uniform_type_key  # the format changes only the page
