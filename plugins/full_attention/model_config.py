"""Full-attention layers from a model config (layer kind ``"full_attention"``)."""

from __future__ import annotations

from collections.abc import Sequence

import kvcore
from kvcore_plugins.full_attention.spec import FullAttentionSpec

__all__ = ["build_full_attention", "kvcore_layer_kinds", "kvcore_model_layers"]


def build_full_attention(layer: kvcore.planning.LayerConfig) -> FullAttentionSpec:
    """A full-attention layer: the model's KV heads and head size."""
    return FullAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"full_attention"`` layers."""
    return [kvcore.planning.LayerKind("full_attention", build_full_attention)]


#: Fields that show a config is not a plain decoder: the layouts other plugins
#: recognize. A config carrying one is left alone even when no selected plugin
#: recognized it, so that planning fails naming the plugins left out instead
#: of planning every layer as full attention.
OTHER_LAYOUT_FIELDS = (
    "layer_types",
    "is_encoder_decoder",
    "sliding_window_pattern",
    "attention_chunk_size",
    "attn_layer_period",
    "full_attention_interval",
    "kv_lora_rank",
)


def _plain_decoder(model: kvcore.planning.ModelFields) -> bool:
    if any(model.get(field) for field in OTHER_LAYOUT_FIELDS):
        return False
    if model.get("model_type") == "gemma2":
        return False
    return model.get("sliding_window") is None or not model.get("use_sliding_window", default=True)


@kvcore.hookimpl(trylast=True)
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """A plain decoder, when no other plugin recognized the config: every layer full attention.

    Asked last (``trylast``). A config carrying a field of another layout
    (:data:`OTHER_LAYOUT_FIELDS`, a window, Gemma-2) is not a plain decoder
    and is left alone.
    """
    if not _plain_decoder(model):
        return None
    return model.decoder_layers(["full_attention"] * model.num_hidden_layers)
