"""vLLM 0.14's KV cache config and specs, as kvcore's.

vLLM describes a model's KV cache with ``vllm.v1.kv_cache_interface``: a
``KVCacheConfig`` (block count, backing tensors, groups) whose groups hold one
spec each. This module builds the kvcore config an engine-facing
:class:`kvcore.KVCacheManager` needs from it, one kvcore spec per vLLM spec,
field for field. vLLM is not imported: its spec classes are recognised by
their exact class name in ``vllm.v1.kv_cache_interface``, and kvcore's by
their ``kind`` in the plugin registry (the core never imports a plugin).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvcore._config import KVCacheConfig, KVCacheGroupSpec
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore.errors import InvalidConfigError, InvalidSpecError, UnknownSpecError
from kvcore.specs import KVCacheSpec

__all__ = ["kv_cache_config_from_vllm", "kv_cache_spec_from_vllm"]

_VLLM_MODULE = "vllm.v1.kv_cache_interface"

# The fields every attention spec of vLLM 0.14 has, kvcore's names alike.
_ATTENTION_FIELDS = ("block_size", "num_kv_heads", "head_size", "dtype", "page_size_padded")


def _attention(spec: Any, **extra: Any) -> dict[str, Any]:
    fields = {name: getattr(spec, name) for name in _ATTENTION_FIELDS}
    fields.update(extra)
    return fields


def _full(spec: Any) -> dict[str, Any]:
    return _attention(spec, head_size_v=spec.head_size_v)


def _mla(spec: Any) -> dict[str, Any]:
    # vLLM's MLA page is block_size × num_kv_heads × head_size elements (the
    # latent), no separate value vector: kvcore's head_size_v=0.
    return _attention(spec, head_size_v=0, cache_dtype_str=spec.cache_dtype_str)


def _sink(spec: Any) -> dict[str, Any]:
    if spec.sink_len is None:
        msg = (
            "vLLM SinkFullAttentionSpec.sink_len is None; kvcore's sink_full_attention needs "
            "the number of sink tokens (a multiple of block_size)"
        )
        raise InvalidSpecError(msg)
    return _attention(spec, head_size_v=spec.head_size_v, sink_len=spec.sink_len)


def _window(spec: Any) -> dict[str, Any]:
    return _attention(spec, sliding_window=spec.sliding_window)


def _chunk(spec: Any) -> dict[str, Any]:
    return _attention(spec, attention_chunk_size=spec.attention_chunk_size)


def _cross(spec: Any) -> dict[str, Any]:
    return _attention(spec)


#: vLLM spec class name → (kvcore kind, kvcore fields from the vLLM spec).
_ATTENTION_TYPES: Mapping[str, tuple[str, Callable[[Any], dict[str, Any]]]] = {
    "FullAttentionSpec": ("full_attention", _full),
    "MLAAttentionSpec": ("mla", _mla),
    "SinkFullAttentionSpec": ("sink_full_attention", _sink),
    "SlidingWindowSpec": ("sliding_window", _window),
    "ChunkedLocalAttentionSpec": ("chunked_local", _chunk),
    "CrossAttentionSpec": ("cross_attention", _cross),
}


def _spec_classes(registry: Registry) -> dict[str, type[KVCacheSpec]]:
    return {layer_type.spec.kind: layer_type.spec for layer_type in registry.layer_types}


def _build(
    classes: Mapping[str, type[KVCacheSpec]], kind: str, fields: dict[str, Any]
) -> KVCacheSpec:
    cls = classes.get(kind)
    if cls is None:
        msg = (
            f"no loaded kvcore plugin provides the {kind!r} attention type; install and "
            f"select the plugin serving it (kvcore plugins lists them)"
        )
        raise UnknownSpecError(msg)
    return cls(**fields)


def _vllm_class_name(spec: Any) -> str:
    cls = type(spec)
    if cls.__module__ != _VLLM_MODULE:
        msg = (
            f"{cls.__module__}.{cls.__qualname__} is not a spec of {_VLLM_MODULE}; "
            "pass the kv_cache_spec of a vLLM KVCacheGroupSpec"
        )
        raise InvalidSpecError(msg)
    return cls.__name__


def kv_cache_spec_from_vllm(
    spec: Any, *, enable_caching: bool = True, registry: Registry | None = None
) -> KVCacheSpec:
    """The kvcore spec of one vLLM 0.14 KV cache spec, field for field.

    Every type vLLM 0.14's KV cache manager serves is converted: full
    attention, MLA, attention sinks, sliding window, chunked local attention,
    cross attention and Mamba. A ``FullAttentionSpec`` with ``sliding_window``
    or ``attention_chunk_size`` set (a local layer vLLM allocates as full
    attention, the hybrid allocator being off) becomes a kvcore full-attention
    spec whose ``compute_spec`` records the local type. dtypes are taken as
    the ``torch.dtype`` vLLM holds; padded pages stay padded.

    Args:
        spec: A spec from ``vllm.v1.kv_cache_interface``.
        enable_caching: Whether prefix caching is on; it sets a Mamba spec's
            ``mamba_cache_mode`` (``"align"``: a state cached per block, as
            vLLM 0.14 does with prefix caching on; ``"none"``: one state per
            request).
        registry: Where kvcore's spec classes come from (default:
            :func:`kvcore.load_registry`).

    Raises:
        InvalidSpecError: ``spec`` is not a vLLM spec, is of a type vLLM's
            manager does not serve (``EncoderOnlyAttentionSpec`` holds no KV
            cache), or a field is out of kvcore's range (the message names it).
        UnknownSpecError: no loaded kvcore plugin provides the type.
    """
    classes = _spec_classes(registry if registry is not None else load_registry())
    return _convert(spec, classes, enable_caching)


def _convert(
    spec: Any, classes: Mapping[str, type[KVCacheSpec]], enable_caching: bool
) -> KVCacheSpec:
    name = _vllm_class_name(spec)
    if name == "MambaSpec":
        return _build(classes, "mamba", _mamba(spec, enable_caching))
    if name not in _ATTENTION_TYPES:
        msg = (
            f"vLLM {name} is not a type vLLM 0.14's KV cache manager serves (known: "
            f"{', '.join([*_ATTENTION_TYPES, 'MambaSpec'])}); kvcore has no equivalent"
        )
        raise InvalidSpecError(msg)
    kind, fields = _ATTENTION_TYPES[name]
    converted = fields(spec)
    if name == "FullAttentionSpec":
        local = _local_compute_spec(spec, classes)
        if local is not None:
            return _build(classes, "full_attention", {**converted, "compute_spec": local})
    return _build(classes, kind, converted)


def _local_compute_spec(spec: Any, classes: Mapping[str, type[KVCacheSpec]]) -> KVCacheSpec | None:
    fields = _attention(spec)
    if spec.sliding_window is not None:
        return _build(classes, "sliding_window", {**fields, "sliding_window": spec.sliding_window})
    if spec.attention_chunk_size is not None:
        chunk = spec.attention_chunk_size
        return _build(classes, "chunked_local", {**fields, "attention_chunk_size": chunk})
    return None


def _mamba(spec: Any, enable_caching: bool) -> dict[str, Any]:
    return {
        "block_size": spec.block_size,
        "shapes": spec.shapes,
        "dtypes": spec.dtypes,
        "page_size_padded": spec.page_size_padded,
        "mamba_type": spec.mamba_type,
        "num_speculative_blocks": spec.num_speculative_blocks,
        "mamba_cache_mode": "align" if enable_caching else "none",
    }


def kv_cache_config_from_vllm(
    config: Any, *, enable_caching: bool = True, registry: Registry | None = None
) -> KVCacheConfig:
    """The kvcore config of a vLLM 0.14 ``KVCacheConfig``: same blocks, same groups.

    ``num_blocks`` counts the null block in both. Group ``g`` keeps its layer
    names and its spec (:func:`kv_cache_spec_from_vllm`); a group whose spec
    is a ``UniformTypeKVCacheSpecs`` (layers of one type with different
    pages) keeps each layer's own spec as ``layer_specs``. The result is a
    manager-only config: vLLM's model runner keeps allocating the tensors
    vLLM's ``kv_cache_tensors`` describe.

    Args:
        config: A ``vllm.v1.kv_cache_interface.KVCacheConfig``.
        enable_caching: Whether prefix caching is on (see
            :func:`kv_cache_spec_from_vllm`).
        registry: Where kvcore's spec classes come from (default:
            :func:`kvcore.load_registry`).

    Raises:
        InvalidConfigError: the config has no groups or a bad block count.
        InvalidSpecError, UnknownSpecError: as :func:`kv_cache_spec_from_vllm`.
    """
    classes = _spec_classes(registry if registry is not None else load_registry())
    groups = []
    for index, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        try:
            groups.append(_group(group.layer_names, spec, classes, enable_caching))
        except (InvalidSpecError, UnknownSpecError) as exc:
            raise type(exc)(f"kv_cache_groups[{index}]: {exc}") from None
    if not groups:
        msg = "vLLM KVCacheConfig.kv_cache_groups is empty; a model with no KV cache needs none"
        raise InvalidConfigError(msg)
    return KVCacheConfig(num_blocks=config.num_blocks, kv_cache_groups=groups)


def _group(
    layer_names: Any, spec: Any, classes: Mapping[str, type[KVCacheSpec]], enable_caching: bool
) -> KVCacheGroupSpec:
    if _vllm_class_name(spec) != "UniformTypeKVCacheSpecs":
        converted = _convert(spec, classes, enable_caching)
        return KVCacheGroupSpec(layer_names=tuple(layer_names), kv_cache_spec=converted)
    per_layer = spec.kv_cache_specs
    layer_specs = tuple(_convert(per_layer[name], classes, enable_caching) for name in layer_names)
    return KVCacheGroupSpec(
        layer_names=tuple(layer_names), kv_cache_spec=layer_specs[0], layer_specs=layer_specs
    )
