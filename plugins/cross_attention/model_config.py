"""Cross-attention layers from a model config (kind ``"cross_attention"``)."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore_plugins.cross_attention.spec import CrossAttentionSpec

__all__ = ["build_cross_attention", "kvcore_layer_kinds"]


def build_cross_attention(layer: kvcore.LayerConfig) -> CrossAttentionSpec:
    """A decoder layer's attention to the encoder output (Whisper's ``encoder_attn``)."""
    return CrossAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> dict[str, Callable[[kvcore.LayerConfig], CrossAttentionSpec]]:
    """Claim ``"cross_attention"`` layers (encoder-decoder models)."""
    return {"cross_attention": build_cross_attention}
