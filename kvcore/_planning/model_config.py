"""Model configs: from a Hugging Face style ``config.json`` to layer specs.

Reading a config is split between kvcore and the plugins. kvcore reads the
file, the model-wide fields (context length, dtype, encoder tokens) and, when
the config lists them, its ``layer_types``. Which layers hold a cache, and of
which *kind*, is otherwise derived by the plugins, each from its own fields,
through the :func:`~kvcore.hookspecs.kvcore_model_layers` hook; and each
kind's spec is built by the plugin claiming it, through the
:func:`~kvcore.hookspecs.kvcore_layer_kinds` hook. The core never knows which
attention type a field, a kind or a model family belongs to.
"""

from __future__ import annotations

import functools
import importlib
import importlib.resources
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from kvcore._planning.layer_config import LayerConfig
from kvcore._planning.model_fields import ModelFields
from kvcore._plugin_calls import call_plugin
from kvcore._plugin_types import LayerKind, ModelLayer
from kvcore._registry import Registry
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    InvalidSpecError,
    UnknownSpecError,
)
from kvcore.specs import KVCacheSpec, KVFormat, dtype_name

__all__ = [
    "ModelConfig",
    "ModelFields",
    "ModelLayer",
    "build_layer_specs",
    "list_models",
    "load_model_config",
    "model_config_from_dict",
]

#: The dtype of a model whose config names none: Hugging Face builds such a
#: model in float32 (torch's default), so its cache holds float32 too.
DEFAULT_DTYPE = "float32"


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The parts of a model's ``config.json`` that planning needs.

    Attributes:
        name: The shipped model name, or the config file's directory or stem.
        source: Where the config was read from.
        config: The (text) config fields, read-only; a nested
            ``text_config`` is merged over the top level.
        layers: Every cache-holding layer, in order, with its layer kind
            under its own name (an alias in the config is resolved).
        max_model_len: The model's context length (``max_position_embeddings``,
            ``max_target_positions`` for encoder-decoder models).
        max_num_encoder_tokens: Encoder tokens per request (encoder-decoder
            models, ``max_source_positions``), else 0.
        dtype: The model's dtype (canonical name): the config's ``torch_dtype``
            or ``dtype``, else float32 (what Hugging Face builds a model in when
            its config names none).
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
        raw = path.read_bytes()
    except OSError as exc:
        msg = f"cannot read model config {label}: {exc}"
        raise InvalidConfigError(msg) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = (
            f"model config {label} is not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
            f"{exc.start}); save the config.json as UTF-8"
        )
        raise InvalidConfigError(msg) from None
    try:
        data = json.loads(text)
    except RecursionError:
        msg = (
            f"model config {label} nests JSON values too deeply to read; a config.json "
            "is a flat object of fields (with at most a few nested objects)"
        )
        raise InvalidConfigError(msg) from None
    except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
        msg = f"model config {label} is not valid JSON: {exc}; fix the file"
        raise InvalidConfigError(msg) from None
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


def _canonical_layers(
    layers: tuple[ModelLayer, ...], registry: Registry, where: str
) -> tuple[ModelLayer, ...]:
    """Layers with every kind under its own name; deprecated names warn once each."""
    warned: set[str] = set()
    canonical = []
    for layer in layers:
        claim = registry.layer_kind(layer.kind)
        if claim is not None and claim.record.name != layer.kind:
            kind: LayerKind = claim.record
            if layer.kind in kind.deprecated_aliases and layer.kind not in warned:
                warned.add(layer.kind)
                warnings.warn(
                    f"{where}: layer kind {layer.kind!r} is deprecated; it is now called "
                    f"{kind.name!r} (plugin {claim.plugin.name!r})",
                    DeprecationWarning,
                    stacklevel=4,
                )
            layer = attrs.evolve(layer, kind=kind.name)
        canonical.append(layer)
    return tuple(canonical)


