"""The plugin contract: every hook a kvcore plugin can implement.

A plugin is a module (or any object) registered under the ``kvcore``
entry-point group whose functions are marked with :data:`hookimpl`. Hooks are
named ``kvcore_*``, take keyword arguments only, and run while a registry is
built (:func:`kvcore.load_registry`), never on the allocation path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import pluggy

from kvcore._registry import LayerType

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec", "kvcore_layer_types"]

#: The pluggy project name, and the entry-point group plugins register under.
PROJECT_NAME: Final = "kvcore"

#: Marks a function of a hookspec module as a kvcore hook specification.
hookspec = pluggy.HookspecMarker(PROJECT_NAME)

#: Marks a plugin function as an implementation of a kvcore hook.
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
def kvcore_layer_types() -> Sequence[LayerType[Any]]:  # type: ignore[empty-body]
    """Return the attention types this plugin provides.

    Called once per plugin when a registry is built; every plugin's result is
    used. Each spec class may be claimed by one plugin only: a second claim
    raises :class:`~kvcore.errors.PluginConflictError` naming both plugins.
    The registry looks spec classes up exactly, so a spec subclass needs its
    own :class:`~kvcore.LayerType`.

    Returns:
        One :class:`~kvcore.LayerType` per spec class the plugin serves.

    Example::

        @kvcore.hookimpl
        def kvcore_layer_types():
            return [kvcore.LayerType(MySpec, MyManager)]

    Used by every built-in plugin, e.g. ``kvcore_plugins.full_attention``.

    .. versionadded:: 0.1
    """
