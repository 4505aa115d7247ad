"""The registry: everything the selected plugins provide, collected once and checked.

Built by :func:`kvcore.load_registry`: every hook of every selected plugin is
called once (or, for a hook taking arguments or importing torch, its
implementations are kept and called later through the registry),
the records are checked against the plugin contract, and double claims are
refused. Nothing here runs on the allocation path: the engine resolves spec
type → manager class once, when a KV cache manager is made.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Hashable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvcore._contract import check_manager_class, check_spec_class, qualname
from kvcore._hook_collection import (
    COLLECTED_HOOKS,
    CollectedHook,
    PluginPolicyFactory,
    collected_hook,
)
from kvcore._kv_formats import DeclaredFormat, collect_kv_formats, resolve_cache_dtype
from kvcore._plugin_calls import call_plugin, how_to_disable
from kvcore._plugin_types import LayerKind, LayerType, PlanOption
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    PluginConflictError,
    UnknownSpecError,
)
from kvcore.managers import SingleTypeManager
from kvcore.specs import KVCacheSpec, KVFormat

__all__ = ["Claim", "HookCall", "LayerType", "PluginInfo", "Registry", "registry_from_layer_types"]


def _read_only_records(value: Mapping[str, tuple[Any, ...]]) -> Mapping[str, tuple[Any, ...]]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class PluginInfo:
    """One plugin: where it comes from and what its hooks returned.

    Attributes:
        name: The plugin name (its entry-point name), used by ``only=`` and
            ``disable=``.
        module: The entry point's target (``module`` or ``module:attribute``).
        distribution: The installed distribution that declares it, or
            ``None`` for a plugin object passed in directly.
        version: The distribution's version, or ``None``.
        contributions: Hook name → the records the plugin's implementations
            returned (empty for a plugin that was not loaded). For a hook that
            takes arguments, the records are the implementations.
    """

    name: str
    module: str
    distribution: str | None = None
    version: str | None = None
    contributions: Mapping[str, tuple[Any, ...]] = attrs.field(
        factory=dict, converter=_read_only_records
    )

    @property
    def layer_types(self) -> tuple[LayerType[Any], ...]:
        """The attention types it provides (``kvcore_layer_types``)."""
        return self.contributions.get("kvcore_layer_types", ())

    @property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """The layer kinds it builds specs for (``kvcore_layer_kinds``)."""
        return self.contributions.get("kvcore_layer_kinds", ())

    @property
    def plan_options(self) -> tuple[PlanOption, ...]:
        """The plan options its layer-kind builders read (``kvcore_plan_options``)."""
        return self.contributions.get("kvcore_plan_options", ())

    def implements(self, hook: str) -> bool:
        """Whether the plugin implements ``hook``."""
        return bool(self.contributions.get(hook))

    def provides_module(self, module: str) -> bool:
        """Whether ``module`` lives inside this plugin's package."""
        package = self.module.split(":", 1)[0]
        return module == package or module.startswith(package + ".")


@attrs.frozen
class Claim:
    """One record a plugin claimed under a key (see :meth:`kvcore.Registry.claims`).

    Attributes:
        record: What the plugin's hook returned for the key.
        plugin: The plugin.
    """

    record: Any
    plugin: PluginInfo


@attrs.frozen
class HookCall:
    """One implementation of a hook that takes arguments, kept to be called later.

    Attributes:
        plugin: The plugin's name.
        function: The implementation.
        argnames: The arguments it takes (pluggy lets it take fewer than the
            hook offers).
    """

    plugin: str
    function: Callable[..., Any]
    argnames: tuple[str, ...] = ()


def _claims(
    collected: CollectedHook, results: Iterable[tuple[PluginInfo, tuple[Any, ...]]]
) -> dict[Hashable, Claim]:
    """Key → claim over every plugin's records of one hook; two claims of a key are refused."""
    keys_of = collected.keys
    assert keys_of is not None
    claims: dict[Hashable, Claim] = {}
    for plugin, records in results:
        for record in records:
            for key in keys_of(record):
                previous = claims.get(key)
                if previous is not None:
                    label = collected.describe_key(key)
                    if previous.plugin.name == plugin.name:
                        msg = (
                            f"plugin {plugin.name!r} claims {collected.what} {label} twice "
                            f"in its {collected.hook} hook; claim it once"
                        )
                        raise HookImplementationError(msg)
                    msg = (
                        f"{collected.what} {label} is claimed by plugin "
                        f"{previous.plugin.name!r} and by plugin {plugin.name!r} (both "
                        f"through {collected.hook}); disable one of the two plugins "
                        f"({how_to_disable(plugin.name)})"
                    )
                    raise PluginConflictError(msg)
                claims[key] = Claim(record, plugin)
    return claims