def _model_layers(fields: ModelFields, registry: Registry) -> tuple[ModelLayer, ...]:
    """The layers a plugin derives from the config, else those ``layer_types`` lists."""
    answer = registry.first_result("kvcore_model_layers", model=fields)
    if answer is None:
        kinds = fields.layer_types
        if kinds is None:
            unselected = ", ".join(p.name for p in registry.unselected)
            hint = f" Installed but not selected: {unselected}." if unselected else ""
            asked = registry.hook_calls.get("kvcore_model_layers", ())
            recognizers = ", ".join(call.plugin for call in asked) or "none"
            msg = (
                f"{fields._where()}: no selected kvcore plugin recognizes its layers "
                f"(plugins asked: {recognizers}) and its config.json lists no layer_types.{hint} "
                "Select the plugin for this model's attention types, or add layer_types "
                "(one layer kind per layer)"
            )
            raise UnknownSpecError(msg)
        return fields.decoder_layers(kinds)
    plugin, layers = answer
    if not isinstance(layers, list | tuple) or not all(
        isinstance(layer, ModelLayer) for layer in layers
    ):
        msg = (
            f"plugin {plugin!r}: kvcore_model_layers must return a list of "
            "kvcore.planning.ModelLayer "
            f"or None, got {layers!r}"
        )
        raise HookImplementationError(msg)
    names = [layer.name for layer in layers]
    if len(set(names)) != len(names):
        msg = f"plugin {plugin!r}: kvcore_model_layers named two layers alike: {names}"
        raise HookImplementationError(msg)
    return tuple(layers)


def load_model_config(model: str | Path, registry: Registry | None = None) -> ModelConfig:
    """Read a model's config: a shipped model name or a path to a ``config.json``.

    Which layers hold a cache, and of which kind, comes from the selected
    plugins (:func:`~kvcore.hookspecs.kvcore_model_layers`), else from the
    config's ``layer_types``.

    Args:
        model: A name from :func:`list_models` (``"gemma-3-27b"``), a
            ``config.json`` path, or a directory holding one.
        registry: The plugins that recognize the layers; default
            :func:`kvcore.load_registry`.

    Raises:
        InvalidConfigError: unknown name (the message lists the shipped
            ones); a file that cannot be read, is not UTF-8, is not JSON or
            nests too deeply; a field kvcore needs that is missing or is not a
            positive integer (a word, a fraction, zero); a model without any
            cache-holding layer. Every message names the file and the field.
        UnknownSpecError: no selected plugin recognizes the layers of a
            config without ``layer_types``.
    """
    if registry is None:
        from kvcore._plugin_loader import load_registry  # the loader imports planning

        registry = load_registry()
    name, path = _locate(model)
    data = _read_json(path, repr(os.fspath(model)))
    return model_config_from_dict(data, name=name, source=str(path), registry=registry)


def model_config_from_dict(
    data: Mapping[str, Any],
    *,
    name: str,
    source: str = "<dict>",
    registry: Registry | None = None,
) -> ModelConfig:
    """A model's config from its fields, as :func:`load_model_config` reads them from a file.

    For a config held in memory (a Hugging Face model's ``config.to_dict()``).
    A config naming no dtype (``torch_dtype`` or ``dtype``) is a float32
    model, as Hugging Face builds one.

    Args:
        data: The ``config.json`` fields.
        name: The model's name, for plans and messages.
        source: Where the fields came from, for messages.
        registry: The plugins; default :func:`kvcore.load_registry`.

    Raises:
        InvalidConfigError, UnknownSpecError: as :func:`load_model_config`.
    """
    if registry is None:
        from kvcore._plugin_loader import load_registry  # the loader imports planning

        registry = load_registry()
    config = _merged_fields(data)
    module_names = {
        str(kind_name): claim.record.module_name
        for kind_name, claim in registry.claims("kvcore_layer_kinds").items()
    }
    fields = ModelFields(name=name, source=source, config=config, module_names=module_names)
    try:
        dtype = dtype_name(config.get("torch_dtype") or config.get("dtype") or DEFAULT_DTYPE)
    except ValueError as exc:
        msg = f"{fields._where()}: torch_dtype: {exc}; fix torch_dtype in the config.json"
        raise InvalidConfigError(msg) from None
    layers = _canonical_layers(_model_layers(fields, registry), registry, fields._where())
    if not layers:
        msg = (
            f"{fields._where()}: the config describes no cache-holding layer (check "
            "num_hidden_layers and layer_types); there is no KV cache to plan"
        )
        raise InvalidConfigError(msg)
    encoder_tokens = (
        fields.require_int("max_source_positions") if config.get("is_encoder_decoder") else 0
    )
    return ModelConfig(
        name=name,
        source=source,
        config=MappingProxyType(config),
        layers=layers,
        max_model_len=fields.require_int("max_position_embeddings", "max_target_positions"),
        max_num_encoder_tokens=encoder_tokens,
        dtype=dtype,
    )


