"""Model configs: from a Hugging Face style ``config.json`` to layer specs.

Reading a config is split in two. kvcore reads the *shape* of the model: how
many layers hold a cache, their names, and each one's *kind*, taken from the
config's ``layer_types`` when it has one and derived from the usual fields
otherwise (Jamba's attention period, Qwen3-Next's full-attention interval,
Llama-4's RoPE-less layers, Gemma's sliding-window pattern, a model-wide
``sliding_window``, MLA's ``kv_lora_rank``, encoder-decoder models' cross
attention). The plugins turn each kind into a spec, through the
:func:`~kvcore.hookspecs.kvcore_layer_kinds` hook: the core never knows which
spec class serves a kind.
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs
import pluggy

from kvcore import hookspecs
from kvcore._planning.layer_config import LayerConfig
from kvcore._registry import Registry
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    PluginConflictError,
    UnknownSpecError,
)
from kvcore.specs import KVCacheSpec, dtype_name

__all__ = [
    "ModelConfig",
    "ModelLayer",
    "build_layer_specs",
    "layer_kind_builders",
    "list_models",
    "load_model_config",
]


LayerBuilder = Callable[[LayerConfig], KVCacheSpec]


@attrs.frozen(kw_only=True)
class ModelLayer:
    """One cache-holding layer of a model: its name, decoder layer index and kind."""

    name: str
    index: int
    kind: str


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The parts of a model's ``config.json`` that planning needs.

    Attributes:
        name: The shipped model name, or the config file's directory or stem.
        source: Where the config was read from.
        config: The (text) config fields, read-only; a nested
            ``text_config`` is merged over the top level.
        layers: Every cache-holding layer, in order.
        max_model_len: The model's context length (``max_position_embeddings``,
            ``max_target_positions`` for encoder-decoder models).
        max_num_encoder_tokens: Encoder tokens per request (encoder-decoder
            models), else 0.
        dtype: The model's dtype (canonical name).
    """

    name: str
    source: str
    config: Mapping[str, Any] = attrs.field(eq=False, repr=False)
    layers: tuple[ModelLayer, ...]
    max_model_len: int
    max_num_encoder_tokens: int
    dtype: str

    @property
    def kinds(self) -> dict[str, int]:
        """Layers per kind, in order of first appearance."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts


def _models_folder() -> Any:
    return importlib.resources.files("kvcore._planning") / "models"


def list_models() -> list[str]:
    """Names of the model configs shipped with kvcore (for :func:`kvcore.plan`)."""
    folder = _models_folder()
    return sorted(
        entry.name.removesuffix(".json")
        for entry in folder.iterdir()
        if entry.name.endswith(".json")
    )


def _read_json(path: Path, label: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        msg = f"cannot read model config {label}: {exc}"
        raise InvalidConfigError(msg) from exc
    except json.JSONDecodeError as exc:
        msg = f"model config {label} is not valid JSON: {exc}"
        raise InvalidConfigError(msg) from exc
    if not isinstance(data, dict):
        msg = f"model config {label} must be a JSON object, got {type(data).__name__}"
        raise InvalidConfigError(msg)
    return data


def _locate(model: str | Path) -> tuple[str, Path]:
    text = os.fspath(model)
    path = Path(text)
    explicit_path = text.endswith(".json") or os.sep in text
    # A shipped name wins over a same-named file or folder in the working directory.
    looks_like_path = explicit_path or (path.exists() and text not in list_models())
    if looks_like_path:
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            msg = f"no model config at {text!r}; give a config.json path or a shipped model name"
            raise InvalidConfigError(msg)
        name = path.parent.name if path.name == "config.json" else path.stem
        return name or path.stem, path
    if text not in list_models():
        known = ", ".join(list_models())
        msg = (
            f"unknown model {text!r}: not a shipped model name and not a path to a "
            f"config.json. Shipped models: {known}"
        )
        raise InvalidConfigError(msg)
    return text, Path(str(_models_folder() / f"{text}.json"))


def _merged_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    fields = {k: v for k, v in data.items() if k not in ("text_config", "vision_config")}
    text = data.get("text_config")
    if isinstance(text, Mapping):
        fields.update(text)
    return fields


def _require_int(fields: Mapping[str, Any], name: str, *keys: str) -> int:
    for key in keys:
        value = fields.get(key)
        if value is not None:
            if type(value) is not int or value < 0:
                msg = f"model {name!r}: {key} must be a non-negative integer, got {value!r}"
                raise InvalidConfigError(msg)
            return value
    msg = f"model {name!r}: its config.json needs {' or '.join(map(repr, keys))}"
    raise InvalidConfigError(msg)


def _decoder_kinds(fields: Mapping[str, Any], name: str) -> list[str]:
    """The kind of every decoder layer, from ``layer_types`` or the usual fields."""
    count = _require_int(fields, name, "num_hidden_layers")
    layer_types = fields.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != count:
            msg = (
                f"model {name!r}: layer_types must list one kind per layer "
                f"({count} layers, num_hidden_layers), got {layer_types!r}"
            )
            raise InvalidConfigError(msg)
        kinds = [str(kind) for kind in layer_types]
    elif fields.get("attn_layer_period") is not None:  # Jamba
        period = _require_int(fields, name, "attn_layer_period")
        offset = _require_int(fields, name, "attn_layer_offset")
        kinds = ["full_attention" if i % period == offset else "mamba" for i in range(count)]
    elif fields.get("full_attention_interval") is not None:  # Qwen3-Next
        interval = _require_int(fields, name, "full_attention_interval")
        kinds = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(count)
        ]
    elif fields.get("attention_chunk_size") is not None:  # Llama-4
        uses_rope = fields.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(count)]
        kinds = ["chunked_attention" if uses_rope[i] else "full_attention" for i in range(count)]
    elif fields.get("sliding_window_pattern") is not None:  # Gemma-3 without layer_types
        pattern = _require_int(fields, name, "sliding_window_pattern")
        kinds = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(count)
        ]
    elif fields.get("model_type") == "gemma2":  # even layers slide, odd layers are global
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(count)]
    elif fields.get("sliding_window") is not None and fields.get("use_sliding_window", True):
        kinds = ["sliding_attention"] * count
    else:
        kinds = ["full_attention"] * count
    if fields.get("kv_lora_rank") is not None:  # DeepSeek-style latent attention
        kinds = ["mla_attention" if kind == "full_attention" else kind for kind in kinds]
    return kinds


_LAYER_SUFFIX = {"mamba": "mamba", "linear_attention": "linear_attn"}


def _layers(fields: Mapping[str, Any], name: str) -> tuple[ModelLayer, ...]:
    if fields.get("is_encoder_decoder"):
        count = _require_int(fields, name, "decoder_layers")
        layers = []
        for i in range(count):
            prefix = f"model.decoder.layers.{i}"
            layers.append(ModelLayer(name=f"{prefix}.self_attn", index=i, kind="full_attention"))
            layers.append(
                ModelLayer(name=f"{prefix}.encoder_attn", index=i, kind="cross_attention")
            )
        return tuple(layers)
    return tuple(
        ModelLayer(
            name=f"model.layers.{i}.{_LAYER_SUFFIX.get(kind, 'self_attn')}", index=i, kind=kind
        )
        for i, kind in enumerate(_decoder_kinds(fields, name))
    )


def load_model_config(model: str | Path) -> ModelConfig:
    """Read a model's config: a shipped model name or a path to a ``config.json``.

    Args:
        model: A name from :func:`list_models` (``"gemma-3-27b"``), a
            ``config.json`` path, or a directory holding one.

    Raises:
        InvalidConfigError: unknown name (the message lists the shipped
            ones), unreadable file, or a config lacking a field kvcore needs
            (named).
    """
    name, path = _locate(model)
    fields = _merged_fields(_read_json(path, repr(os.fspath(model))))
    try:
        dtype = dtype_name(fields.get("torch_dtype") or fields.get("dtype") or "bfloat16")
    except ValueError as exc:
        msg = f"model {name!r}: torch_dtype: {exc}"
        raise InvalidConfigError(msg) from None
    encoder_decoder = bool(fields.get("is_encoder_decoder"))
    return ModelConfig(
        name=name,
        source=str(path),
        config=MappingProxyType(fields),
        layers=_layers(fields, name),
        max_model_len=_require_int(fields, name, "max_position_embeddings", "max_target_positions"),
        max_num_encoder_tokens=_require_int(fields, name, "max_source_positions")
        if encoder_decoder
        else 0,
        dtype=dtype,
    )


def _plugin_object(module: str) -> object:
    """The object a plugin's entry point names (``package.module`` or ``module:attr``)."""
    module_name, _, attribute = module.partition(":")
    target: object = importlib.import_module(module_name)
    for part in filter(None, attribute.split(".")):
        target = getattr(target, part)
    return target


