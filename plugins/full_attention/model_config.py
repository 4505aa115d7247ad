"""Full-attention layers from a model config (``layer_types`` kind ``"full_attention"``)."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore_plugins.full_attention.spec import FullAttentionSpec

__all__ = ["build_full_attention", "kvcore_layer_kinds"]


def build_full_attention(layer: kvcore.LayerConfig) -> FullAttentionSpec:
    """A full-attention layer: the model's KV heads and head size."""
    return FullAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> dict[str, Callable[[kvcore.LayerConfig], FullAttentionSpec]]:
    """Claim ``"full_attention"`` layers."""
    return {"full_attention": build_full_attention}
