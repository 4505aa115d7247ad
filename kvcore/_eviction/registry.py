"""Eviction policies by name: the built-in ones and those plugins register.

The core registers its own policies here (they are not attention types, so
they need no plugin); third parties add theirs through the
``kvcore_eviction_policies`` hook, collected once when a registry is loaded
(``kvcore._hook_collection``) and read through ``Registry.eviction_policies``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from kvcore._eviction.policies import admit_policy, cost_policy, frequency_policy
from kvcore._free_queue import lru_policy
from kvcore._plugin_calls import call_plugin
from kvcore.errors import HookImplementationError, PluginConflictError, UnknownEvictionPolicyError
from kvcore.eviction import POLICY_METHODS, EvictionPolicy, EvictionPolicyFactory, PoolInfo

__all__ = [
    "available_eviction_policies",
    "BUILTIN_POLICIES",
    "PluginPolicyFactory",
    "DEFAULT_POLICY",
    "SIMULATOR_ONLY_POLICIES",
    "available_policies",
    "build_policy",
    "check_plugin_policies",
    "resolve_policy",
]

#: The policy a pool uses unless told otherwise: the reference engine's order.
DEFAULT_POLICY = "lru"

#: Policies the core provides, by name.
BUILTIN_POLICIES: Mapping[str, EvictionPolicyFactory] = MappingProxyType(
    {
        "lru": lru_policy,
        "admit": admit_policy,
        "frequency": frequency_policy,
        "cost": cost_policy,
    }
)

#: Names that exist only inside ``kvcore simulate`` (they need the future), with why.
SIMULATOR_ONLY_POLICIES: Mapping[str, str] = MappingProxyType(
    {
        "belady": "an offline oracle that needs the whole trace in advance; "
        "use it through 'kvcore simulate --eviction belady'",
    }
)


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


def _describe(factory: Callable[..., Any]) -> str:
    if isinstance(factory, PluginPolicyFactory):
        factory = factory.factory
    doc = (getattr(factory, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def available_policies(
    plugin_policies: Mapping[str, EvictionPolicyFactory] | None = None,
) -> dict[str, str]:
    """Every selectable policy name with a one-line description, built-ins first.

    Args:
        plugin_policies: Policies registered by plugins (``Registry.eviction_policies``).
    """
    out = {name: _describe(factory) for name, factory in BUILTIN_POLICIES.items()}
    for name, factory in sorted((plugin_policies or {}).items()):
        out[name] = _describe(factory)
    return out


def available_eviction_policies(registry: Any = None) -> dict[str, str]:
    """The eviction policies a :class:`~kvcore.KVCacheManager` accepts, with descriptions.

    Args:
        registry: A :class:`~kvcore.Registry` whose plugins' policies to
            include (default: built-in policies only).

    Returns:
        Policy name → one-line description; built-in policies first, ``"lru"``
        (the default) first of all.
    """
    plugin_policies = registry.eviction_policies if registry is not None else None
    return available_policies(plugin_policies)


def resolve_policy(
    eviction: str | EvictionPolicyFactory,
    plugin_policies: Mapping[str, EvictionPolicyFactory] | None = None,
) -> EvictionPolicyFactory:
    """Turn a policy name (or a factory, returned as is) into a factory.

    Raises:
        UnknownEvictionPolicyError: no built-in or plugin policy has that
            name; the message lists those that exist.
    """
    if not isinstance(eviction, str):
        if not callable(eviction):
            msg = (
                "eviction must be a policy name or a factory (PoolInfo) -> EvictionPolicy, "
                f"got {eviction!r}"
            )
            raise UnknownEvictionPolicyError(msg)
        return eviction
    factory = BUILTIN_POLICIES.get(eviction)
    if factory is None and plugin_policies:
        factory = plugin_policies.get(eviction)
    if factory is not None:
        return factory
    names = list(available_policies(plugin_policies))
    if eviction in SIMULATOR_ONLY_POLICIES:
        msg = (
            f"eviction policy {eviction!r} is not available to a KV cache manager: it is "
            f"{SIMULATOR_ONLY_POLICIES[eviction]}. Available: {', '.join(names)}"
        )
        raise UnknownEvictionPolicyError(msg)
    close = difflib.get_close_matches(eviction, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    msg = (
        f"unknown eviction policy {eviction!r}. Available: {', '.join(names)} "
        f"(plugins add more through the kvcore_eviction_policies hook).{hint}"
    )
    raise UnknownEvictionPolicyError(msg)


def build_policy(factory: EvictionPolicyFactory, info: PoolInfo) -> EvictionPolicy:
    """Call ``factory`` and check that what it built has every protocol method.

    Raises:
        HookImplementationError: a method of :class:`~kvcore.eviction.EvictionPolicy`
            is missing, naming the factory and the methods.
    """
    policy = factory(info)
    missing = [name for name in POLICY_METHODS if not callable(getattr(policy, name, None))]
    if missing:
        name = getattr(factory, "__qualname__", None) or repr(factory)
        msg = (
            f"eviction policy factory {name} built a {type(policy).__name__} without "
            f"{', '.join(missing)}; an EvictionPolicy needs {', '.join(POLICY_METHODS)} "
            "(see kvcore.eviction)"
        )
        raise HookImplementationError(msg)
    return policy


def check_plugin_policies(plugin: str, result: object) -> tuple[tuple[str, Any], ...]:
    """Check one plugin's ``kvcore_eviction_policies`` result; its ``(name, factory)`` records.

    Two plugins claiming one name are refused by the registry, as for every
    keyed hook.

    Raises:
        HookImplementationError: the result is not a non-empty mapping of
            names to callables.
        PluginConflictError: the plugin claims a name kvcore uses itself.
    """
    from kvcore._hook_collection import bad_result

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
