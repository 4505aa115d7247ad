"""The registry: spec type → manager class, resolved once from the loaded plugins."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Generic

import attrs

from kvcore.errors import HookImplementationError, PluginConflictError, UnknownSpecError
from kvcore.managers import SingleTypeManager, SpecT
from kvcore.specs import KVCacheSpec

__all__ = ["LayerType", "PluginInfo", "Registry"]


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@attrs.frozen
class LayerType(Generic[SpecT]):
    """An attention type a plugin provides: a spec class and the manager serving it.

    Attributes:
        spec: The spec class (a subclass of :class:`kvcore.specs.KVCacheSpec`).
            Lookups use this exact class: a subclass is not served unless it is
            registered too.
        manager: The manager class (a subclass of
            :class:`kvcore.managers.SingleTypeManager`).
    """

    spec: type[SpecT]
    manager: type[SingleTypeManager[SpecT]]


@attrs.frozen(kw_only=True)
class PluginInfo:
    """One plugin: where it comes from and what it provides.

    Attributes:
        name: The plugin name (its entry-point name), used by ``only=`` and
            ``disable=``.
        module: The entry point's target (``module`` or ``module:attribute``).
        distribution: The installed distribution that declares it, or
            ``None`` for a plugin object passed in directly.
        version: The distribution's version, or ``None``.
        layer_types: The attention types it provides (empty if not loaded).
    """

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    layer_types: tuple[LayerType[Any], ...] = ()

    def provides_module(self, module: str) -> bool:
        """Whether ``module`` lives inside this plugin's package."""
        package = self.module.split(":", 1)[0]
        return module == package or module.startswith(package + ".")


@attrs.frozen
class Registry:
    """An immutable map from spec class to manager class, with provenance.

    Build it with :func:`kvcore.load_registry`. The engine resolves every
    group's manager class through :meth:`manager_class` once, when the KV cache
    manager is created; nothing here runs on the allocation path.

    Attributes:
        plugins: The loaded plugins, by name.
        unselected: Installed plugins that the selection left out (not
            imported); used to say which plugin to enable for an unknown spec.
    """

    plugins: tuple[PluginInfo, ...]
    unselected: tuple[PluginInfo, ...] = ()
    _by_spec: Mapping[type[KVCacheSpec], tuple[LayerType[Any], PluginInfo]] = attrs.field(
        init=False
    )

    def __attrs_post_init__(self) -> None:
        by_spec: dict[type[KVCacheSpec], tuple[LayerType[Any], PluginInfo]] = {}
        for plugin in self.plugins:
            for layer_type in plugin.layer_types:
                _check_layer_type(layer_type, plugin)
                previous = by_spec.get(layer_type.spec)
                if previous is not None:
                    other_type, other = previous
                    msg = (
                        f"{_qualname(layer_type.spec)} is claimed by plugin {other.name!r} "
                        f"(manager {_qualname(other_type.manager)}) and by plugin "
                        f"{plugin.name!r} (manager {_qualname(layer_type.manager)}); "
                        "disable one of the two plugins (disable=[...] or "
                        "KVCORE_DISABLE_PLUGINS)"
                    )
                    raise PluginConflictError(msg)
                by_spec[layer_type.spec] = (layer_type, plugin)
        object.__setattr__(self, "_by_spec", MappingProxyType(by_spec))

    @property
    def layer_types(self) -> tuple[LayerType[Any], ...]:
        """Every registered layer type, in plugin order."""
        return tuple(layer_type for layer_type, _ in self._by_spec.values())

    def manager_class(self, spec: KVCacheSpec | type[KVCacheSpec]) -> type[SingleTypeManager[Any]]:
        """Return the manager class serving ``spec`` (a spec or a spec class).

        Raises:
            UnknownSpecError: no loaded plugin registers this exact spec class;
                the message names the installed plugin to enable, if any.
        """
        spec_type = spec if isinstance(spec, type) else type(spec)
        entry = self._by_spec.get(spec_type)
        if entry is None:
            raise UnknownSpecError(self._unknown_spec_message(spec_type))
        return entry[0].manager

    def plugin_for(self, spec: KVCacheSpec | type[KVCacheSpec]) -> PluginInfo:
        """Return the plugin that registered ``spec``'s class.

        Raises:
            UnknownSpecError: as :meth:`manager_class`.
        """
        spec_type = spec if isinstance(spec, type) else type(spec)
        entry = self._by_spec.get(spec_type)
        if entry is None:
            raise UnknownSpecError(self._unknown_spec_message(spec_type))
        return entry[1]

    def __contains__(self, spec_type: object) -> bool:
        return spec_type in self._by_spec

    def _unknown_spec_message(self, spec_type: type) -> str:
        loaded = ", ".join(sorted(t.__name__ for t in self._by_spec)) or "none"
        head = f"no selected kvcore plugin serves {_qualname(spec_type)}"
        owners = [p for p in self.unselected if p.provides_module(spec_type.__module__)]
        if owners:
            name = owners[0].name
            return (
                f"{head}: it belongs to plugin {name!r}, which is installed but not "
                f"selected; enable it (remove {name!r} from disable= / "
                f"KVCORE_DISABLE_PLUGINS, or add it to only= / KVCORE_PLUGINS). "
                f"Loaded layer types: {loaded}"
            )
        return (
            f"{head}: no installed plugin declares it. Install the plugin that "
            "provides it, or register its LayerType from a kvcore_layer_types hook. "
            f"Loaded layer types: {loaded}"
        )


def _check_layer_type(layer_type: object, plugin: PluginInfo) -> None:
    if not isinstance(layer_type, LayerType):
        msg = (
            f"plugin {plugin.name!r}: kvcore_layer_types must return kvcore.LayerType "
            f"records, got {layer_type!r}"
        )
        raise HookImplementationError(msg)
    spec, manager = layer_type.spec, layer_type.manager
    if not (isinstance(spec, type) and issubclass(spec, KVCacheSpec)):
        msg = (
            f"plugin {plugin.name!r}: LayerType.spec must be a subclass of "
            f"kvcore.specs.KVCacheSpec, got {spec!r}"
        )
        raise HookImplementationError(msg)
    if not (isinstance(manager, type) and issubclass(manager, SingleTypeManager)):
        msg = (
            f"plugin {plugin.name!r}: LayerType.manager for {spec.__name__} must be a "
            f"subclass of kvcore.managers.SingleTypeManager, got {manager!r}"
        )
        raise HookImplementationError(msg)


def registry_from_layer_types(
    layer_types: Iterable[LayerType[Any]], *, name: str = "inline"
) -> Registry:
    """Build a registry from layer types directly, without loading any plugin.

    For tests and for engines that assemble their layer types themselves.
    """
    info = PluginInfo(name=name, module=name, layer_types=tuple(layer_types))
    return Registry((info,))