def _kinds_claimed(registry: Registry) -> str:
    described = []
    for name, claim in sorted(registry.layer_kinds.items()):
        kind: LayerKind = claim.record
        also = f"; also {', '.join(kind.aliases)}" if kind.aliases else ""
        described.append(f"{name} ({claim.plugin.name}{also})")
    return ", ".join(described) or "none"


def _format_hint(kv_dtype: str | KVFormat, registry: Registry) -> str:
    """For a KV format as the cache dtype: which layer types store it."""
    if not isinstance(kv_dtype, KVFormat):
        return ""
    kinds = [
        f"{cls.__name__} (kind {cls.kind!r}, plugin {registry.plugin_for(cls).name!r})"
        for cls in registry.spec_classes_storing(kv_dtype)
    ]
    return (
        f". The KV format {kv_dtype.name!r} is stored by {', '.join(kinds)}: give the layers "
        "that should store it one of those kinds in layer_types, or plan with a plain dtype"
    )


def build_layer_specs(
    model: ModelConfig,
    registry: Registry,
    *,
    block_size: int,
    dtype: str | KVFormat | None = None,
    max_model_len: int | None = None,
    options: Mapping[str, str] | None = None,
) -> dict[str, KVCacheSpec]:
    """Every cache-holding layer's spec, built by the plugin claiming its kind.

    Args:
        model: The model config (:func:`load_model_config`).
        registry: The selected plugins.
        block_size: Tokens per block of attention layers.
        dtype: KV cache dtype: a plain dtype or a KV format a selected plugin
            declares (:meth:`~kvcore.Registry.cache_dtype`); default the
            model's dtype.
        max_model_len: Longest request planned for; default the model's.
        options: Plugins' plan options, ``"<plugin>.<option>"`` → value
            (see :class:`~kvcore.planning.PlanOption`).

    Raises:
        UnknownSpecError: a layer's kind is claimed by no selected plugin.
        InvalidConfigError: a builder misses a config field, or finds one
            malformed (naming the file and the field); an unknown plan option
            or value; a ``dtype`` that is neither a plain dtype nor a declared
            KV format.
        InvalidSpecError: the fields make an invalid spec (naming the layer);
            a KV format given as ``dtype`` reaches a layer whose type does not
            store it (naming the types that do).
        HookImplementationError: a builder raises or returns something that
            is not a spec.
    """
    option_values = registry.plan_option_values(options)
    kv_dtype = registry.cache_dtype(dtype) if dtype is not None else model.dtype
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        claim = registry.layer_kind(layer.kind)
        if claim is None:
            unselected = ", ".join(p.name for p in registry.unselected)
            hint = f" Installed but not selected: {unselected}." if unselected else ""
            msg = (
                f"model {model.name!r}: layer {layer.name!r} has kind {layer.kind!r}, which no "
                f"selected kvcore plugin recognizes. Kinds recognized: "
                f"{_kinds_claimed(registry)}.{hint} Select the plugin for this kind, or "
                "install one that registers it through the kvcore_layer_kinds hook"
            )
            raise UnknownSpecError(msg)
        kind: LayerKind = claim.record
        plugin = claim.plugin.name
        layer_config = LayerConfig(
            name=layer.name,
            index=layer.index,
            kind=kind.name,
            model=model.name,
            source=model.source,
            config=model.config,
            block_size=block_size,
            dtype=kv_dtype,
            state_dtype=model.dtype,
            max_model_len=max_model_len or model.max_model_len,
            options=option_values.get(plugin, {}),
        )
        where = f"the builder of layer kind {kind.name!r} (from its kvcore_layer_kinds hook)"
        try:
            spec = call_plugin(
                plugin, where, functools.partial(kind.build, layer_config), pass_kvcore_errors=True
            )
        except InvalidSpecError as exc:
            msg = f"{layer_config._where()}: {exc}{_format_hint(kv_dtype, registry)}"
            raise InvalidSpecError(msg) from exc
        if not isinstance(spec, KVCacheSpec):
            msg = (
                f"plugin {plugin!r}: the builder of layer kind {kind.name!r} returned "
                f"{spec!r}, not a kvcore.specs.KVCacheSpec"
            )
            raise HookImplementationError(msg)
        specs[layer.name] = spec
    return specs
