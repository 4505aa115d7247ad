"""Finding, selecting and loading plugins: the registry of attention types.

An engine builds its own :class:`~kvcore.Registry` from a selection of the
installed plugins (all of them, only some, or all but some; also from the
``KVCORE_PLUGINS`` and ``KVCORE_DISABLE_PLUGINS`` environment variables) with
:func:`~kvcore.load_registry`, or from layer types directly with
:func:`registry_from_layer_types`. Nothing is loaded at import time. See
:doc:`/how-to/select-plugins`.
"""

from __future__ import annotations

from kvcore._plugin_loader import (
    ENTRY_POINT_GROUP,
    ENV_DISABLE_PLUGINS,
    ENV_PLUGINS,
    PluginSelection,
    load_registry,
    load_selection,
)
from kvcore._plugin_types import LayerType
from kvcore._registry import Claim, HookCall, PluginInfo, Registry, registry_from_layer_types

__all__ = [
    "load_registry",
    "load_selection",
    "registry_from_layer_types",
    "PluginSelection",
    "Registry",
    "LayerType",
    "PluginInfo",
    "Claim",
    "HookCall",
    "ENTRY_POINT_GROUP",
    "ENV_PLUGINS",
    "ENV_DISABLE_PLUGINS",
]
