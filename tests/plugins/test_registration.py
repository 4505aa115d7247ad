"""Each attention type is its own plugin: listed, selectable and disabled on its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from kvplugin_helpers import (
    BUILTIN_PLUGINS,
    chunked,
    cross,
    full,
    hidden,
    mamba,
    mla,
    nvfp4,
    sink,
    sw,
)

import kvcore
from kvcore.errors import UnknownSpecError

SPEC_OF = {
    "full_attention": ("FullAttentionSpec", "FullAttentionManager", lambda: full(16)),
    "sliding_window": ("SlidingWindowSpec", "SlidingWindowManager", lambda: sw(32)),
    "chunked_local": (
        "ChunkedLocalAttentionSpec",
        "ChunkedLocalAttentionManager",
        lambda: chunked(64),
    ),
    "mamba": ("MambaSpec", "MambaManager", lambda: mamba(16)),
    "cross_attention": ("CrossAttentionSpec", "CrossAttentionManager", lambda: cross(16)),
    "sink_full_attention": (
        "SinkFullAttentionSpec",
        "SinkFullAttentionManager",
        lambda: sink(16, 16),
    ),
    "mla": ("MLAAttentionSpec", "MLAAttentionManager", lambda: mla(16)),
    "hidden_state": ("HiddenStateCacheSpec", "HiddenStateCacheManager", lambda: hidden(16)),
    "nvfp4_attention": ("NVFP4AttentionSpec", "NVFP4AttentionManager", lambda: nvfp4(16)),
}


def test_kvcore_plugins_lists_all_nine_types_from_their_own_entry_points():
    out = subprocess.run(
        [sys.executable, "-m", "kvcore._cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = {row["name"]: row for row in json.loads(out)}
    for name in BUILTIN_PLUGINS:
        spec, manager, _ = SPEC_OF[name]
        row = rows[name]
        assert row["loaded"] is True
        assert row["distribution"] == "kvcore"
        assert row["module"] == f"kvcore_plugins.{name}"
        (layer_type,) = row["layer_types"]
        assert layer_type["spec"] == f"kvcore_plugins.{name}.spec.{spec}"
        assert layer_type["manager"] == f"kvcore_plugins.{name}.manager.{manager}"


# Plugins whose spec names another plugin's spec class in promoted_to.
DEPENDENTS = {"full_attention": {"sliding_window", "chunked_local"}}


@pytest.mark.parametrize("name", BUILTIN_PLUGINS)
def test_each_type_can_be_disabled_on_its_own(name):
    """Disabling one plugin (and the plugins needing it) leaves the others; its groups fail."""
    dependents = DEPENDENTS.get(name, set())
    registry = kvcore.load_registry(disable=[name, *sorted(dependents)])
    loaded = {p.name for p in registry.plugins}
    assert name not in loaded
    assert set(BUILTIN_PLUGINS) - {name} - dependents <= loaded
    spec_name, _, make_spec = SPEC_OF[name]
    for other in set(BUILTIN_PLUGINS) - {name} - dependents:
        assert SPEC_OF[other][2]().__class__ in registry
    config = kvcore.KVCacheConfig.from_specs(20, [make_spec()])
    with pytest.raises(
        UnknownSpecError,
        match=rf"serves kvcore_plugins\.{name}\.spec\.{spec_name}: it belongs to plugin "
        rf"'{name}', which is installed but not selected; enable it",
    ):
        kvcore.KVCacheManager(config, 1024, registry=registry, enable_caching=False)


def test_disabled_through_the_environment():
    registry = kvcore.load_registry(environ={"KVCORE_DISABLE_PLUGINS": "mamba"})
    assert "mamba" not in {p.name for p in registry.plugins}
    with pytest.raises(UnknownSpecError, match="plugin 'mamba'"):
        registry.manager_class(mamba(16))


def test_a_plugin_needing_a_disabled_one_is_refused_naming_both():
    """sliding_window promotes its layers to FullAttentionSpec: full_attention is a dependency."""
    with pytest.raises(UnknownSpecError) as info:
        kvcore.load_registry(only=["sliding_window"])
    message = str(info.value)
    assert "plugin 'sliding_window' needs the plugin serving " in message
    assert "kvcore_plugins.full_attention.spec.FullAttentionSpec" in message
    assert "SlidingWindowSpec.promoted_to names it" in message
    assert "it belongs to plugin 'full_attention', which is installed but not selected" in message
    assert "Or leave 'sliding_window' out too (--disable sliding_window" in message
    registry = kvcore.load_registry(only=["sliding_window", "full_attention"])
    assert {p.name for p in registry.plugins} == {"sliding_window", "full_attention"}
