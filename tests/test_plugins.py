"""Plugin discovery, selection and the errors that name the plugin at fault."""

from __future__ import annotations

import pickle
import sys
import types
from typing import Any

import attrs
import pytest

import kvcore
from kvcore import _plugin_loader
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    PluginConflictError,
    PluginLoadError,
    PluginNotFoundError,
    UnknownSpecError,
)
from kvcore.managers import PrefixManager
from kvcore.specs import AttentionSpec, TokenLimits
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec


def full_spec() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=1, dtype="float32")


@attrs.frozen(kw_only=True)
class ToySpec(AttentionSpec):
    kind = "toy"

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes


class ToyManager(PrefixManager[ToySpec]):
    pass


def plugin_module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def toy_plugin(name: str = "toy_plugin") -> types.ModuleType:
    @kvcore.hookimpl
    def kvcore_layer_types():
        return [kvcore.LayerType(ToySpec, ToyManager)]

    return plugin_module(name, kvcore_layer_types=kvcore_layer_types)


class FakeEntryPoint:
    """What the loader reads from importlib.metadata entry points."""

    def __init__(self, name: str, value: str, dist: str | None = "kvcore-fake", load=None):
        self.name = name
        self.value = value
        self.dist = types.SimpleNamespace(name=dist, version="1.0") if dist else None
        self._load = load

    def load(self) -> object:
        if self._load is not None:
            return self._load()
        return sys.modules[self.value]


@pytest.fixture
def entry_points(monkeypatch):
    """Replace the installed entry points by the ones a test declares."""
    declared: list[FakeEntryPoint] = []
    monkeypatch.setattr(_plugin_loader, "_installed_entry_points", lambda: list(declared))
    return declared


def full_entry_point() -> FakeEntryPoint:
    return FakeEntryPoint("full_attention", "kvcore_plugins.full_attention", dist="kvcore")


def test_installed_plugins_are_discovered_through_entry_points():
    registry = kvcore.load_registry(environ={})
    names = [p.name for p in registry.plugins]
    assert "full_attention" in names
    full = registry.plugin_for(FullAttentionSpec)
    assert (full.distribution, full.module) == ("kvcore", "kvcore_plugins.full_attention")
    assert registry.manager_class(full_spec()) is FullAttentionManager


def test_only_and_disable_select_plugins(entry_points, monkeypatch):
    entry_points += [full_entry_point(), FakeEntryPoint("toy", "toy_plugin")]
    monkeypatch.setitem(sys.modules, "toy_plugin", toy_plugin())
    only = kvcore.load_registry(only=["toy"])
    assert [p.name for p in only.plugins] == ["toy"]
    assert [p.name for p in only.unselected] == ["full_attention"]
    assert FullAttentionSpec not in only
    disabled = kvcore.load_registry(disable=["toy"])
    assert [p.name for p in disabled.plugins] == ["full_attention"]
    everything = kvcore.load_registry(environ={})
    assert {p.name for p in everything.plugins} == {"full_attention", "toy"}
    assert everything.manager_class(ToySpec) is ToyManager


def test_environment_variables_select_when_no_argument_is_given(entry_points, monkeypatch):
    entry_points += [full_entry_point(), FakeEntryPoint("toy", "toy_plugin")]
    monkeypatch.setitem(sys.modules, "toy_plugin", toy_plugin())
    env = {"KVCORE_PLUGINS": "toy"}
    assert [p.name for p in kvcore.load_registry(environ=env).plugins] == ["toy"]
    env = {"KVCORE_DISABLE_PLUGINS": " toy , "}
    assert [p.name for p in kvcore.load_registry(environ=env).plugins] == ["full_attention"]
    # An explicit argument ignores the environment.
    names = [p.name for p in kvcore.load_registry(disable=[], environ=env).plugins]
    assert names == ["full_attention", "toy"]


