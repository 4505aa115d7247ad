"""The plugin contract: every hook a kvcore plugin can implement.

A plugin is a module (or any object) registered under the ``kvcore``
entry-point group whose functions are marked with :data:`hookimpl`. Hooks are
named ``kvcore_*``, take keyword arguments only, and run while a registry is
built (:func:`kvcore.load_registry`), never on the allocation path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import pluggy

from kvcore._planning.layer_config import LayerConfig
from kvcore._registry import LayerType
from kvcore.specs import KVCacheSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "kvcore_layer_kinds",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
]

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

    Example:
        .. code-block:: python

            @kvcore.hookimpl
            def kvcore_layer_types():
                return [kvcore.LayerType(MySpec, MyManager)]

    Used by every built-in plugin, e.g. ``kvcore_plugins.full_attention``.

    .. versionadded:: 0.1
    """


@hookspec
def kvcore_layer_kinds() -> Mapping[str, Callable[[LayerConfig], KVCacheSpec]]:  # type: ignore[empty-body]
    """Return the model-config layer kinds this plugin builds specs for.

    Planning a model from a Hugging Face style ``config.json``
    (:func:`kvcore.plan`, :func:`kvcore.build_layer_specs`) gives every layer
    that holds a cache a *kind*: the entry of the config's ``layer_types``
    (``"full_attention"``, ``"sliding_attention"``, ``"linear_attention"``,
    ...) or, for configs without one, a kind derived from the config
    (``"chunked_attention"``, ``"mamba"``, ``"mla_attention"``,
    ``"cross_attention"``). For each layer kvcore calls the builder registered
    for its kind with a :class:`~kvcore.LayerConfig` and uses the spec it
    returns. A third-party attention type makes its layers plannable by
    returning a builder for its own kind name.

    Called once per plugin when a model is planned, never on the allocation
    path. Each kind may be claimed by one plugin only: a second claim raises
    :class:`~kvcore.errors.PluginConflictError` naming both plugins. A layer
    whose kind no selected plugin claims raises
    :class:`~kvcore.errors.UnknownSpecError` listing the kinds that are
    claimed. Planning finds a plugin's implementation through its entry point
    (or, for ``load_registry(plugins=...)``, through the object's importable
    module name), so a plugin object that is not an importable module claims
    no kinds.

    Returns:
        Kind name → builder. A builder takes the layer's
        :class:`~kvcore.LayerConfig` and returns its spec; it raises
        :class:`~kvcore.errors.InvalidConfigError` (e.g. through
        :meth:`kvcore.LayerConfig.require`) when the config lacks a field it
        needs.

    Example:
        .. code-block:: python

            from kvcore_plugins.sliding_window import SlidingWindowSpec

            def _build(layer: kvcore.LayerConfig) -> SlidingWindowSpec:
                return SlidingWindowSpec(
                    block_size=layer.block_size,
                    num_kv_heads=layer.num_kv_heads,
                    head_size=layer.head_size,
                    dtype=layer.dtype,
                    sliding_window=layer.require("sliding_window"),
                )

            @kvcore.hookimpl
            def kvcore_layer_kinds():
                return {"sliding_attention": _build}

    Used by the built-in plugins, e.g. ``kvcore_plugins.sliding_window.model_config``.

    .. versionadded:: 0.1
    """


@hookspec
def kvcore_reference_kernels() -> Mapping[type[KVCacheSpec], ReferenceKernel]:  # type: ignore[empty-body]
    """Return the reference kernels of the attention types this plugin provides (optional).

    A reference kernel (:class:`kvcore.reference.ReferenceKernel`) is a small
    pure-torch implementation of a layer of one attention type over the paged
    cache. The executor (:mod:`kvcore.executor`, ``kvcore simulate
    --execute``) runs a tiny model made of them through a real
    :class:`~kvcore.KVCacheManager` and checks every output against a dense
    run with no cache: the proof that the block tables hold the right numbers.
    A plugin without this hook works everywhere else; only the executor then
    refuses models with its layers, naming the spec class.

    Called when an executor is built, never on the allocation path. Keep the
    module that imports torch out of the plugin's top-level imports: import it
    inside the hook, so that loading the plugin stays cheap. Each spec class
    may have one kernel: a second claim raises
    :class:`~kvcore.errors.PluginConflictError` naming both plugins. Lookups
    use the exact spec class, as the registry's.

    Returns:
        Spec class → kernel instance.

    Example:
        .. code-block:: python

            @kvcore.hookimpl
            def kvcore_reference_kernels():
                from my_plugin.kernel import MyKernel  # imports torch

                return {MySpec: MyKernel()}

    Used by every built-in plugin, e.g. ``kvcore_plugins.sliding_window.kernel``.

    .. versionadded:: 0.1
    """
