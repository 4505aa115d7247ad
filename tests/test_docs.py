"""The documentation stays true: every hook documented, examples run as shown."""

from __future__ import annotations

import re
from pathlib import Path

from kvcore import hookspecs

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def test_every_hook_is_documented():
    page = (DOCS / "reference" / "hooks.rst").read_text()
    documented = set(re.findall(r"autofunction:: kvcore\.hookspecs\.(kvcore_\w+)", page))
    declared = {name for name in dir(hookspecs) if name.startswith("kvcore_")}
    assert declared == documented
    for name in declared:
        assert getattr(hookspecs, name).__doc__, f"{name} has no docstring"


def test_every_environment_variable_is_documented():
    text = "\n".join(p.read_text() for p in DOCS.rglob("*.rst"))
    source = "\n".join(p.read_text() for p in (REPO / "kvcore").rglob("*.py"))
    variables = set(re.findall(r'"(KVCORE_[A-Z_]+)"', source))
    assert {"KVCORE_PLUGINS", "KVCORE_DISABLE_PLUGINS"} <= variables
    for variable in variables:
        assert variable in text, f"{variable} is not documented"


def test_plugin_page_shows_the_example_plugin_files():
    page = (DOCS / "how-to" / "write-a-plugin.rst").read_text()
    for included in re.findall(r"literalinclude:: (\S+)", page):
        assert (DOCS / "how-to" / included).resolve().is_file(), included


def test_every_error_class_is_on_the_errors_page():
    import importlib
    import pkgutil

    import kvcore
    from kvcore.errors import KVCoreError

    for module in pkgutil.walk_packages(kvcore.__path__, "kvcore."):
        if not module.name.endswith("__main__"):
            try:
                importlib.import_module(module.name)
            except ModuleNotFoundError as exc:
                # An integration's modules import their engine, which may be
                # absent; its errors are defined where the engine is not needed.
                if not (module.name.startswith("kvcore.integrations.") and exc.name == "vllm"):
                    raise
    classes, stack = set(), [KVCoreError]
    while stack:
        cls = stack.pop()
        if cls.__module__.startswith("kvcore"):
            classes.add(cls.__name__)
        stack.extend(cls.__subclasses__())
    page = (DOCS / "reference" / "errors.rst").read_text()
    row = r"\* - (?::class:`~kvcore\.(?:errors|reference|cluster)\.|``)(\w+)"
    rows = set(re.findall(row, page))
    assert classes <= rows, classes - rows