def layer_kind_builders(registry: Registry) -> dict[str, tuple[str, LayerBuilder]]:
    """Layer kind → (plugin name, builder), from the registry's plugins.

    Each selected plugin's :func:`~kvcore.hookspecs.kvcore_layer_kinds` is
    called once.

    Raises:
        PluginConflictError: two plugins claim one kind.
        HookImplementationError: a plugin returns something other than a
            mapping of kind names to callables.
    """
    manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    manager.add_hookspecs(hookspecs)
    builders: dict[str, tuple[str, LayerBuilder]] = {}
    for info in registry.plugins:
        try:
            plugin = _plugin_object(info.module)
        except (ImportError, AttributeError):
            continue  # an in-process plugin object: it cannot claim kinds
        if not hasattr(plugin, "kvcore_layer_kinds"):
            continue
        manager.register(plugin, name=info.name)
        call = manager.subset_hook_caller(
            "kvcore_layer_kinds",
            remove_plugins=[p for p in manager.get_plugins() if p is not plugin],
        )
        for claimed in call():
            if not isinstance(claimed, Mapping) or not all(
                isinstance(k, str) and callable(v) for k, v in claimed.items()
            ):
                msg = (
                    f"plugin {info.name!r}: kvcore_layer_kinds must return a mapping of kind "
                    f"names to builder callables, got {claimed!r}"
                )
                raise HookImplementationError(msg)
            for kind, builder in claimed.items():
                if kind in builders:
                    msg = (
                        f"layer kind {kind!r} is claimed by plugin {builders[kind][0]!r} and by "
                        f"plugin {info.name!r}; disable one of the two plugins"
                    )
                    raise PluginConflictError(msg)
                builders[kind] = (info.name, builder)
    return builders