def test_selection_is_a_picklable_value():
    selection = kvcore.registry.PluginSelection.from_env(
        {"KVCORE_PLUGINS": "a,b", "KVCORE_DISABLE_PLUGINS": "c"}
    )
    assert selection == kvcore.registry.PluginSelection(only={"a", "b"}, disable="c")
    assert pickle.loads(pickle.dumps(selection)) == selection
    assert kvcore.registry.PluginSelection.from_env({"KVCORE_PLUGINS": " "}).only is None


def test_unknown_names_are_errors_with_a_suggestion(entry_points):
    entry_points.append(full_entry_point())
    with pytest.raises(PluginNotFoundError) as info:
        kvcore.load_registry(only=["full_atention"])
    message = str(info.value)
    assert "not installed: 'full_atention'" in message
    assert "Installed plugins: full_attention." in message
    assert "Did you mean 'full_attention'" in message
    with pytest.raises(PluginNotFoundError, match="named in disable="):
        kvcore.load_registry(disable=["nope"])


def test_a_name_both_selected_and_disabled_is_an_error(entry_points):
    entry_points.append(full_entry_point())
    with pytest.raises(InvalidConfigError, match="full_attention are both selected and disabled"):
        kvcore.load_registry(only=["full_attention"], disable=["full_attention"])


def test_a_plugin_that_fails_to_import_is_named(entry_points):
    def broken() -> object:
        raise ModuleNotFoundError("No module named 'triton'")

    entry_points += [full_entry_point(), FakeEntryPoint("broken", "kvcore_broken", load=broken)]
    with pytest.raises(PluginLoadError) as info:
        kvcore.load_registry(environ={})
    message = str(info.value)
    assert "kvcore plugin 'broken' (kvcore_broken, distribution kvcore-fake 1.0)" in message
    assert "ModuleNotFoundError: No module named 'triton'" in message
    assert (
        "--disable broken (kvcore command), KVCORE_DISABLE_PLUGINS=broken (environment) or "
        "disable=['broken'] (kvcore.load_registry)" in message
    )
    assert isinstance(info.value.__cause__, ModuleNotFoundError)
    # Left out, it is never imported.
    assert [p.name for p in kvcore.load_registry(disable=["broken"]).plugins] == ["full_attention"]


def test_two_plugins_claiming_one_spec_are_named(entry_points, monkeypatch):
    monkeypatch.setitem(sys.modules, "toy_plugin", toy_plugin())
    monkeypatch.setitem(sys.modules, "toy_again", toy_plugin("toy_again"))
    entry_points += [FakeEntryPoint("toy", "toy_plugin"), FakeEntryPoint("toy2", "toy_again")]
    with pytest.raises(PluginConflictError) as info:
        kvcore.load_registry(environ={})
    message = str(info.value)
    assert "test_plugins.ToySpec is claimed by plugin 'toy'" in message
    assert "and by plugin 'toy2'" in message
    assert "disable one of the two plugins" in message


def test_two_distributions_with_one_plugin_name(entry_points):
    entry_points += [
        FakeEntryPoint("toy", "toy_plugin", dist="kvcore-toy"),
        FakeEntryPoint("toy", "other_toy", dist="kvcore-other"),
    ]
    with pytest.raises(PluginConflictError, match=r"kvcore-toy .*kvcore-other .*uninstall one"):
        kvcore.load_registry(environ={})


def test_a_misspelt_hook_is_an_error(entry_points, monkeypatch):
    @kvcore.hookimpl
    def kvcore_layer_typs():
        return []

    monkeypatch.setitem(
        sys.modules,
        "typo_plugin",
        plugin_module("typo_plugin", kvcore_layer_typs=kvcore_layer_typs),
    )
    entry_points.append(FakeEntryPoint("typo", "typo_plugin"))
    with pytest.raises(HookImplementationError) as info:
        kvcore.load_registry(environ={})
    message = str(info.value)
    assert "plugin 'typo' implements kvcore_layer_typs, which is not a kvcore hook" in message
    assert "Did you mean kvcore_layer_types?" in message


