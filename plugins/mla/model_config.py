"""Multi-head latent attention layers from a model config (kind ``"mla_attention"``)."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore_plugins.mla.spec import MLAAttentionSpec

__all__ = ["build_mla", "kvcore_layer_kinds"]


def build_mla(layer: kvcore.LayerConfig) -> MLAAttentionSpec:
    """One latent row per token: ``kv_lora_rank + qk_rope_head_dim`` elements (DeepSeek)."""
    width = int(layer.require("kv_lora_rank")) + int(layer.require("qk_rope_head_dim"))
    return MLAAttentionSpec(block_size=layer.block_size, head_size=width, dtype=layer.dtype)


@kvcore.hookimpl
def kvcore_layer_kinds() -> dict[str, Callable[[kvcore.LayerConfig], MLAAttentionSpec]]:
    """Claim ``"mla_attention"`` layers (configs with ``kv_lora_rank``)."""
    return {"mla_attention": build_mla}
