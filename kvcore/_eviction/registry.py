"""Eviction policies by name, and building a pool's free queue from one.

The core's own policies are listed here (they are not attention types, so
they need no plugin); third parties pass a factory, or register one through
the ``kvcore_eviction_policies`` hook (collected by the plugin layer, read
through ``Registry.eviction_policies``). Resolving a name or a factory gives a
:class:`QueueFactory`: the built-in policies are free queues themselves
(:mod:`kvcore._eviction.queue`); any other policy is driven through the public
protocol by a :class:`~kvcore._eviction.driver.PolicyDriver`.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvcore._eviction.driver import PolicyDriver
from kvcore._eviction.lru import lru_policy
from kvcore._eviction.policies import admit_policy, cost_policy, frequency_policy
from kvcore._eviction.queue import FreeQueue
from kvcore.errors import HookImplementationError, UnknownEvictionPolicyError
from kvcore.eviction import (
    CLASS_POLICY_METHODS,
    POLICY_METHODS,
    EvictionPolicy,
    EvictionPolicyFactory,
    PoolInfo,
)

__all__ = [
    "BUILTIN_POLICIES",
    "DEFAULT_POLICY",
    "SIMULATOR_ONLY_POLICIES",
    "QueueFactory",
    "available_eviction_policies",
    "available_policies",
    "build_policy",
    "resolve_policy",
    "select_policy",
]

#: The policy a pool uses unless told otherwise: the reference engine's order.
DEFAULT_POLICY = "lru"

#: Policies the core provides, by name.
BUILTIN_POLICIES: Mapping[str, Callable[[PoolInfo], FreeQueue]] = MappingProxyType(
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


@attrs.frozen
class QueueFactory:
    """Builds a pool's free queue: a resolved eviction policy.

    Attributes:
        name: The policy's name (or the factory's, for one passed directly).
        build: ``(PoolInfo) -> FreeQueue``.
    """

    name: str
    build: Callable[[PoolInfo], FreeQueue]

    def __call__(self, info: PoolInfo) -> FreeQueue:
        """The free queue of a new pool."""
        return self.build(info)


def _driven(name: str, factory: EvictionPolicyFactory) -> QueueFactory:
    """A third party's policy, behind the driver that gives it the free-queue interface."""
    return QueueFactory(name, lambda info: PolicyDriver(build_policy(factory, info)))


def _check_starts_empty(name: str, policy: EvictionPolicy, info: PoolInfo) -> None:
    if not info.free_at_start and next(iter(policy), None) is not None:
        msg = (
            f"eviction policy {name} starts with free blocks although the pool built it "
            "with PoolInfo.free_at_start=False (a page class of a two-level pool, whose "
            "blocks become free only through release); start with an empty free set then"
        )
        raise HookImplementationError(msg)


def _describe(factory: Callable[..., Any]) -> str:
    doc = getattr(factory, "description", None) or getattr(factory, "__doc__", None) or ""
    doc = doc.strip()
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
    eviction: str | EvictionPolicyFactory | QueueFactory,
    plugin_policies: Mapping[str, EvictionPolicyFactory] | None = None,
) -> QueueFactory:
    """Turn a policy name or a factory into the factory of a pool's free queue.

    Args:
        eviction: A built-in or plugin policy name, a factory
            ``(PoolInfo) -> EvictionPolicy``, or an already resolved
            :class:`QueueFactory` (returned as is).
        plugin_policies: Policies registered by plugins, by name.

    Raises:
        UnknownEvictionPolicyError: no built-in or plugin policy has that
            name (the message lists those that exist), or ``eviction`` is
            neither a name nor callable.
    """
    if isinstance(eviction, QueueFactory):
        return eviction
    if not isinstance(eviction, str):
        if not callable(eviction):
            msg = (
                "eviction must be a policy name or a factory (PoolInfo) -> EvictionPolicy, "
                f"got {eviction!r}"
            )
            raise UnknownEvictionPolicyError(msg)
        return _driven(getattr(eviction, "__qualname__", repr(eviction)), eviction)
    builtin = BUILTIN_POLICIES.get(eviction)
    if builtin is not None:
        return QueueFactory(eviction, builtin)
    plugin = plugin_policies.get(eviction) if plugin_policies else None
    if plugin is not None:
        return _driven(eviction, plugin)
    raise _unknown_policy(eviction, list(available_policies(plugin_policies)))


def select_policy(
    eviction: str | EvictionPolicyFactory,
    plugin_policies: Mapping[str, EvictionPolicyFactory] | None = None,
) -> str | EvictionPolicyFactory:
    """What to hand a :class:`~kvcore.managers.BlockPool`: a built-in name, or a policy factory.

    A plugin's policy name becomes the plugin's factory (the pool knows no
    plugins); anything else is returned as is once it is known to resolve.

    Raises:
        UnknownEvictionPolicyError: as :func:`resolve_policy`.
    """
    resolve_policy(eviction, plugin_policies)
    if isinstance(eviction, str) and eviction not in BUILTIN_POLICIES:
        assert plugin_policies is not None  # resolved: a plugin's name
        return plugin_policies[eviction]
    return eviction


def _unknown_policy(name: str, names: list[str]) -> UnknownEvictionPolicyError:
    if name in SIMULATOR_ONLY_POLICIES:
        msg = (
            f"eviction policy {name!r} is not available to a KV cache manager: it is "
            f"{SIMULATOR_ONLY_POLICIES[name]}. Available: {', '.join(names)}"
        )
        return UnknownEvictionPolicyError(msg)
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    msg = (
        f"unknown eviction policy {name!r}. Available: {', '.join(names)} "
        f"(plugins add more through the kvcore_eviction_policies hook).{hint}"
    )
    return UnknownEvictionPolicyError(msg)


def build_policy(factory: EvictionPolicyFactory, info: PoolInfo) -> EvictionPolicy:
    """Call ``factory`` and check that what it built has every protocol method.

    Raises:
        HookImplementationError: a method of :class:`~kvcore.eviction.EvictionPolicy`
            is missing, naming the factory and the methods; or the policy
            starts with free blocks when ``info.free_at_start`` is false.
    """
    policy = factory(info)
    name = getattr(factory, "__qualname__", None) or repr(factory)
    required = POLICY_METHODS if info.free_at_start else POLICY_METHODS + CLASS_POLICY_METHODS
    missing = [method for method in required if not callable(getattr(policy, method, None))]
    if missing:
        where = "" if info.free_at_start else " for a page class of a two-level pool"
        msg = (
            f"eviction policy factory {name} built a {type(policy).__name__}{where} without "
            f"{', '.join(missing)}; an EvictionPolicy needs {', '.join(POLICY_METHODS)} "
            f"(and {', '.join(CLASS_POLICY_METHODS)} when PoolInfo.free_at_start is false; "
            "see kvcore.eviction)"
        )
        raise HookImplementationError(msg)
    _check_starts_empty(name, policy, info)
    return policy
