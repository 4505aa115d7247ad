"""Full attention with sink tokens from a model config (layer kind ``"sink_full_attention"``)."""

from __future__ import annotations

import kvcore
from kvcore_plugins.sink_full_attention.spec import SinkFullAttentionSpec

__all__ = ["build_sink_full_attention", "kvcore_layer_kinds"]


def build_sink_full_attention(layer: kvcore.planning.LayerConfig) -> SinkFullAttentionSpec:
    """A full-attention layer with ``sink_len`` learned sink tokens (config field ``sink_len``)."""
    return SinkFullAttentionSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        sink_len=layer.require_int("sink_len"),
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"sink_full_attention"`` layers."""
    return [kvcore.planning.LayerKind("sink_full_attention", build_sink_full_attention)]
