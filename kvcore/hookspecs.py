"""The plugin contract: every hook a kvcore plugin can implement.

A plugin is a module (or any object) registered under the ``kvcore``
entry-point group whose functions are marked with :data:`hookimpl`. Hooks are
named ``kvcore_*`` and take keyword arguments only. A registry
(:func:`kvcore.load_registry`) calls the hooks of every selected plugin
**once**, when it is built, and keeps what they returned; hooks never run on
the allocation path. A hook that takes arguments
(:func:`kvcore_model_layers`) or is expensive
(:func:`kvcore_reference_kernels`, which imports torch) is kept and called
when a model is planned or an executor is built.

Whatever a hook (or a function it returned) raises comes out as a
:class:`~kvcore.errors.HookImplementationError` naming the plugin, the hook
and how to leave the plugin out. A hook that returns ``None`` (a missing
``return``) or nothing usable is an error too, as is a hook function without
``@hookimpl`` or a plugin implementing no hook at all.

Adding a hook to kvcore takes a function here and one entry in
``kvcore._hook_collection.COLLECTED_HOOKS`` (its docstring shows how).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import pluggy

from kvcore._plugin_types import LayerBuilder, LayerKind, LayerType, ModelLayer, PlanOption
from kvcore.eviction import EvictionPolicyFactory
from kvcore.specs import KVCacheSpec

if TYPE_CHECKING:
    from kvcore._planning.model_fields import ModelFields
    from kvcore.reference import ReferenceKernel

__all__ = [
    "PROJECT_NAME",
    "hookimpl",
    "hookspec",
    "kvcore_eviction_policies",
    "kvcore_layer_kinds",
    "kvcore_layer_types",
    "kvcore_model_layers",
    "kvcore_plan_options",
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
    raises :class:`~kvcore.errors.PluginConflictError` naming both plugins,
    as do two plugins declaring different KV formats under one name.
    The registry looks spec classes up exactly, so a spec subclass needs its
    own :class:`~kvcore.LayerType`.

    Every spec and manager class returned is checked against the plugin
    contract when the registry is built (a ``kind`` of its own, the page
    described by ``page_parts``, a ``find_longest_cache_hit(cls, query)``
    classmethod, ``frees_skipped_blocks`` declared when blocks are freed
    early, the quantized formats a spec class stores in ``kv_formats`` as a
    tuple of :class:`~kvcore.specs.KVFormat`, ...): a class breaking it raises
    :class:`~kvcore.errors.HookImplementationError` naming the class and the
    missing piece. :func:`kvcore.testing.check_plugin` checks the behaviour.

    Returns:
        One :class:`~kvcore.LayerType` per spec class the plugin serves (at
        least one).

    Example:
        .. code-block:: python

            @kvcore.hookimpl
            def kvcore_layer_types():
                return [kvcore.LayerType(MySpec, MyManager)]

    Used by every built-in plugin, e.g. ``kvcore_plugins.full_attention``.

    .. versionadded:: 0.1
    """


@hookspec
def kvcore_layer_kinds() -> Sequence[LayerKind] | Mapping[str, LayerBuilder]:  # type: ignore[empty-body]
    """Return the layer kinds this plugin builds specs for, from a model's ``config.json``.

    Planning a model (:func:`kvcore.plan`, :func:`kvcore.planning.build_layer_specs`)
    gives every layer that holds a cache a *layer kind*: the entry of the
    config's ``layer_types`` list, or the kind a plugin derived from the
    config (:func:`kvcore_model_layers`). For each layer kvcore calls the
    builder of its kind with a :class:`~kvcore.planning.LayerConfig` and uses the spec
    it returns. A type with one kind names it after the type (its spec's
    ``kind``); ``LayerKind.aliases`` lists the names model
    configs use for it (Hugging Face's ``"sliding_attention"``).

    Called once per plugin when a registry is built. Each kind name (and
    alias) may be claimed by one plugin only: a second claim raises
    :class:`~kvcore.errors.PluginConflictError` naming both plugins. A layer
    whose kind no selected plugin claims raises
    :class:`~kvcore.errors.UnknownSpecError` listing the kinds claimed.

    Returns:
        :class:`~kvcore.planning.LayerKind` records (at least one), or a mapping of
        kind names to builders (kinds without aliases). A builder takes the
        layer's :class:`~kvcore.planning.LayerConfig` and returns its spec; it reads
        the config through ``LayerConfig.require_int`` and friends, whose
        errors name the model, the file and the field.

    Example:
        .. code-block:: python

            from kvcore_plugins.sliding_window import SlidingWindowSpec

            def build(layer: kvcore.planning.LayerConfig) -> SlidingWindowSpec:
                return SlidingWindowSpec(
                    block_size=layer.block_size,
                    num_kv_heads=layer.num_kv_heads,
                    head_size=layer.head_size,
                    dtype=layer.dtype,
                    sliding_window=layer.require_int("sliding_window"),
                )

            @kvcore.hookimpl
            def kvcore_layer_kinds():
                kind = kvcore.planning.LayerKind
                return [kind("sliding_window", build, aliases=("sliding_attention",))]

    Used by the built-in plugins, e.g. ``kvcore_plugins.sliding_window.model_config``.

    .. versionadded:: 0.1
    """


