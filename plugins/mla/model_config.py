"""Multi-head latent attention layers from a model config (layer kind ``"mla"``).

A config with ``kv_lora_rank`` (DeepSeek) caches latent vectors: its
full-attention layers, listed in ``layer_types`` or (without it) all of
them, are MLA layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import kvcore
from kvcore_plugins.mla.spec import MLAAttentionSpec

__all__ = ["build_mla", "kvcore_layer_kinds", "kvcore_model_layers"]


def build_mla(layer: kvcore.planning.LayerConfig) -> MLAAttentionSpec:
    """One latent row per token: ``kv_lora_rank + qk_rope_head_dim`` elements (DeepSeek)."""
    width = layer.require_int("kv_lora_rank") + layer.require_int("qk_rope_head_dim")
    return MLAAttentionSpec(block_size=layer.block_size, head_size=width, dtype=layer.dtype)


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"mla"`` layers (formerly ``"mla_attention"``, still accepted with a warning)."""
    return [kvcore.planning.LayerKind("mla", build_mla, deprecated_aliases=("mla_attention",))]


@kvcore.hookimpl(tryfirst=True)
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """With ``kv_lora_rank``, every full-attention layer caches latents (asked first)."""
    if model.get("kv_lora_rank") is None:
        return None
    kinds = model.layer_types or ["full_attention"] * model.num_hidden_layers
    return model.decoder_layers(["mla" if kind == "full_attention" else kind for kind in kinds])