def build_layer_specs(
    model: ModelConfig,
    registry: Registry,
    *,
    block_size: int,
    dtype: str | None = None,
    max_model_len: int | None = None,
    mamba_cache_mode: str = "align",
) -> dict[str, KVCacheSpec]:
    """Every cache-holding layer's spec, built by the plugin claiming its kind.

    Args:
        model: The model config (:func:`load_model_config`).
        registry: The selected plugins.
        block_size: Tokens per block of attention layers.
        dtype: KV cache dtype; default the model's.
        max_model_len: Longest request planned for; default the model's.
        mamba_cache_mode: ``"align"`` or ``"none"``, for state layers.

    Raises:
        UnknownSpecError: a layer's kind is claimed by no selected plugin.
        InvalidConfigError: a builder misses a config field.
        HookImplementationError: a builder returns something that is not a
            spec.
    """
    builders = layer_kind_builders(registry)
    kv_dtype = dtype_name(dtype) if dtype is not None else model.dtype
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        entry = builders.get(layer.kind)
        if entry is None:
            claimed = ", ".join(f"{k} ({p})" for k, (p, _) in sorted(builders.items())) or "none"
            unselected = ", ".join(p.name for p in registry.unselected)
            hint = f" Installed but not selected: {unselected}." if unselected else ""
            msg = (
                f"model {model.name!r}: layer {layer.name!r} has kind {layer.kind!r}, which no "
                f"selected kvcore plugin recognizes. Kinds recognized: {claimed}.{hint} "
                "Select the plugin for this kind, or install one that registers it through "
                "the kvcore_layer_kinds hook"
            )
            raise UnknownSpecError(msg)
        plugin, builder = entry
        spec = builder(
            LayerConfig(
                name=layer.name,
                index=layer.index,
                kind=layer.kind,
                model=model.name,
                config=model.config,
                block_size=block_size,
                dtype=kv_dtype,
                state_dtype=model.dtype,
                max_model_len=max_model_len or model.max_model_len,
                mamba_cache_mode=mamba_cache_mode,
            )
        )
        if not isinstance(spec, KVCacheSpec):
            msg = (
                f"plugin {plugin!r}: the builder of layer kind {layer.kind!r} returned "
                f"{spec!r}, not a kvcore.specs.KVCacheSpec"
            )
            raise HookImplementationError(msg)
        specs[layer.name] = spec
    return specs
