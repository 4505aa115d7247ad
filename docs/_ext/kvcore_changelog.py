"""The ``kvcore-changelog`` directive: CHANGELOG.md rendered as a docs page.

The changelog is kept once, as Markdown at the repository root (where
readers of the source and package indexes look for it). This directive
reads the subset of Markdown it uses and renders it as reStructuredText:

* ``## Version`` and ``### Kind`` headings become sections (the file's own
  ``# Changelog`` title and the paragraph under it are left to the page);
* ``- `` items, their continuation lines indented by two spaces, become a
  bullet list; other lines are paragraphs;
* ```code``` spans become literals and ``*words*`` emphasis; every other
  character is escaped, so nothing in the prose is read as markup.

Anything else (links, tables, nested lists, bold) is refused with the line
number, so the changelog cannot silently render wrong.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

_CODE = re.compile(r"`([^`]+)`")
_EMPHASIS = re.compile(r"(?<![\w*])\*([^*\s][^*]*?)\*(?![\w*])")
_UNSUPPORTED = re.compile(r"\]\(|\*\*|^\s*\|| {4}- ")
_UNDERLINES = {2: "=", 3: "-"}


class ChangelogError(ValueError):
    """The changelog uses Markdown the directive does not render."""


def _escape(text: str) -> str:
    """Plain text with every reStructuredText special character escaped."""
    return re.sub(r"([\\`*_|<>\[\]:])", r"\\\1", text)


def _glued(text: str, start: int, end: int, markup: str) -> str:
    """``markup`` for ``text[start:end]``, with escaped spaces where a word touches it."""
    before = "\\ " if start > 0 and text[start - 1].isalnum() else ""
    after = "\\ " if end < len(text) and text[end].isalnum() else ""
    return f"{before}{markup}{after}"


def inline(text: str) -> str:
    """One paragraph's Markdown inline markup (code, emphasis) as reStructuredText."""
    spans = [(m.start(), m.end(), f"``{m.group(1)}``") for m in _CODE.finditer(text)]
    plain_ranges, position = [], 0
    for start, end, _ in spans:
        plain_ranges.append((position, start))
        position = end
    plain_ranges.append((position, len(text)))
    spans += [
        (m.start(), m.end(), f"*{_escape(m.group(1))}*")
        for low, high in plain_ranges
        for m in _EMPHASIS.finditer(text, low, high)
    ]
    out: list[str] = []
    position = 0
    for start, end, markup in sorted(spans):
        out.append(_escape(text[position:start]))
        out.append(_glued(text, start, end, markup))
        position = end
    out.append(_escape(text[position:]))
    return "".join(out)


def _blocks(lines: list[str]) -> list[tuple[str, str, int]]:
    """``(kind, text, line)``: headings, items and paragraphs, lines joined."""
    blocks: list[tuple[str, str, int]] = []
    for number, line in enumerate(lines, 1):
        # Inside a code span, ``**`` or ``](`` is code (``10**7``), not markup.
        if _UNSUPPORTED.search(_CODE.sub("code", line)):
            msg = f"CHANGELOG.md:{number}: Markdown the docs do not render: {line.strip()!r}"
            raise ChangelogError(msg)
        if not line.strip():
            blocks.append(("blank", "", number))
        elif line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            blocks.append((f"h{level}", line[level:].strip(), number))
        elif line.startswith("- "):
            blocks.append(("item", line[2:].strip(), number))
        elif (line.startswith("  ") and blocks and blocks[-1][0] == "item") or (
            blocks and blocks[-1][0] == "para"
        ):
            kind, text, start = blocks[-1]
            blocks[-1] = (kind, f"{text} {line.strip()}", start)
        else:
            blocks.append(("para", line.strip(), number))
    return blocks


def to_rst(markdown: str) -> list[str]:
    """The changelog from its first ``##`` heading on, as reStructuredText lines."""
    rst: list[str] = []
    started = False
    for kind, text, number in _blocks(markdown.splitlines()):
        if kind == "h1" or (not started and kind != "h2"):
            continue
        started = True
        if kind in ("h2", "h3"):
            title = _escape(text)
            rst += ["", title, _UNDERLINES[int(kind[1])] * len(title), ""]
        elif kind.startswith("h"):
            msg = f"CHANGELOG.md:{number}: only ## and ### headings are rendered"
            raise ChangelogError(msg)
        elif kind == "item":
            rst += [f"- {inline(text)}", ""]
        elif kind == "para":
            rst += [inline(text), ""]
    return rst


class ChangelogDirective(SphinxDirective):
    """``.. kvcore-changelog:: PATH``: render the Markdown changelog at PATH."""

    required_arguments = 1
    has_content = False
    option_spec: ClassVar[dict[str, Any]] = {}

    def run(self) -> list[nodes.Node]:
        """The changelog's sections, parsed in the including page."""
        _, path = self.env.relfn2path(self.arguments[0])
        source = Path(path)
        self.env.note_dependency(str(source))
        try:
            lines = to_rst(source.read_text(encoding="utf-8"))
        except ChangelogError as exc:
            raise self.error(str(exc)) from exc
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, str(source)), container)
        return list(container.children)


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directive."""
    app.add_directive("kvcore-changelog", ChangelogDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
