"""Cross-attention layers from a model config (layer kind ``"cross_attention"``).

Encoder-decoder configs (``is_encoder_decoder``, e.g. Whisper) are
recognized here: each of the ``decoder_layers`` decoder layers holds a
self-attention cache and a cross-attention cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import kvcore
from kvcore_plugins.cross_attention.spec import CrossAttentionSpec

__all__ = ["build_cross_attention", "kvcore_layer_kinds", "kvcore_model_layers"]


def build_cross_attention(layer: kvcore.planning.LayerConfig) -> CrossAttentionSpec:
    """A decoder layer's attention to the encoder output (Whisper's ``encoder_attn``)."""
    return CrossAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"cross_attention"`` layers (encoder-decoder models)."""
    return [
        kvcore.planning.LayerKind(
            "cross_attention", build_cross_attention, module_name="encoder_attn"
        )
    ]


@kvcore.hookimpl
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """Encoder-decoder models: per decoder layer, full self-attention and cross attention."""
    if not model.get("is_encoder_decoder"):
        return None
    layers = []
    for i in range(model.require_int("decoder_layers")):
        prefix = f"model.decoder.layers.{i}"
        layers.append(
            kvcore.planning.ModelLayer(name=f"{prefix}.self_attn", index=i, kind="full_attention")
        )
        layers.append(
            kvcore.planning.ModelLayer(
                name=f"{prefix}.encoder_attn", index=i, kind="cross_attention"
            )
        )
    return layers