def _index(plugins: tuple[PluginInfo, ...]) -> dict[str, dict[Hashable, Claim]]:
    """Hook name → key → claim for the keyed hooks called at load."""
    return {
        collected.hook: _claims(
            collected,
            ((plugin, plugin.contributions.get(collected.hook, ())) for plugin in plugins),
        )
        for collected in COLLECTED_HOOKS
        if collected.keys is not None and collected.call_at_load
    }


@attrs.frozen
class Registry:
    """What the selected plugins provide, with provenance; immutable.

    Build it with :func:`kvcore.load_registry`. The engine resolves every
    group's manager class through :meth:`manager_class` once, when the KV cache
    manager is created; nothing here runs on the allocation path.

    Building it checks the plugin contract: every spec and manager class is
    checked (:func:`kvcore.testing.check_plugin` documents the rules), two
    plugins may not claim one spec class, layer kind or kind name, and a spec
    promoted to another type's spec class needs the plugin serving it.

    Attributes:
        plugins: The loaded plugins, by name.
        unselected: Installed plugins that the selection left out (not
            imported); used to say which plugin to enable for an unknown spec.
        hook_calls: For hooks that take arguments, their implementations in
            call order (``tryfirst`` first, ``trylast`` last).

    Raises:
        HookImplementationError: a class breaks the plugin contract.
        PluginConflictError: two plugins claim the same thing.
        UnknownSpecError: a spec is promoted to a spec class no selected
            plugin serves.
    """

    plugins: tuple[PluginInfo, ...]
    unselected: tuple[PluginInfo, ...] = ()
    hook_calls: Mapping[str, tuple[HookCall, ...]] = attrs.field(
        factory=dict, converter=_read_only_records
    )
    _claims: Mapping[str, Mapping[Hashable, Claim]] = attrs.field(init=False, repr=False)
    _by_spec: Mapping[type[KVCacheSpec], tuple[LayerType[Any], PluginInfo]] = attrs.field(
        init=False, repr=False
    )
    _formats: Mapping[str, DeclaredFormat] = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        index = _index(self.plugins)
        by_spec: dict[type[KVCacheSpec], tuple[LayerType[Any], PluginInfo]] = {}
        kinds: dict[str, tuple[type[KVCacheSpec], PluginInfo]] = {}
        for claim in index.get("kvcore_layer_types", {}).values():
            layer_type, plugin = claim.record, claim.plugin
            _check_layer_type(layer_type, plugin)
            kind = layer_type.spec.kind
            if kind in kinds:
                other, owner = kinds[kind]
                msg = (
                    f"kind {kind!r} is used by {qualname(other)} (plugin {owner.name!r}) and by "
                    f"{qualname(layer_type.spec)} (plugin {plugin.name!r}); give each spec "
                    "class its own kind"
                )
                raise PluginConflictError(msg)
            kinds[kind] = (layer_type.spec, plugin)
            by_spec[layer_type.spec] = (layer_type, plugin)
        object.__setattr__(self, "_by_spec", MappingProxyType(by_spec))
        formats = collect_kv_formats((spec, plugin.name) for spec, (_, plugin) in by_spec.items())
        object.__setattr__(self, "_formats", MappingProxyType(formats))
        object.__setattr__(
            self, "_claims", MappingProxyType({k: MappingProxyType(v) for k, v in index.items()})
        )
        for layer_type, plugin in by_spec.values():
            promoted_to = layer_type.spec.promoted_to
            if promoted_to is not None and promoted_to not in by_spec:
                msg = (
                    f"plugin {plugin.name!r} needs the plugin serving {qualname(promoted_to)}: "
                    f"{layer_type.spec.__name__}.promoted_to names it (its layers are allocated "
                    f"as {promoted_to.__name__} when planning keeps every token). "
                    f"{self._unknown_spec_message(promoted_to)}. Or leave {plugin.name!r} out "
                    f"too ({how_to_disable(plugin.name)})"
                )
                raise UnknownSpecError(msg)

    # -- generic access -------------------------------------------------------------

    def records(self, hook: str) -> tuple[Any, ...]:
        """Every record of ``hook``, over all plugins, in plugin order."""
        return tuple(r for plugin in self.plugins for r in plugin.contributions.get(hook, ()))

    def claims(self, hook: str) -> Mapping[Hashable, Claim]:
        """Key → claim for a hook whose records claim keys (spec classes, kind names, ...).

        Raises:
            KeyError: ``hook`` is not a collected hook with keys.
        """
        return self._claims[hook]

    def first_result(self, hook: str, **kwargs: Any) -> tuple[str, Any] | None:
        """Call ``hook``'s implementations in order; the first result not ``None`` wins.

        Every implementation is called through a wrapper: whatever it raises
        comes out as :class:`~kvcore.errors.HookImplementationError` naming
        the plugin and the hook (kvcore errors, such as a config field
        missing, pass through unchanged).

        Returns:
            The plugin's name and its result, or ``None`` if every
            implementation returned ``None``.
        """
        collected_hook(hook)  # a KeyError for a hook that is not collected
        for call in self.hook_calls.get(hook, ()):
            arguments = {name: kwargs[name] for name in call.argnames}
            result = call_plugin(
                call.plugin, f"its {hook} hook", call.function, arguments, pass_kvcore_errors=True
            )
            if result is not None:
                return call.plugin, result
        return None

    def gather(self, hook: str) -> Mapping[Hashable, Claim]:
        """Call every plugin's implementations of a hook kept for later; index their records.

        For hooks too expensive to call at load (one importing torch). Each
        result is checked as it would be at load, and two plugins claiming one
        key raise :class:`~kvcore.errors.PluginConflictError` naming both.
        Whatever an implementation raises comes out as
        :class:`~kvcore.errors.HookImplementationError` naming the plugin.

        Raises:
            KeyError: ``hook`` is not a collected hook with keys.
        """
        collected = collected_hook(hook)
        if collected.keys is None:
            raise KeyError(hook)
        by_plugin = {plugin.name: plugin for plugin in self.plugins}
        calls = self.hook_calls.get(hook, ())
        results = []
        for plugin in self.plugins:
            for call in calls:
                if call.plugin == plugin.name:
                    result = call_plugin(plugin.name, f"its {hook} hook", call.function)
                    results.append((by_plugin[call.plugin], collected.records(plugin.name, result)))
        return MappingProxyType(_claims(collected, results))

    # -- attention types ---------------------------------------------------------------

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
        head = f"no selected kvcore plugin serves {qualname(spec_type)}"
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

    # -- KV formats ---------------------------------------------------------------------

    @property
    def kv_formats(self) -> Mapping[str, KVFormat]:
        """Name → KV format, for every format a registered spec class declares.

        The names planning accepts as a KV cache dtype besides the plain
        dtypes (:meth:`cache_dtype`).
        """
        return MappingProxyType({name: d.kv_format for name, d in self._formats.items()})

    def spec_classes_storing(self, kv_format: KVFormat | str) -> tuple[type[KVCacheSpec], ...]:
        """The registered spec classes that declare ``kv_format`` (a format or its name)."""
        name = kv_format if isinstance(kv_format, str) else kv_format.name
        declared = self._formats.get(name)
        if declared is None or (
            isinstance(kv_format, KVFormat) and declared.kv_format != kv_format
        ):
            return ()
        return tuple(cls for cls, _ in declared.owners)

    def cache_dtype(self, value: object) -> str | KVFormat:
        """What ``value`` names as the KV cache dtype: a plain dtype or a declared KV format.

        Args:
            value: A plain dtype (``"bfloat16"``, ``"fp8"``, a ``torch.dtype``),
                the name of a format a selected plugin declares (``"nvfp4"``),
                or a :class:`~kvcore.specs.KVFormat`.

        Returns:
            The plain dtype's canonical name, or the format.

        Raises:
            InvalidConfigError: neither; the message lists the plain dtypes
                and every declared format with the classes storing it.
        """
        return resolve_cache_dtype(value, self._formats)

    # -- eviction policies ------------------------------------------------------------

    @property
    def eviction_policies(self) -> Mapping[str, Any]:
        """Policy name → factory, for the eviction policies plugins register.

        Each factory is wrapped: whatever it raises when a pool builds its
        policy comes out as :class:`~kvcore.errors.HookImplementationError`
        naming the plugin. The policies kvcore provides itself are not listed here
        (:func:`kvcore.available_eviction_policies` lists both).
        """
        claims = self.claims("kvcore_eviction_policies")
        return MappingProxyType(
            {
                str(name): PluginPolicyFactory(claim.plugin.name, str(name), claim.record[1])
                for name, claim in claims.items()
            }
        )

    # -- planning -----------------------------------------------------------------------

    @property
    def layer_kinds(self) -> Mapping[str, Claim]:
        """Layer kind name → claim (a :class:`~kvcore.planning.LayerKind` and its plugin).

        Only the kinds' own names; aliases resolve through :meth:`layer_kind`.
        """
        return MappingProxyType(
            {
                claim.record.name: claim
                for name, claim in self.claims("kvcore_layer_kinds").items()
                if claim.record.name == name
            }
        )

    def layer_kind(self, name: str) -> Claim | None:
        """The layer kind named ``name`` (or an alias of it) and its plugin, or ``None``."""
        return self.claims("kvcore_layer_kinds").get(name)

    @property
    def plan_options(self) -> Mapping[str, Claim]:
        """``"<plugin>.<option>"`` → claim (a :class:`~kvcore.planning.PlanOption`, its plugin)."""
        return MappingProxyType(
            {
                f"{plugin.name}.{option.name}": Claim(option, plugin)
                for plugin in self.plugins
                for option in plugin.plan_options
            }
        )

    def plan_option_values(self, options: Mapping[str, str] | None) -> dict[str, dict[str, str]]:
        """Every selected plugin's option values: ``options`` over the defaults.

        Args:
            options: ``"<plugin>.<option>"`` → value, as given by the user.

        Returns:
            Plugin name → option name → value, for every plugin declaring options.

        Raises:
            InvalidConfigError: an option no selected plugin declares (with the
                closest known name), or a value outside its choices.
        """
        declared = self.plan_options
        values = {
            plugin.name: {option.name: option.default for option in plugin.plan_options}
            for plugin in self.plugins
            if plugin.plan_options
        }
        for key, value in (options or {}).items():
            claim = declared.get(key)
            if claim is None:
                raise InvalidConfigError(self._unknown_option_message(key, declared))
            option: PlanOption = claim.record
            if not isinstance(value, str) or (
                option.choices is not None and value not in option.choices
            ):
                allowed = (
                    "a string"
                    if option.choices is None
                    else "one of " + ", ".join(map(repr, option.choices))
                )
                msg = f"plan option {key!r} must be {allowed}, got {value!r}"
                raise InvalidConfigError(msg)
            values[claim.plugin.name][option.name] = value
        return values

    def _unknown_option_message(self, key: str, declared: Mapping[str, Claim]) -> str:
        plugin = key.partition(".")[0]
        if any(p.name == plugin for p in self.unselected):
            return (
                f"plan option {key!r} belongs to plugin {plugin!r}, which is installed but "
                "not selected; select it or drop the option"
            )
        close = difflib.get_close_matches(key, list(declared), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(declared)) or "none"
        return (
            f"unknown plan option {key!r}: options are named '<plugin>.<option>' and no "
            f"selected plugin declares this one.{hint} Declared options: {known}"
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
    check_spec_class(plugin.name, spec)
    check_manager_class(plugin.name, manager)


def registry_from_layer_types(
    layer_types: Iterable[LayerType[Any]], *, name: str = "inline"
) -> Registry:
    """Build a registry from layer types directly, without loading any plugin.

    For tests and for engines that assemble their layer types themselves.
    The layer types are checked as a plugin's would be.
    """
    records = tuple(layer_types)
    for record in records:
        if not isinstance(record, LayerType):
            msg = f"registry_from_layer_types takes kvcore.LayerType records, got {record!r}"
            raise HookImplementationError(msg)
    info = PluginInfo(name=name, module=name, contributions={"kvcore_layer_types": records})
    return Registry((info,))
