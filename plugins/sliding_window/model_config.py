"""Sliding-window layers from a model config (layer kind ``"sliding_window"``).

Hugging Face configs call the kind ``"sliding_attention"`` in their
``layer_types``; configs without ``layer_types`` are recognized by their
window pattern (Gemma-3's ``sliding_window_pattern``, Gemma-2's alternation)
or a window for every layer (Mistral).
"""

from __future__ import annotations

from collections.abc import Sequence

import kvcore
from kvcore_plugins.sliding_window.spec import SlidingWindowSpec

__all__ = ["build_sliding_window", "kvcore_layer_kinds", "kvcore_model_layers"]

_FULL = "full_attention"
_SLIDING = "sliding_window"


def build_sliding_window(layer: kvcore.planning.LayerConfig) -> SlidingWindowSpec:
    """A sliding-window layer; the window is the config's ``sliding_window``."""
    return SlidingWindowSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        sliding_window=layer.require_int("sliding_window"),
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"sliding_window"`` layers (``"sliding_attention"`` in Hugging Face configs)."""
    return [
        kvcore.planning.LayerKind(_SLIDING, build_sliding_window, aliases=("sliding_attention",))
    ]


@kvcore.hookimpl
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """Window patterns of configs without ``layer_types``.

    ``sliding_window_pattern`` ``p`` (Gemma-3): every ``p``-th layer is full
    attention, the others slide. ``model_type`` ``"gemma2"``: even layers
    slide, odd ones are full. Otherwise a ``sliding_window`` (unless
    ``use_sliding_window`` is false) makes every layer slide (Mistral).
    """
    if model.layer_types is not None:
        return None
    if model.get("sliding_window_pattern") is not None:
        pattern = model.require_int("sliding_window_pattern")
        count = model.num_hidden_layers
        kinds = [_FULL if (i + 1) % pattern == 0 else _SLIDING for i in range(count)]
    elif model.get("model_type") == "gemma2":
        kinds = [_SLIDING if i % 2 == 0 else _FULL for i in range(model.num_hidden_layers)]
    elif model.get("sliding_window") is not None and model.get("use_sliding_window", default=True):
        kinds = [_SLIDING] * model.num_hidden_layers
    else:
        return None
    return model.decoder_layers(kinds)
