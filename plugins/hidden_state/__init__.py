"""Hidden-state cache: layers whose hidden states are stored in the KV cache.

Keeps
    Every block of a request until it ends, as full attention, in the group's
    own block table (one ``num_kv_heads × head_size`` vector per token, no
    value part).
Frees
    Nothing before the request ends.
Hits
    As full attention: any cached prefix, found left to right.
"""

from __future__ import annotations

from typing import Any

import kvcore
from kvcore_plugins.hidden_state.manager import HiddenStateCacheManager
from kvcore_plugins.hidden_state.model_config import kvcore_layer_kinds as kvcore_layer_kinds
from kvcore_plugins.hidden_state.spec import HiddenStateCacheSpec

__all__ = ["HiddenStateCacheManager", "HiddenStateCacheSpec", "kvcore_layer_types"]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register the hidden-state cache."""
    return [kvcore.LayerType(HiddenStateCacheSpec, HiddenStateCacheManager)]
