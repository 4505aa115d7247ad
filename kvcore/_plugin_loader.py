"""Plugin selection and loading: entry points → pluggy → :class:`Registry`.

Nothing happens at import time and there is no global plugin manager: every
call of :func:`~kvcore.load_registry` builds its own pluggy ``PluginManager`` from an
explicit selection, so two engines in one process can use different plugins.
That plugin manager is the only one: every hook is collected through it once
(:mod:`kvcore._hook_collection` lists them) and what the hooks returned is
stored on the registry.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs
import pluggy

from kvcore import hookspecs
from kvcore._hook_collection import COLLECTED_HOOKS
from kvcore._plugin_calls import ENV_DISABLE_PLUGINS, call_plugin, how_to_disable
from kvcore._registry import HookCall, PluginInfo, Registry
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    PluginConflictError,
    PluginLoadError,
    PluginNotFoundError,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "ENV_DISABLE_PLUGINS",
    "ENV_PLUGINS",
    "PluginSelection",
    "load_registry",
]

#: Entry-point group every kvcore plugin registers under.
ENTRY_POINT_GROUP: Final = hookspecs.PROJECT_NAME
#: Comma-separated plugin names to load (all others are left out).
ENV_PLUGINS: Final = "KVCORE_PLUGINS"


def _names(value: Iterable[str] | None) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.split(",")
    return frozenset(name.strip() for name in value if name.strip())


def _names_or_empty(value: Iterable[str] | None) -> frozenset[str]:
    return _names(value) or frozenset()


@attrs.frozen(kw_only=True)
class PluginSelection:
    """Which installed plugins to load. A picklable value: send it to workers.

    Attributes:
        only: Load only these plugin names (``None``: all installed plugins).
        disable: Never load these plugin names.
    """

    only: frozenset[str] | None = attrs.field(default=None, converter=_names)
    disable: frozenset[str] = attrs.field(factory=frozenset, converter=_names_or_empty)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSelection:
        """Read ``KVCORE_PLUGINS`` and ``KVCORE_DISABLE_PLUGINS`` (comma-separated names)."""
        env = os.environ if environ is None else environ
        only = env.get(ENV_PLUGINS)
        return cls(
            only=only if only and only.strip() else None,
            disable=env.get(ENV_DISABLE_PLUGINS) or None,
        )


@attrs.frozen
class _Candidate:
    name: str
    module: str
    distribution: str | None
    version: str | None
    load: Any  # () -> plugin object

    def info(self, contributions: Mapping[str, tuple[Any, ...]] | None = None) -> PluginInfo:
        return PluginInfo(
            name=self.name,
            module=self.module,
            distribution=self.distribution,
            version=self.version,
            contributions=contributions or {},
        )


def _installed_entry_points() -> list[importlib.metadata.EntryPoint]:
    """Entry points of the ``kvcore`` group (a seam tests replace)."""
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _candidates(extra_plugins: Mapping[str, object] | None) -> dict[str, _Candidate]:
    found: dict[str, _Candidate] = {}
    for entry_point in _installed_entry_points():
        dist = entry_point.dist
        candidate = _Candidate(
            name=entry_point.name,
            module=entry_point.value,
            distribution=dist.name if dist is not None else None,
            version=dist.version if dist is not None else None,
            load=entry_point.load,
        )
        previous = found.get(entry_point.name)
        if previous is not None:
            if (previous.distribution, previous.module) == (
                candidate.distribution,
                candidate.module,
            ):
                continue  # the same distribution seen twice on sys.path
            msg = (
                f"two installed distributions declare a kvcore plugin named "
                f"{entry_point.name!r}: {previous.distribution} ({previous.module}) and "
                f"{candidate.distribution} ({candidate.module}); uninstall one of them"
            )
            raise PluginConflictError(msg)
        found[entry_point.name] = candidate
    if extra_plugins is not None and not isinstance(extra_plugins, Mapping):
        msg = (
            "plugins= takes a mapping of plugin names to plugin objects, e.g. "
            f"plugins={{'my_type': my_module}}, got {extra_plugins!r}"
        )
        raise InvalidConfigError(msg)
    for name, plugin in (extra_plugins or {}).items():
        if name in found:
            msg = (
                f"plugin name {name!r} is passed in plugins= but is also installed from "
                f"{found[name].distribution}; pick another name"
            )
            raise PluginConflictError(msg)
        module = getattr(plugin, "__name__", type(plugin).__name__)
        found[name] = _Candidate(name, module, None, None, lambda plugin=plugin: plugin)
    return found


def _check_names_exist(names: frozenset[str], installed: Iterable[str], option: str) -> None:
    installed = sorted(installed)
    missing = sorted(names.difference(installed))
    if not missing:
        return
    hints = []
    for name in missing:
        close = difflib.get_close_matches(name, installed, n=1)
        if close:
            hints.append(f"Did you mean {close[0]!r} for {name!r}?")
    msg = (
        f"kvcore plugins named in {option} are not installed: "
        f"{', '.join(map(repr, missing))}. Installed plugins: {', '.join(installed) or 'none'}."
    )
    if hints:
        msg += " " + " ".join(hints)
    raise PluginNotFoundError(msg)


def _load_plugin(candidate: _Candidate) -> object:
    try:
        return candidate.load()
    except Exception as exc:
        source = (
            f"distribution {candidate.distribution} {candidate.version}"
            if candidate.distribution
            else "passed in plugins="
        )
        msg = (
            f"kvcore plugin {candidate.name!r} ({candidate.module}, {source}) failed to "
            f"import: {type(exc).__name__}: {exc}. Fix or uninstall it, or leave it out "
            f"with {how_to_disable(candidate.name)}"
        )
        raise PluginLoadError(msg) from exc


class _PluginCopy:
    """A hashable copy of an unhashable plugin object (a namespace): pluggy hashes plugins."""

    def __init__(self, attributes: Mapping[str, object]) -> None:
        self.__dict__.update(attributes)


def _registrable(plugin: object) -> object:
    try:
        hash(plugin)
    except TypeError:
        return _PluginCopy({k: getattr(plugin, k) for k in dir(plugin) if k[:2] != "__"})
    return plugin


def _known_hooks() -> list[str]:
    return sorted(name for name in dir(hookspecs) if name.startswith("kvcore_"))


def _check_hooks(pm: pluggy.PluginManager, candidates: Mapping[str, _Candidate]) -> None:
    """Refuse misspelt hooks, hook functions without ``@hookimpl`` and plugins with no hook."""
    known = _known_hooks()
    for plugin_name, plugin in pm.list_name_plugin():
        module = candidates[plugin_name].module
        implemented = set()
        for caller in pm.get_hookcallers(plugin) or []:
            if not caller.has_spec():
                close = difflib.get_close_matches(caller.name, known, n=1)
                hint = f" Did you mean {close[0]}?" if close else ""
                msg = (
                    f"plugin {plugin_name!r} implements {caller.name}, which is not a kvcore "
                    f"hook.{hint} Known hooks: {', '.join(known)}"
                )
                raise HookImplementationError(msg)
            implemented.add(caller.name)
        for name in known:
            if name not in implemented and callable(getattr(plugin, name, None)):
                msg = (
                    f"plugin {plugin_name!r} ({module}) defines {name} without "
                    "@kvcore.hookimpl, so kvcore would never call it; decorate it"
                )
                raise HookImplementationError(msg)
        if not implemented:
            msg = (
                f"plugin {plugin_name!r} ({module}) implements no kvcore hook; mark its hook "
                f"functions with @kvcore.hookimpl (known hooks: {', '.join(known)})"
            )
            raise HookImplementationError(msg)


def _collect(pm: pluggy.PluginManager, name: str) -> dict[str, tuple[Any, ...]]:
    """Call every hook of plugin ``name`` that is called at load; keep the others."""
    contributions: dict[str, tuple[Any, ...]] = {}
    for collected in COLLECTED_HOOKS:
        impls = [
            impl
            for impl in getattr(pm.hook, collected.hook).get_hookimpls()
            if impl.plugin_name == name
        ]
        records: list[Any] = []
        for impl in impls:
            if collected.call_at_load:
                result = call_plugin(name, f"its {collected.hook} hook", impl.function)
                records.extend(collected.records(name, result))
            else:
                records.append(impl.function)
        if records:
            contributions[collected.hook] = tuple(records)
    return contributions


def _hook_calls(pm: pluggy.PluginManager) -> dict[str, tuple[HookCall, ...]]:
    """Implementations of the hooks called later, in pluggy's call order."""
    calls: dict[str, tuple[HookCall, ...]] = {}
    for collected in COLLECTED_HOOKS:
        if collected.call_at_load:
            continue
        impls = getattr(pm.hook, collected.hook).get_hookimpls()
        # pluggy calls the last of get_hookimpls() first (tryfirst at the end).
        calls[collected.hook] = tuple(
            HookCall(impl.plugin_name, impl.function, tuple(impl.argnames))
            for impl in reversed(impls)
        )
    return calls