@hookspec(firstresult=True)
def kvcore_model_layers(model: ModelFields) -> Sequence[ModelLayer] | None:
    """Derive the cache-holding layers of a model from its config, if this plugin knows how.

    Called when a model config is loaded (:func:`kvcore.planning.load_model_config`,
    :func:`kvcore.plan`), in pluggy's order (``tryfirst`` implementations
    first, ``trylast`` ones last); the **first** result other than ``None``
    wins. When every implementation returns ``None``, the config's own
    ``layer_types`` list gives one layer per entry.

    Recognise only your own fields (a window pattern, an attention period,
    an encoder-decoder layout) and return ``None`` for any other config, and
    for a config that lists ``layer_types`` unless your fields change what
    its kinds mean. Implementations are kept when the registry is built;
    whatever one raises comes out naming the plugin (kvcore's own errors,
    raised by :class:`~kvcore.planning.ModelFields`' readers, pass through).

    Args:
        model: The config's fields, with readers whose errors name the file
            and the field, and :meth:`~kvcore.planning.ModelFields.decoder_layers` to
            name one layer per decoder layer.

    Returns:
        Every cache-holding layer in order, or ``None``.

    Example:
        .. code-block:: python

            @kvcore.hookimpl
            def kvcore_model_layers(model):
                if model.layer_types is not None or model.get("my_window") is None:
                    return None
                return model.decoder_layers(["my_type"] * model.num_hidden_layers)

    Used by ``kvcore_plugins.sliding_window`` (Gemma patterns, a model-wide
    window), ``kvcore_plugins.mamba`` (Jamba, Qwen3-Next),
    ``kvcore_plugins.chunked_local`` (Llama-4), ``kvcore_plugins.mla``
    (``kv_lora_rank``), ``kvcore_plugins.cross_attention`` (encoder-decoder
    models) and ``kvcore_plugins.full_attention`` (``trylast``: every layer
    of a plain decoder).

    .. versionadded:: 0.1
    """


@hookspec
def kvcore_plan_options() -> Sequence[PlanOption]:  # type: ignore[empty-body]
    """Return the options this plugin's layer-kind builders read.

    A user sets an option as ``"<plugin>.<name>"``:
    ``kvcore.plan(model, options={"mamba.cache_mode": "none"})`` or
    ``kvcore plan MODEL --option mamba.cache_mode=none``. Planning checks the
    name and the value (``PlanOption.choices``) before any layer
    is built, then hands each builder its plugin's values in
    ``LayerConfig.options`` (read them with
    :meth:`~kvcore.planning.LayerConfig.option`). ``kvcore plugins`` lists them.

    Called once per plugin when a registry is built.

    Returns:
        :class:`~kvcore.planning.PlanOption` records (at least one, names unique).

    Example:
        .. code-block:: python

            @kvcore.hookimpl
            def kvcore_plan_options():
                return [
                    kvcore.planning.PlanOption(
                        name="cache_mode", default="align", choices=("align", "none")
                    )
                ]

    Used by ``kvcore_plugins.mamba`` (``cache_mode``).

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


@hookspec
def kvcore_eviction_policies() -> Mapping[str, EvictionPolicyFactory]:  # type: ignore[empty-body]
    """Return the eviction policies this plugin provides, by name.

    An eviction policy decides which free block the block pool hands out
    next, and so which cached prefixes survive (:mod:`kvcore.eviction`
    describes the protocol; :doc:`/explanation/architecture` walks through
    it). Engines pick one by name:
    ``KVCacheManager(config, max_model_len, registry=registry, eviction="mine")``
    or ``kvcore simulate --eviction mine``.

    Called once per plugin when a registry is built; the factories are kept
    (``Registry.eviction_policies``) and called once per block pool, never on
    the allocation path. What a factory raises comes out as
    :class:`~kvcore.errors.HookImplementationError` naming the plugin; the
    policy's own methods run on the allocation path and are not wrapped. A
    name may be claimed by one plugin only, and not by a policy kvcore
    provides itself (:func:`kvcore.available_eviction_policies` lists them;
    ``belady`` is the simulator's): either raises
    :class:`~kvcore.errors.PluginConflictError`. Asking a manager for a name
    nobody provides raises :class:`~kvcore.errors.UnknownEvictionPolicyError`
    listing the available ones.

    Returns:
        Policy name → factory (at least one). A factory takes a
        :class:`~kvcore.eviction.PoolInfo` and returns an object with every
        method of :class:`~kvcore.eviction.EvictionPolicy` (checked when the
        pool is built).

    Example:
        .. code-block:: python

            @kvcore.hookimpl
            def kvcore_eviction_policies():
                return {"newest-first": NewestFirst}  # NewestFirst(info: PoolInfo)

    ``examples/eviction_policy.py`` is a complete one.

    .. versionadded:: 0.1
    """
