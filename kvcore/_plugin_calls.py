"""Calling plugin code: every exception comes out naming the plugin, the hook and the way out.

A plugin's hook implementation, or a function it returned (a layer-kind
builder), may raise anything. Whatever it raises reaches the user as a
:class:`~kvcore.errors.HookImplementationError` (a
:class:`~kvcore.errors.PluginError`) naming the plugin, the hook and how to
leave the plugin out, chained to the original exception.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from kvcore.errors import HookImplementationError, KVCoreError

__all__ = ["ENV_DISABLE_PLUGINS", "call_plugin", "how_to_disable"]

#: Comma-separated plugin names never to load.
ENV_DISABLE_PLUGINS: Final = "KVCORE_DISABLE_PLUGINS"

T = TypeVar("T")


def how_to_disable(plugin: str) -> str:
    """The three ways to leave ``plugin`` out, as one phrase for messages."""
    return (
        f"--disable {plugin} (kvcore command), {ENV_DISABLE_PLUGINS}={plugin} (environment) "
        f"or disable=[{plugin!r}] (kvcore.load_registry)"
    )


def call_plugin(
    plugin: str,
    where: str,
    function: Callable[..., T],
    kwargs: Mapping[str, Any] | None = None,
    *,
    pass_kvcore_errors: bool = False,
) -> T:
    """Call ``function`` (code of ``plugin``) with ``kwargs``; wrap what it raises.

    Args:
        plugin: The plugin's name.
        where: What is being called, for the message (``"its kvcore_layer_types
            hook"``).
        function: The plugin's function.
        kwargs: Its keyword arguments.
        pass_kvcore_errors: Let kvcore's own errors through unchanged (a layer
            builder reporting a missing config field through kvcore's
            helpers); everything else is still wrapped.

    Raises:
        HookImplementationError: the function raised; the message names the
            plugin, ``where``, the exception and how to disable the plugin.
    """
    try:
        return function(**(kwargs or {}))
    except Exception as exc:
        if pass_kvcore_errors and isinstance(exc, KVCoreError):
            raise
        msg = (
            f"kvcore plugin {plugin!r} failed in {where}: {type(exc).__name__}: {exc}. Fix or "
            f"uninstall the plugin, or leave it out with {how_to_disable(plugin)}"
        )
        raise HookImplementationError(msg) from exc
