"""The built HTML: warning-free, every public name once, no duplicates, no private paths."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from docbuild import DOCS, BuiltDocs, import_tool

import kvcore

checks = import_tool("check_built_docs")


def soup(html: str) -> BeautifulSoup:
    return BeautifulSoup(f"<html><body><article>{html}</article></body></html>", "html.parser")


def page(built_docs: BuiltDocs, name: str) -> BeautifulSoup:
    return BeautifulSoup((built_docs.html / name).read_text(), "html.parser")


def test_the_build_is_warning_free(built_docs: BuiltDocs):
    assert built_docs.warnings == ""


def test_the_built_docs_pass_every_check(built_docs: BuiltDocs):
    assert checks.check(built_docs.html) == []


def test_every_public_name_is_described_exactly_once(built_docs: BuiltDocs):
    ids = checks.described_ids(checks.pages(built_docs.html))
    names = checks.public_names()
    assert len(names) > 80
    for full in names:
        assert ids[full] == 1, full
    # LayerType is exported by kvcore and kvcore.registry: described once, linked from the other.
    assert ids["kvcore.LayerType"] == 1
    assert ids["kvcore.registry.LayerType"] == 0
    registry = page(built_docs, "reference/api/registry.html")
    assert registry.select_one('a[href$="kvcore.html#kvcore.LayerType"]') is not None


def test_constants_show_their_comment_not_their_type_docstring(built_docs: BuiltDocs):
    def doc(object_id: str) -> str:
        module = object_id.rpartition(".")[0]
        api = page(built_docs, f"reference/api/{module.removeprefix('kvcore.')}.html")
        return api.find("dt", id=object_id).find_next_sibling("dd").get_text(" ", strip=True)

    assert doc("kvcore.hashing.HASH_ALGORITHMS").startswith("The names accepted by")
    assert doc("kvcore.registry.ENTRY_POINT_GROUP").startswith(
        "Entry-point group every kvcore plugin"
    )
    assert doc("kvcore.managers.NULL_BLOCK") == "Id of the null block."
    for object_id in ("kvcore.hashing.HASH_ALGORITHMS", "kvcore.registry.ENV_PLUGINS"):
        assert "immutable" not in doc(object_id)
        assert "str(object" not in doc(object_id)


def test_attrs_fields_are_listed_once(built_docs: BuiltDocs):
    api = page(built_docs, "reference/api/kvcore.html")
    config = api.find("dt", id="kvcore.KVCacheConfig").find_next_sibling("dd")
    fields = config.find("dl", class_="field-list")
    headings = [dt.get_text(strip=True).rstrip(":") for dt in fields.find_all("dt")]
    assert headings == ["Variables"]
    text = fields.get_text(" ", strip=True)
    assert text.count("num_blocks ( int )") == 1
    assert "KVCacheGroupSpec" in text
    assert "kvcore._config" not in text


def test_the_checks_catch_what_the_build_lets_through():
    twice = soup(
        "<section><h1>CLI</h1>"
        "<section><h2>kvcore plan</h2></section><section><h2>kvcore plan</h2></section>"
        "<section><h2>kvcore simulate</h2><section><h3>Example</h3></section></section>"
        "<section><h2>kvcore workload</h2><section><h3>Example</h3></section></section>"
        "</section>"
    )
    assert checks.duplicated_titles("cli", twice) == [
        "cli: section 'kvcore plan' appears 2 times under 'CLI'"
    ]
    options = soup(
        '<dl class="std option"><dt id="cmdoption-kvcore-plan-memory">--memory</dt></dl>'
        '<dl class="std option"><dt id="cmdoption-kvcore-plan-0">--memory</dt></dl>'
    )
    assert len(checks.duplicated_options("cli", options)) == 1
    paragraph = "<p>" + " ".join(["every hook runs while a registry is built"] * 2) + "</p>"
    assert len(checks.duplicated_paragraphs("hooks", soup(paragraph * 2))) == 1
    assert checks.duplicated_paragraphs("hooks", soup("<p>See also.</p>" * 2)) == []
    leak = soup(
        '<dl class="py class"><dt id="kvcore.X">X(*, a=NOTHING)</dt><dd>'
        '<dl class="field-list"><dt>Variables</dt><dd>b (kvcore._config.Y)</dd></dl></dd></dl>'
    )
    assert checks.private_paths("api", leak) == [
        "api: attrs' NOTHING in the signature of 'kvcore.X'",
        "api: private path 'kvcore._config' in 'kvcore.X'",
    ]


def test_a_name_added_to_all_appears_without_editing_the_docs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from sphinx.application import Sphinx

    def brand_new_helper() -> int:
        """A helper nobody documented by hand."""
        return 1

    brand_new_helper.__module__ = "kvcore._somewhere_private"
    monkeypatch.setattr(kvcore, "brand_new_helper", brand_new_helper, raising=False)
    monkeypatch.setattr(kvcore, "__all__", [*kvcore.__all__, "brand_new_helper"])
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(DOCS / '_ext')!r})\n"
        "extensions = ['sphinx.ext.autodoc', 'sphinx.ext.napoleon', 'kvcore_api']\n"
    )
    (src / "index.rst").write_text(
        textwrap.dedent(
            """
            kvcore
            ======

            .. py:module:: kvcore

            Manager
            -------

            .. kvcore-api:: kvcore
               :names: KVCacheManager

            .. kvcore-api:: kvcore
               :section: More
            """
        )
    )
    import io
    import warnings

    warned = io.StringIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        app = Sphinx(
            src,
            src,
            tmp_path / "out",
            tmp_path / "doctrees",
            "html",
            status=None,
            warning=warned,
            freshenv=True,
        )
        app.build()
    # This mini project has a page for kvcore only: every other public module is reported.
    assert "public module kvcore.specs has no API page" in warned.getvalue()
    html = BeautifulSoup((tmp_path / "out" / "index.html").read_text(), "html.parser")
    more = html.find("section", id="more")
    assert more is not None
    assert more.find("h2").get_text(strip=True).startswith("More")
    assert more.find("dt", id="kvcore.brand_new_helper") is not None
    assert html.find("section", id="manager").find("dt", id="kvcore.brand_new_helper") is None


def test_every_page_names_the_version_and_the_changelog_is_a_page(built_docs: BuiltDocs):
    for name in ("index.html", "getting-started.html", "changelog.html"):
        title = page(built_docs, name).title.get_text()
        assert f"kvcore {kvcore.__version__}" in title, (name, title)
    changelog = page(built_docs, "changelog.html").find("article")
    assert changelog.find("h2").get_text().strip("¶ ") == "Unreleased"
    assert changelog.select_one("code.literal") is not None
