"""Which hooks a registry collects from every plugin, and how each result is checked.

Every hook is collected **once, when a registry is built**, and what it gave
is stored on the :class:`~kvcore.Registry`: nothing calls a hook later (see
:data:`COLLECTED_HOOKS`). Adding a hook takes two steps:

1. its specification in :mod:`kvcore.hookspecs` (a documented function
   marked ``@hookspec``);
2. one :class:`CollectedHook` entry in :data:`COLLECTED_HOOKS`: the hook's
   name and a function turning one plugin's result into a tuple of records,
   raising :class:`~kvcore.errors.HookImplementationError` (through
   :func:`bad_result`) when the result is unusable. Give ``keys`` when two
   plugins must not claim the same thing (a spec class, a layer kind, a
   policy name): the registry then indexes the records by key and refuses a
   double claim, naming both plugins.

The registry exposes the records through
:meth:`~kvcore.Registry.claims` (keyed hooks) and
:meth:`~kvcore.Registry.records` (all hooks); add a typed accessor on the
registry for the common lookups. A hook without arguments is called at load
and its records stored (``call_at_load=True``). A hook that cannot run at
load, because it takes arguments that only exist later (a model's config) or
because it is expensive (it imports torch), is not called at load: its
implementations are kept, in the plugin manager's order, and called later
through :meth:`~kvcore.Registry.first_result` (the first answer wins) or
:meth:`~kvcore.Registry.gather` (every plugin's records, checked and indexed
by key as at load); both wrap what the implementations raise.

Example, a hook returning eviction policies by name::

    def _policies(plugin: str, result: object) -> tuple[tuple[str, Callable], ...]:
        if not isinstance(result, Mapping) or not result:
            expected = "a mapping of names to factories"
            raise bad_result(plugin, "kvcore_eviction_policies", expected, result)
        return tuple(result.items())

    CollectedHook(
        "kvcore_eviction_policies", _policies, keys=lambda item: (item[0],), what="eviction policy"
    )
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from kvcore._eviction.registry import BUILTIN_POLICIES, SIMULATOR_ONLY_POLICIES
from kvcore._plugin_calls import call_plugin
from kvcore._plugin_types import LayerKind, LayerType, PlanOption
from kvcore.errors import HookImplementationError, PluginConflictError
from kvcore.eviction import EvictionPolicy, EvictionPolicyFactory, PoolInfo
from kvcore.specs import KVCacheSpec

__all__ = [
    "COLLECTED_HOOKS",
    "CollectedHook",
    "PluginPolicyFactory",
    "bad_result",
    "collected_hook",
]


def _qualname(value: object) -> str:
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return repr(value)


@attrs.frozen
class CollectedHook:
    """How a registry collects one hook from every plugin.

    Attributes:
        hook: The hook's name (a function of :mod:`kvcore.hookspecs`).
        records: ``(plugin name, one implementation's result) -> records``;
            raises :class:`~kvcore.errors.HookImplementationError` for an
            unusable result (``None`` included: a hook without ``return``).
        keys: The keys a record claims (``None``: records claim nothing).
        what: What a key is, for conflict messages (``"spec class"``).
        describe_key: A key as messages show it.
        call_at_load: Call the hook at load (no arguments). ``False``: the
            records are the implementations, called later with arguments.
    """

    hook: str
    records: Callable[[str, object], tuple[Any, ...]]
    keys: Callable[[Any], Iterable[Hashable]] | None = None
    what: str = "name"
    describe_key: Callable[[Hashable], str] = _qualname
    call_at_load: bool = True


def bad_result(plugin: str, hook: str, expected: str, got: object) -> HookImplementationError:
    """The error for a hook result that is not what the hook must return."""
    hint = " (a hook without a return statement returns None)" if got is None else ""
    msg = f"plugin {plugin!r}: {hook} must return {expected}, got {got!r}{hint}"
    return HookImplementationError(msg)


def _layer_types(plugin: str, result: object) -> tuple[Any, ...]:
    expected = "a non-empty list of kvcore.LayerType"
    if not isinstance(result, list | tuple) or not result:
        raise bad_result(plugin, "kvcore_layer_types", expected, result)
    for item in result:
        if not isinstance(item, LayerType):
            msg = (
                f"plugin {plugin!r}: kvcore_layer_types must return kvcore.LayerType "
                f"records, got {item!r}"
            )
            raise HookImplementationError(msg)
    return tuple(result)


def _layer_kinds(plugin: str, result: object) -> tuple[LayerKind, ...]:
    expected = (
        "a non-empty list of kvcore.planning.LayerKind (or a mapping of kind names to builders)"
    )
    if isinstance(result, Mapping):
        if not result or not all(isinstance(k, str) and callable(v) for k, v in result.items()):
            raise bad_result(plugin, "kvcore_layer_kinds", expected, result)
        return tuple(LayerKind(name, build) for name, build in result.items())
    if not isinstance(result, list | tuple) or not result:
        raise bad_result(plugin, "kvcore_layer_kinds", expected, result)
    for item in result:
        if not isinstance(item, LayerKind) or not callable(item.build):
            raise bad_result(plugin, "kvcore_layer_kinds", expected, result)
    return tuple(result)


def _plan_options(plugin: str, result: object) -> tuple[PlanOption, ...]:
    expected = "a non-empty list of kvcore.planning.PlanOption"
    if not isinstance(result, list | tuple) or not result:
        raise bad_result(plugin, "kvcore_plan_options", expected, result)
    if not all(isinstance(item, PlanOption) for item in result):
        raise bad_result(plugin, "kvcore_plan_options", expected, result)
    names = [option.name for option in result]
    if len(set(names)) != len(names):
        msg = f"plugin {plugin!r}: kvcore_plan_options declares an option twice: {names}"
        raise HookImplementationError(msg)
    return tuple(result)


def _implementations(plugin: str, result: object) -> tuple[Any, ...]:
    return (result,)


def _reference_kernels(plugin: str, result: object) -> tuple[tuple[type[Any], Any], ...]:
    # That each kernel is a ReferenceKernel is checked by the executor, which
    # gathers this hook (kernels import torch; the registry does not).
    ok = (
        isinstance(result, Mapping)
        and bool(result)
        and all(
            isinstance(spec, type) and issubclass(spec, KVCacheSpec) and kernel is not None
            for spec, kernel in result.items()
        )
    )
    if not ok:
        expected = (
            "a non-empty mapping of spec classes to kvcore.reference.ReferenceKernel instances"
        )
        raise bad_result(plugin, "kvcore_reference_kernels", expected, result)
    assert isinstance(result, Mapping)
    return tuple(result.items())


def _eviction_policies(plugin: str, result: object) -> tuple[tuple[str, Any], ...]:
    """Check one plugin's ``kvcore_eviction_policies`` result; its ``(name, factory)`` records.

    Two plugins claiming one name are refused by the registry, as for every
    keyed hook.

    Raises:
        HookImplementationError: the result is not a non-empty mapping of
            names to callables.
        PluginConflictError: the plugin claims a name kvcore uses itself.
    """
    ok = (
        isinstance(result, Mapping)
        and bool(result)
        and all(isinstance(k, str) and k and callable(v) for k, v in result.items())
    )
    if not ok:
        expected = "a non-empty mapping of policy names to factories (PoolInfo) -> EvictionPolicy"
        raise bad_result(plugin, "kvcore_eviction_policies", expected, result)
    assert isinstance(result, Mapping)
    for name in result:
        if name in BUILTIN_POLICIES or name in SIMULATOR_ONLY_POLICIES:
            msg = (
                f"plugin {plugin!r} registers eviction policy {name!r}, a name kvcore uses for "
                "a policy of its own; pick another name"
            )
            raise PluginConflictError(msg)
    return tuple(result.items())


class PluginPolicyFactory:
    """A plugin's policy factory, called so that what it raises names the plugin.

    ``Registry.eviction_policies`` hands these out: building a pool calls the
    factory once, through :func:`~kvcore._plugin_calls.call_plugin`, so an
    exception inside it comes out as
    :class:`~kvcore.errors.HookImplementationError` naming the plugin and the
    policy (kvcore's own errors pass through). The policy's methods are not
    wrapped: they run on the allocation path.
    """

    __slots__ = ("factory", "name", "plugin")

    def __init__(self, plugin: str, name: str, factory: EvictionPolicyFactory) -> None:
        self.plugin = plugin
        self.name = name
        self.factory = factory

    def __call__(self, info: PoolInfo) -> EvictionPolicy:
        factory = self.factory
        return call_plugin(
            self.plugin,
            f"the factory of its eviction policy {self.name!r}",
            lambda: factory(info),
            pass_kvcore_errors=True,
        )

    def __repr__(self) -> str:
        what = getattr(self.factory, "__qualname__", repr(self.factory))
        return f"eviction policy {self.name!r} of plugin {self.plugin!r} ({what})"

    @property
    def description(self) -> str:
        """The factory's docstring (what ``kvcore.available_eviction_policies`` shows)."""
        return getattr(self.factory, "__doc__", None) or ""


def _kind_names(kind: LayerKind) -> Sequence[str]:
    return kind.names


#: Every hook a registry collects, in the order they are collected.
COLLECTED_HOOKS: Final[tuple[CollectedHook, ...]] = (
    CollectedHook(
        "kvcore_layer_types",
        _layer_types,
        keys=lambda layer_type: (layer_type.spec,),
        what="spec class",
    ),
    CollectedHook(
        "kvcore_layer_kinds",
        _layer_kinds,
        keys=_kind_names,
        what="layer kind",
    ),
    CollectedHook("kvcore_plan_options", _plan_options),
    CollectedHook("kvcore_model_layers", _implementations, call_at_load=False),
    CollectedHook(
        "kvcore_eviction_policies",
        _eviction_policies,
        keys=lambda item: (item[0],),
        what="eviction policy",
        describe_key=repr,
    ),
    CollectedHook(
        "kvcore_reference_kernels",
        _reference_kernels,
        keys=lambda item: (item[0],),
        what="the reference kernel of",
        call_at_load=False,
    ),
)


def collected_hook(hook: str) -> CollectedHook:
    """The :data:`COLLECTED_HOOKS` entry of ``hook``.

    Raises:
        KeyError: the hook is not collected.
    """
    for entry in COLLECTED_HOOKS:
        if entry.hook == hook:
            return entry
    raise KeyError(hook)
