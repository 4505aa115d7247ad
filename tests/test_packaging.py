"""The release metadata: one version, the licence, the changelog page.

The built wheel itself is checked by ``.ci/wheel_smoke.py``, which ``.ci/run``
runs from a fresh environment outside the tree.
"""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path

import pytest

import kvcore
from kvcore._cli.main import main

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def changelog_tool():
    sys.path.insert(0, str(REPO / "docs" / "_ext"))
    try:
        import kvcore_changelog
    finally:
        sys.path.pop(0)
    return kvcore_changelog


def test_the_version_is_written_once_and_read_by_the_build():
    project = PYPROJECT["project"]
    assert "version" not in project
    assert project["dynamic"] == ["version"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "kvcore.__version__"
    # setuptools reads it without importing kvcore: a literal assignment.
    source = (REPO / "kvcore" / "__init__.py").read_text()
    assert f'__version__ = "{kvcore.__version__}"' in source


def test_the_installed_metadata_and_the_cli_agree(capsys: pytest.CaptureFixture[str]):
    assert importlib.metadata.version("kvcore") == kvcore.__version__
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"kvcore {kvcore.__version__} ({kvcore.backend()} backend)\n"


def test_the_licence_is_the_apache_2_text():
    text = (REPO / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.splitlines()) == 202


def test_the_changelog_renders_code_emphasis_and_escapes_the_rest():
    tool = changelog_tool()
    assert tool.inline("a `x_y`s, *em* (`p`) q_ r|s") == r"a ``x_y``\ s, *em* (``p``) q\_ r\|s"
    rst = tool.to_rst("# Changelog\n\nintro\n\n## 1.0\n\n### Added\n\n- one\n  two\n- three\n")
    assert rst == ["", "1.0", "===", "", "", "Added", "-----", "", "- one two", "", "- three", ""]


@pytest.mark.parametrize("line", ["- see [the docs](x)", "- **bold**", "| a | b |", "#### h4"])
def test_the_changelog_refuses_markdown_it_does_not_render(line: str):
    tool = changelog_tool()
    with pytest.raises(tool.ChangelogError, match=r"CHANGELOG\.md:3"):
        tool.to_rst(f"## 1.0\n\n{line}\n")


def test_markdown_markup_inside_a_code_span_is_code():
    tool = changelog_tool()
    rst = tool.to_rst("## 1.0\n\n- `group_idx=10**7` and `f(x)](y)` cost\n")
    assert rst[-2] == r"- ``group_idx=10**7`` and ``f(x)](y)`` cost"
    with pytest.raises(tool.ChangelogError, match=r"CHANGELOG\.md:3"):
        tool.to_rst("## 1.0\n\n- `code` then **bold**\n")


def test_the_changelog_has_an_unreleased_section_first():
    text = (REPO / "CHANGELOG.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Unreleased"
