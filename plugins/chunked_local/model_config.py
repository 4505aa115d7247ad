"""Chunked local attention layers from a model config (layer kind ``"chunked_local"``).

Hugging Face configs call the kind ``"chunked_attention"`` in their
``layer_types``; Llama-4 configs without ``layer_types`` are recognized by
their ``attention_chunk_size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import kvcore
from kvcore_plugins.chunked_local.spec import ChunkedLocalAttentionSpec

__all__ = ["build_chunked_local", "kvcore_layer_kinds", "kvcore_model_layers"]


def build_chunked_local(layer: kvcore.planning.LayerConfig) -> ChunkedLocalAttentionSpec:
    """A chunked layer; the chunk is the config's ``attention_chunk_size`` (Llama-4)."""
    return ChunkedLocalAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        attention_chunk_size=layer.require_int("attention_chunk_size"),
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"chunked_local"`` layers (``"chunked_attention"`` in Hugging Face configs)."""
    return [
        kvcore.planning.LayerKind(
            "chunked_local", build_chunked_local, aliases=("chunked_attention",)
        )
    ]


@kvcore.hookimpl
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """Llama-4: layers with RoPE attend within their chunk, RoPE-less layers to everything.

    ``no_rope_layers`` lists 1 for each RoPE layer; without it every 4th
    layer is RoPE-less.
    """
    if model.layer_types is not None or model.get("attention_chunk_size") is None:
        return None
    count = model.num_hidden_layers
    uses_rope = model.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(count)]
    if not isinstance(uses_rope, list) or len(uses_rope) != count:
        msg = (
            f"model {model.name!r} ({model.source}): no_rope_layers must list one 0 or 1 per "
            f"layer ({count} layers), got {uses_rope!r}; fix no_rope_layers"
        )
        raise kvcore.errors.InvalidConfigError(msg)
    kinds = ["chunked_local" if uses_rope[i] else "full_attention" for i in range(count)]
    return model.decoder_layers(kinds)