def test_a_hook_with_a_wrong_signature_is_an_error(entry_points, monkeypatch):
    @kvcore.hookimpl
    def kvcore_layer_types(config):
        return []

    monkeypatch.setitem(
        sys.modules,
        "sig_plugin",
        plugin_module("sig_plugin", kvcore_layer_types=kvcore_layer_types),
    )
    entry_points.append(FakeEntryPoint("sig", "sig_plugin"))
    with pytest.raises(HookImplementationError, match=r"plugin 'sig' .* has an invalid hook"):
        kvcore.load_registry(environ={})


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (kvcore.LayerType(ToySpec, ToyManager), "must return a non-empty list of kvcore.LayerType"),
        ([(ToySpec, ToyManager)], "must return kvcore.LayerType records"),
        ([kvcore.LayerType(int, ToyManager)], "LayerType.spec must be a subclass"),
        ([kvcore.LayerType(ToySpec, object)], "LayerType.manager for ToySpec must be"),
    ],
)
def test_bad_hook_results_are_errors(entry_points, returned, message, monkeypatch):
    @kvcore.hookimpl
    def kvcore_layer_types():
        return returned

    monkeypatch.setitem(
        sys.modules,
        "bad_plugin",
        plugin_module("bad_plugin", kvcore_layer_types=kvcore_layer_types),
    )
    entry_points.append(FakeEntryPoint("bad", "bad_plugin"))
    with pytest.raises(HookImplementationError, match=f"plugin 'bad'.*{message}"):
        kvcore.load_registry(environ={})


def test_a_disabled_plugin_is_named_when_its_spec_is_used(entry_points, monkeypatch):
    entry_points += [full_entry_point(), FakeEntryPoint("toy", "toy_plugin")]
    monkeypatch.setitem(sys.modules, "toy_plugin", toy_plugin())
    registry = kvcore.load_registry(disable=["full_attention"])
    config = kvcore.KVCacheConfig.from_specs(10, [full_spec()])
    with pytest.raises(UnknownSpecError) as info:
        kvcore.KVCacheManager(config, 1024, registry=registry)
    message = str(info.value)
    assert (
        "no selected kvcore plugin serves kvcore_plugins.full_attention.spec.FullAttentionSpec"
        in (message)
    )
    assert "belongs to plugin 'full_attention', which is installed but not selected" in message
    assert "Loaded layer types: ToySpec" in message


def test_a_spec_no_installed_plugin_declares(entry_points):
    entry_points.append(full_entry_point())
    registry = kvcore.load_registry(environ={})
    toy = ToySpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    with pytest.raises(UnknownSpecError, match="no installed plugin declares it"):
        registry.manager_class(toy)


def test_lookups_use_the_exact_spec_class(entry_points):
    @attrs.frozen(kw_only=True)
    class SubclassedSpec(FullAttentionSpec):
        pass

    entry_points.append(full_entry_point())
    registry = kvcore.load_registry(environ={})
    spec = SubclassedSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    with pytest.raises(UnknownSpecError, match="SubclassedSpec"):
        registry.manager_class(spec)


def test_plugins_can_be_passed_in_directly(entry_points):
    entry_points.append(full_entry_point())
    registry = kvcore.load_registry(plugins={"toy": toy_plugin()}, environ={})
    assert registry.manager_class(ToySpec) is ToyManager
    assert registry.plugin_for(ToySpec).distribution is None
    with pytest.raises(PluginConflictError, match="'full_attention' is passed in plugins="):
        kvcore.load_registry(plugins={"full_attention": toy_plugin()}, environ={})


def test_registry_from_layer_types_needs_no_plugin():
    registry = kvcore.registry.registry_from_layer_types([kvcore.LayerType(ToySpec, ToyManager)])
    assert registry.manager_class(ToySpec) is ToyManager
    assert registry.layer_types == (kvcore.LayerType(ToySpec, ToyManager),)
