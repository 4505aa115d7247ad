"""NVFP4 attention layers from a model config (layer kind ``"nvfp4_attention"``)."""

from __future__ import annotations

import kvcore
from kvcore_plugins.nvfp4_attention.spec import NVFP4, NVFP4AttentionSpec

__all__ = ["build_nvfp4_attention", "kvcore_layer_kinds"]


def build_nvfp4_attention(layer: kvcore.planning.LayerConfig) -> NVFP4AttentionSpec:
    """A full-attention layer of the model's KV heads and head size, stored in NVFP4.

    The kind fixes the format: the dtype the model is planned with (the
    model's own, or ``--dtype``, a plain dtype or another KV format) is for
    the model's other layers.
    """
    return NVFP4AttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=NVFP4,
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"nvfp4_attention"`` layers."""
    return [kvcore.planning.LayerKind("nvfp4_attention", build_nvfp4_attention)]
