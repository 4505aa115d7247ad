"""Hidden-state cache layers from a model config (layer kind ``"hidden_state"``)."""

from __future__ import annotations

import kvcore
from kvcore_plugins.hidden_state.spec import HiddenStateCacheSpec

__all__ = ["build_hidden_state", "kvcore_layer_kinds"]


def build_hidden_state(layer: kvcore.planning.LayerConfig) -> HiddenStateCacheSpec:
    """One hidden-state vector of ``hidden_size`` elements per token.

    ``num_hidden_state_vectors`` (default 1) stacks several vectors per token,
    as when a draft model reads the hidden states of several target layers.
    """
    return HiddenStateCacheSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.get_int("num_hidden_state_vectors", default=1),
        head_size=layer.require_int("hidden_size", "d_model"),
        dtype=layer.state_dtype,
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"hidden_state"`` layers (listed in a config's ``layer_types``)."""
    return [kvcore.planning.LayerKind("hidden_state", build_hidden_state)]
