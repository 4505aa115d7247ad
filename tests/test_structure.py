"""Project structure rules: import hygiene, layering, packaging."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import kvcore

REPO = Path(__file__).resolve().parents[1]
BUILTIN_PLUGINS = [
    "full_attention",
    "sliding_window",
    "chunked_local",
    "mamba",
    "cross_attention",
    "sink_full_attention",
    "mla",
    "hidden_state",
    "nvfp4_attention",
]
PUBLIC_CORE_MODULES = {
    "kvcore",
    "kvcore.specs",
    "kvcore.managers",
    "kvcore.hookspecs",
    "kvcore.errors",
    "kvcore.eviction",
    "kvcore.planning",
    "kvcore.registry",
    "kvcore.events",
    "kvcore.hashing",
    "kvcore.reference",
    "kvcore.testing",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_importing_kvcore_loads_no_plugin_torch_or_numpy():
    code = (
        "import sys, kvcore;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'numpy', 'matplotlib', 'kvcore_plugins', 'kvcore_compressed')];"
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_core_never_imports_a_plugin():
    for path in (REPO / "kvcore").rglob("*.py"):
        for module in imported_modules(path):
            assert not module.startswith("kvcore_plugins"), f"{path} imports {module}"


def test_plugins_use_only_the_public_api():
    paths = list((REPO / "plugins").rglob("*.py"))
    paths += list((REPO / "examples").rglob("*.py"))
    for path in paths:
        for module in imported_modules(path):
            if module == "kvcore" or module.startswith("kvcore."):
                assert module in PUBLIC_CORE_MODULES, f"{path} imports private {module}"


def declared_dependencies(plugin: str) -> set[str]:
    """The plugins serving the spec classes this plugin's specs are promoted to.

    ``promoted_to`` is the one way a plugin depends on another, and a registry
    without the dependency is refused when it is built.
    """
    registry = kvcore.load_registry(only=BUILTIN_PLUGINS)
    info = next(p for p in registry.plugins if p.name == plugin)
    return {
        registry.plugin_for(layer_type.spec.promoted_to).name
        for layer_type in info.layer_types
        if layer_type.spec.promoted_to is not None
    }


def test_plugins_depend_on_other_plugins_only_as_declared():
    """A plugin imports another only through its package, and only to name it in promoted_to."""
    found = {}
    for package in sorted((REPO / "plugins").iterdir()):
        if not (package / "__init__.py").exists():
            continue
        used = set()
        for path in package.rglob("*.py"):
            for module in imported_modules(path):
                parts = module.split(".")
                if parts[0] == "kvcore_plugins" and len(parts) > 1 and parts[1] != package.name:
                    assert len(parts) == 2, f"{path} imports {module}, not the plugin's package"
                    used.add(parts[1])
        assert used == declared_dependencies(package.name), package.name
        found[package.name] = used
    # Worked out by hand: the two local types are allocated as full attention.
    assert {k: v for k, v in found.items() if v} == {
        "sliding_window": {"full_attention"},
        "chunked_local": {"full_attention"},
    }


def test_every_package_is_listed_for_installation():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = set()
    for root, name in (("kvcore", "kvcore"), ("plugins", "kvcore_plugins")):
        for init in (REPO / root).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / root)
            on_disk.add(".".join((name, *relative.parts)))
    assert on_disk == listed


def test_every_plugin_package_has_its_own_entry_point():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    entry_points = project["entry-points"]["kvcore"]
    packages = sorted(p.name for p in (REPO / "plugins").iterdir() if (p / "__init__.py").exists())
    assert sorted(entry_points) == packages
    for name, target in entry_points.items():
        assert target == f"kvcore_plugins.{name}"
