"""Plugin selection and loading: entry points → pluggy → :class:`Registry`.

Nothing happens at import time and there is no global plugin manager: every
call of :func:`load_registry` builds its own pluggy ``PluginManager`` from an
explicit selection, so two engines in one process can use different plugins.
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
from kvcore._registry import PluginInfo, Registry
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
#: Comma-separated plugin names never to load.
ENV_DISABLE_PLUGINS: Final = "KVCORE_DISABLE_PLUGINS"


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

    def info(self, layer_types: tuple[Any, ...] = ()) -> PluginInfo:
        return PluginInfo(
            name=self.name,
            module=self.module,
            distribution=self.distribution,
            version=self.version,
            layer_types=layer_types,
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
            f"with disable=[{candidate.name!r}] or "
            f"{ENV_DISABLE_PLUGINS}={candidate.name}"
        )
        raise PluginLoadError(msg) from exc


def _check_hook_names(pm: pluggy.PluginManager) -> None:
    known = sorted(name for name in dir(hookspecs) if name.startswith("kvcore_"))
    for plugin_name, plugin in pm.list_name_plugin():
        for caller in pm.get_hookcallers(plugin) or []:
            if caller.has_spec():
                continue
            close = difflib.get_close_matches(caller.name, known, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            msg = (
                f"plugin {plugin_name!r} implements {caller.name}, which is not a kvcore "
                f"hook.{hint} Known hooks: {', '.join(known)}"
            )
            raise HookImplementationError(msg)


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

    Raises:
        PluginNotFoundError: a name in ``only``/``disable`` is not installed.
        PluginLoadError: a selected plugin failed to import.
        PluginConflictError: two plugins share a name or claim one spec class.
        HookImplementationError: a plugin implements an unknown hook or
            returns something that is not a ``LayerType``.
        InvalidConfigError: a name is both in ``only`` and ``disable``.
    """
    if only is None and disable is None:
        selection = PluginSelection.from_env(environ)
    else:
        selection = PluginSelection(only=only, disable=disable)  # type: ignore[arg-type]
    return load_selection(selection, plugins=plugins)


def load_selection(
    selection: PluginSelection, *, plugins: Mapping[str, object] | None = None
) -> Registry:
    """Load the plugins of ``selection``; see :func:`load_registry`."""
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
        plugin = _load_plugin(candidate)
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
    _check_hook_names(pm)
    pm.check_pending()

    infos = []
    for candidate in selected:
        plugin = pm.get_plugin(candidate.name)
        others = [p for p in pm.get_plugins() if p is not plugin]
        call = pm.subset_hook_caller("kvcore_layer_types", remove_plugins=others)
        layer_types: list[Any] = []
        for batch in call():
            if not isinstance(batch, list | tuple):
                msg = (
                    f"plugin {candidate.name!r}: kvcore_layer_types must return a list of "
                    f"kvcore.LayerType, got {batch!r}"
                )
                raise HookImplementationError(msg)
            layer_types.extend(batch)
        infos.append(candidate.info(tuple(layer_types)))
    return Registry(tuple(infos), tuple(unselected))