def load_registry(
    only: Iterable[str] | None = None,
    disable: Iterable[str] | None = None,
    *,
    plugins: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> Registry:
    """Load the selected plugins and return the spec → manager registry.

    With neither ``only`` nor ``disable`` given, the selection comes from the
    environment (``KVCORE_PLUGINS``, ``KVCORE_DISABLE_PLUGINS``; both unset:
    every installed plugin). Giving either argument ignores the environment.

    Args:
        only: Plugin names to load; every other installed plugin is left out.
        disable: Plugin names never to load.
        plugins: Extra plugin objects (modules, classes, namespaces with
            ``@hookimpl`` functions), by name, loaded as if installed.
        environ: The environment to read (default ``os.environ``).

    Every hook of every selected plugin is called here, once; a registry
    never calls a hook afterwards (hooks that take arguments, such as
    :func:`~kvcore.hookspecs.kvcore_model_layers`, are kept and called when a
    model is planned).

    Raises:
        PluginNotFoundError: a name in ``only``/``disable`` is not installed.
        PluginLoadError: a selected plugin failed to import.
        PluginConflictError: two plugins share a name or claim one spec class,
            layer kind or kind.
        HookImplementationError: a plugin implements an unknown hook, defines
            a hook function without ``@hookimpl``, implements no hook, raises
            in a hook, returns nothing usable, or registers classes that break
            the plugin contract; the message names the plugin and the piece.
        UnknownSpecError: a selected plugin needs a spec class no selected
            plugin serves (:attr:`~kvcore.specs.KVCacheSpec.promoted_to`).
        InvalidConfigError: a name is both in ``only`` and ``disable``.
    """
    if only is None and disable is None:
        selection = PluginSelection.from_env(environ)
    else:
        selection = PluginSelection(only=only, disable=disable)
    return load_selection(selection, plugins=plugins)


def load_selection(
    selection: PluginSelection, *, plugins: Mapping[str, object] | None = None
) -> Registry:
    """Load the plugins of ``selection``; see :func:`~kvcore.load_registry`."""
    both = (selection.only or frozenset()) & selection.disable
    if both:
        msg = f"plugins {', '.join(sorted(both))} are both selected and disabled"
        raise InvalidConfigError(msg)
    candidates = _candidates(plugins)
    if selection.only is not None:
        _check_names_exist(selection.only, candidates, "only= / KVCORE_PLUGINS")
    _check_names_exist(selection.disable, candidates, "disable= / KVCORE_DISABLE_PLUGINS")

    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    selected: list[_Candidate] = []
    unselected: list[PluginInfo] = []
    for name in sorted(candidates):
        candidate = candidates[name]
        if name in selection.disable or (selection.only is not None and name not in selection.only):
            unselected.append(candidate.info())
            continue
        plugin = _registrable(_load_plugin(candidate))
        try:
            pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            msg = f"plugin {name!r} ({candidate.module}) has an invalid hook: {exc}"
            raise HookImplementationError(msg) from exc
        except ValueError as exc:
            msg = (
                f"plugin {name!r} ({candidate.module}) is the same object as another "
                f"plugin already loaded: {exc}"
            )
            raise PluginConflictError(msg) from exc
        selected.append(candidate)
    _check_hooks(pm, candidates)
    pm.check_pending()
    infos = tuple(candidate.info(_collect(pm, candidate.name)) for candidate in selected)
    return Registry(infos, tuple(unselected), _hook_calls(pm))
