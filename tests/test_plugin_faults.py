"""A faulty plugin is named, with the hook at fault and the way to leave it out.

Every hook is collected once, by the registry's one plugin manager; whatever a
hook (or a builder it returned) raises comes out as a HookImplementationError
naming the plugin and the hook, on every command, ``kvcore plugins`` included.
A hook returning nothing usable is an error, not zero types.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, ClassVar

import attrs
import pytest

import kvcore
from kvcore import _plugin_loader
from kvcore._cli.main import main
from kvcore.errors import HookImplementationError, InvalidConfigError, PluginError
from kvcore.managers import PrefixManager
from kvcore.specs import AttentionSpec, TokenLimits

HOW_TO_DISABLE = (
    "leave it out with --disable faulty (kvcore command), KVCORE_DISABLE_PLUGINS=faulty "
    "(environment) or disable=['faulty'] (kvcore.load_registry)"
)


@attrs.frozen(kw_only=True)
class FaultSpec(AttentionSpec):
    kind: ClassVar[str] = "fault"

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        return self.pages_for_tokens(limits.max_model_len) * self.page_size_bytes


class FaultManager(PrefixManager[FaultSpec]):
    pass


def types_hook() -> list[kvcore.LayerType[Any]]:
    return [kvcore.LayerType(FaultSpec, FaultManager)]


class EntryPoint:
    def __init__(self, name: str, plugin: object) -> None:
        self.name = name
        self.value = f"kvtest_{name}"
        self.dist = types.SimpleNamespace(name=f"kvcore-{name}", version="1.0")
        self._plugin = plugin

    def load(self) -> object:
        return self._plugin


@pytest.fixture
def installed(monkeypatch):
    """Install plugin objects (name → object) as if through entry points, besides full attention."""
    plugins: dict[str, object] = {}

    def entry_points() -> list[Any]:
        full = EntryPoint("full_attention", sys.modules["kvcore_plugins.full_attention"])
        full.value = "kvcore_plugins.full_attention"
        return [full, *(EntryPoint(name, plugin) for name, plugin in plugins.items())]

    import kvcore_plugins.full_attention  # noqa: F401  (the module the entry point loads)

    monkeypatch.setattr(_plugin_loader, "_installed_entry_points", entry_points)
    return plugins


def plugin(**hooks: Any) -> types.ModuleType:
    module = types.ModuleType("kvtest_faulty")
    for name, function in hooks.items():
        setattr(module, name, kvcore.hookimpl(function))
    return module


def boom() -> Any:
    msg = "boom"
    raise RuntimeError(msg)


# -- a hook raises -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "hook", ["kvcore_layer_types", "kvcore_layer_kinds", "kvcore_plan_options"]
)
def test_a_hook_raising_names_the_plugin_the_hook_and_how_to_disable_it(installed, hook):
    hooks: dict[str, Any] = {"kvcore_layer_types": types_hook, hook: boom}
    installed["faulty"] = plugin(**hooks)
    with pytest.raises(HookImplementationError) as info:
        kvcore.load_registry(environ={})
    assert isinstance(info.value, PluginError)
    assert str(info.value) == (
        f"kvcore plugin 'faulty' failed in its {hook} hook: RuntimeError: boom. Fix or uninstall "
        f"the plugin, or {HOW_TO_DISABLE}"
    )
    assert isinstance(info.value.__cause__, RuntimeError)
    assert [p.name for p in kvcore.load_registry(disable=["faulty"]).plugins] == ["full_attention"]


def test_a_kind_builder_raising_is_named_when_the_model_is_planned(installed, tmp_path):
    def kinds() -> list[kvcore.planning.LayerKind]:
        return [kvcore.planning.LayerKind("fault", lambda layer: 1 // 0)]

    installed["faulty"] = plugin(kvcore_layer_types=types_hook, kvcore_layer_kinds=kinds)
    registry = kvcore.load_registry(environ={})
    path = tmp_path / "config.json"
    config = {"num_hidden_layers": 1, "num_attention_heads": 2, "hidden_size": 8}
    path.write_text(json.dumps({**config, "layer_types": ["fault"], "max_position_embeddings": 64}))
    with pytest.raises(HookImplementationError) as info:
        kvcore.plan(path, registry=registry)
    assert str(info.value).startswith(
        "kvcore plugin 'faulty' failed in the builder of layer kind 'fault' (from its "
        "kvcore_layer_kinds hook): ZeroDivisionError: integer division or modulo by zero."
    )
    assert HOW_TO_DISABLE in str(info.value)


def test_a_model_layers_hook_raising_is_named(installed):
    def model_layers(model: kvcore.planning.ModelFields) -> Any:
        return boom()

    installed["faulty"] = plugin(kvcore_layer_types=types_hook, kvcore_model_layers=model_layers)
    registry = kvcore.load_registry(environ={})
    with pytest.raises(HookImplementationError, match="'faulty' failed in its kvcore_model_layers"):
        kvcore.planning.load_model_config("llama-3-8b", registry)


@pytest.mark.parametrize("command", [["plugins"], ["plan", "llama-3-8b"], ["simulate", "--help"]])
def test_every_command_reports_a_faulty_plugin_in_one_line(installed, capsys, command):
    installed["faulty"] = plugin(kvcore_layer_types=boom)
    if command == ["simulate", "--help"]:
        # argparse exits before plugins are loaded: nothing to report.
        with pytest.raises(SystemExit):
            main(command)
        return
    assert main(command) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("kvcore: error: kvcore plugin 'faulty' failed in its kvcore_layer_types")
    assert "--disable faulty (kvcore command), KVCORE_DISABLE_PLUGINS=faulty" in err
    assert main([*command, "--disable", "faulty"]) == 0


# -- a hook returns nothing usable -------------------------------------------------------


@pytest.mark.parametrize(
    ("hook", "returned", "message"),
    [
        (
            "kvcore_layer_types",
            None,
            "kvcore_layer_types must return a non-empty list of kvcore.LayerType, got None (a "
            "hook without a return statement returns None)",
        ),
        ("kvcore_layer_types", [], "must return a non-empty list of kvcore.LayerType, got []"),
        ("kvcore_layer_kinds", None, "kvcore_layer_kinds must return a non-empty list"),
        ("kvcore_layer_kinds", {}, "kvcore_layer_kinds must return a non-empty list"),
        ("kvcore_layer_kinds", {"fault": 3}, "a mapping of kind names to builders), got"),
        ("kvcore_plan_options", None, "kvcore_plan_options must return a non-empty list"),
    ],
)
def test_a_hook_returning_nothing_usable_is_an_error(installed, hook, returned, message):
    hooks: dict[str, Any] = {"kvcore_layer_types": types_hook, hook: lambda: returned}
    installed["faulty"] = plugin(**hooks)
    with pytest.raises(HookImplementationError) as info:
        kvcore.load_registry(environ={})
    assert str(info.value).startswith("plugin 'faulty': ")
    assert message in str(info.value)


def test_a_hook_function_without_hookimpl_is_an_error(installed):
    module = types.ModuleType("kvtest_faulty")
    # A fresh function: hookimpl marks the function object itself.
    module.kvcore_layer_types = lambda: types_hook()  # type: ignore[attr-defined]
    module.kvcore_layer_kinds = kvcore.hookimpl(lambda: {"fault": FaultSpec})  # type: ignore[attr-defined]
    installed["faulty"] = module
    with pytest.raises(HookImplementationError) as info:
        kvcore.load_registry(environ={})
    assert str(info.value) == (
        "plugin 'faulty' (kvtest_faulty) defines kvcore_layer_types without @kvcore.hookimpl, "
        "so kvcore would never call it; decorate it"
    )


def test_a_plugin_implementing_no_hook_is_an_error(installed):
    module = types.ModuleType("kvtest_faulty")
    module.kvcore_layer_typs = lambda: types_hook()  # type: ignore[attr-defined]
    installed["faulty"] = module
    with pytest.raises(HookImplementationError, match=r"'faulty' \(kvtest_faulty\) implements no"):
        kvcore.load_registry(environ={})


# -- plugin objects ----------------------------------------------------------------------


def test_a_namespace_object_is_a_plugin():
    """Formerly ``TypeError: unhashable type`` inside pluggy."""
    namespace = types.SimpleNamespace(kvcore_layer_types=kvcore.hookimpl(types_hook))
    registry = kvcore.load_registry(only=["ns"], plugins={"ns": namespace})
    assert registry.manager_class(FaultSpec) is FaultManager


def test_plugins_must_be_given_by_name():
    with pytest.raises(InvalidConfigError, match=r"plugins= takes a mapping of plugin names"):
        kvcore.load_registry(plugins=[types.SimpleNamespace()])  # type: ignore[arg-type]


def test_every_hook_is_called_once_when_the_registry_is_built(tmp_path):
    """One plugin manager: planning reuses what the registry collected (formerly a second one)."""
    calls: dict[str, int] = {"types": 0, "kinds": 0, "layers": 0}

    def layer_types() -> list[kvcore.LayerType[Any]]:
        calls["types"] += 1
        return types_hook()

    def layer_kinds() -> list[kvcore.planning.LayerKind]:
        calls["kinds"] += 1
        return [
            kvcore.planning.LayerKind(
                "fault",
                lambda layer: FaultSpec(
                    block_size=layer.block_size, num_kv_heads=1, head_size=4, dtype=layer.dtype
                ),
            )
        ]

    def model_layers(model: kvcore.planning.ModelFields) -> Any:
        calls["layers"] += 1
        return model.decoder_layers(["fault"] * model.num_hidden_layers)

    # An object that is not an importable module (formerly: "Kinds recognized: none").
    namespace = types.SimpleNamespace(
        kvcore_layer_types=kvcore.hookimpl(layer_types),
        kvcore_layer_kinds=kvcore.hookimpl(layer_kinds),
        kvcore_model_layers=kvcore.hookimpl(model_layers),
    )
    registry = kvcore.load_registry(only=["inline"], plugins={"inline": namespace})
    assert calls == {"types": 1, "kinds": 1, "layers": 0}
    assert [kind.name for kind in registry.plugins[0].layer_kinds] == ["fault"]
    for _ in range(2):
        p = kvcore.plan("llama-3-8b", memory="1GiB", registry=registry)
        assert [(g.kind, g.num_layers) for g in p.groups] == [("fault", 32)]
    assert calls == {"types": 1, "kinds": 1, "layers": 2}


def test_kvcore_plugins_lists_kinds_recognition_and_options(capsys):
    assert main(["plugins", "--json", "--only", "mamba,mla,sliding_window,full_attention"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["mamba"]["layer_kinds"] == [
        {"name": "mamba", "aliases": [], "deprecated_aliases": []},
        {"name": "mamba2", "aliases": [], "deprecated_aliases": []},
        {"name": "linear_attention", "aliases": [], "deprecated_aliases": []},
    ]
    assert rows["mamba"]["plan_options"] == [
        {
            "name": "mamba.cache_mode",
            "default": "align",
            "choices": ["align", "none"],
            "help": "align: states cached at block boundaries (prefix caching); none: one "
            "state per request, never cached",
        },
        {
            "name": "mamba.prefill_states",
            "default": "every",
            "choices": ["every", "selective"],
            "help": "every: a prefill keeps the state at every block boundary it crosses; "
            "selective: inside the prompt only at its last boundary and where an earlier "
            "prompt diverged (align mode)",
        },
    ]
    assert rows["sliding_window"]["layer_kinds"][0]["aliases"] == ["sliding_attention"]
    assert rows["mla"]["layer_kinds"][0]["deprecated_aliases"] == ["mla_attention"]
    assert rows["sink_full_attention"]["loaded"] is False
    assert rows["sink_full_attention"]["layer_kinds"] == []
    recognizers = {name for name, row in rows.items() if row["recognizes_model_configs"]}
    assert recognizers == {"mamba", "mla", "sliding_window", "full_attention"}
    assert main(["plugins", "--only", "mamba"]) == 0
    out = capsys.readouterr().out
    assert "    layer kinds: mamba, mamba2, linear_attention\n" in out
    assert "    option mamba.cache_mode=align|none (default align)\n" in out
    assert "    option mamba.prefill_states=every|selective (default every)\n" in out
