"""Sliding-window layers from a model config (kind ``"sliding_attention"``)."""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore_plugins.sliding_window.spec import SlidingWindowSpec

__all__ = ["build_sliding_window", "kvcore_layer_kinds"]


def build_sliding_window(layer: kvcore.LayerConfig) -> SlidingWindowSpec:
    """A sliding-window layer; the window is the config's ``sliding_window``."""
    return SlidingWindowSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        sliding_window=int(layer.require("sliding_window")),
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> dict[str, Callable[[kvcore.LayerConfig], SlidingWindowSpec]]:
    """Claim ``"sliding_attention"`` layers (Gemma, gpt-oss, Mistral)."""
    return {"sliding_attention": build_sliding_window}
