"""Figures from one source: render recorded results, refuse figures typed by hand.

Benchmark and simulation scripts write *records*, JSON files in
``benchmarks/results/`` (``benchmarks/_record.py``: the command, date, load
and commit of one run, and what it measured). Pages show them with:

``:fig:`RECORD KEY```
    One figure, ``figures[KEY]`` of ``RECORD.json``, as the script formatted it.
``.. recorded-table:: RECORD KEY``
    ``tables[KEY]``: a table with a header row (options ``:widths:``,
    ``:class:``, ``:title:`` to override the recorded title).
``.. recorded-output:: RECORD KEY``
    ``outputs[KEY]``: what the script printed, as a literal block. With
    ``:console: COMMAND`` it is shown as ``$ COMMAND`` and its output (the
    doc-example tests then run the command and compare); ``:keep:`` keeps
    only the lines starting with the given comma-separated words (the
    others shown as ``...``); ``:class:`` adds classes to the block.
``:given:`TEXT```
    Text that looks like a measurement and is not one (a default, a
    hand-worked example): rendered as it is, exempt from the check.

Every page that uses a record ends with the list of the records it used:
command, date, load and commit.

The check (a warning, so ``sphinx-build -W`` fails): outside those, a page
may not state a *measured figure*, that is a number (or a range of two)
followed by a unit of measurement:

* a percentage (``%``, per cent) or percentage points (``points``);
* a ratio (``×`` or ``x`` right after the number, or ``times``);
* a time (``s``, ``ms``, ``µs``, ``us``, ``ns``, ``min``, ``minutes``,
  ``seconds``, ``hours``);
* a rate (``/s``, ``per second``, ``a second``);
* a byte count per block (``bytes per block``, ``B/block``: what the pool
  measurably holds; a page size per token is planning arithmetic).

Not flagged: plain counts, sizes with binary units (``80 GiB``, config
values and page sizes), version numbers, anything in inline code
(````--memory 4GiB````) or in Python, TOML and JSON blocks. In console and
output blocks, which the doc-example tests run and compare, only times
are flagged (the tests cannot compare them). Pages listed in
``kvcore_figures_exempt`` (the changelog: dated history, not a current
claim) are not checked.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole

logger = logging.getLogger(__name__)

_NUMBER = r"[-−+]?\d[\d,]*(?:\.\d+)?"
_RANGE = rf"(?<![\w.,/−-]){_NUMBER}(?:\s?(?:–|-|to)\s?{_NUMBER})?"
_TIME = r"(?:s|ms|µs|μs|us|ns|min|mins|minutes?|seconds?|hours?)\b"
_UNITS = {
    "percentage": r"\s?(?:%|per\s?cent\b|percent\b)|\s(?:percentage\s)?points?\b",
    "ratio": r"[×x](?!\w)|\s?times\b",
    "time": rf"\s?{_TIME}",
    "rate": r"\s?(?:/s\b|per\s(?:simulated\s)?second\b|a\ssecond\b)",
    "byte count": r"\s?(?:bytes?|B)\s?(?:per\s|a\s|/)\s?blocks?\b",
}
FIGURE = re.compile(_RANGE + "(?:" + "|".join(_UNITS.values()) + ")")
TIME_FIGURE = re.compile(_RANGE + _UNITS["time"])
CODE_LANGUAGES = frozenset({"python", "python3", "py", "pycon", "toml", "json"})


def figures_in(text: str, *, times_only: bool = False) -> list[str]:
    """The measured figures ``text`` states (see the module docstring)."""
    pattern = TIME_FIGURE if times_only else FIGURE
    return [match.group(0).strip() for match in pattern.finditer(text.replace("\xa0", " "))]


class RecordError(ValueError):
    """A record or a key in it that does not exist."""


def load_records(folder: Path) -> dict[str, dict[str, Any]]:
    """Every record in ``folder``, by name (the file's stem)."""
    records = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        for field in ("command", "date", "load", "commit"):
            if not isinstance(record.get(field), str):
                msg = f"{path.name}: a record needs {field!r} (written by benchmarks/_record.py)"
                raise RecordError(msg)
        records[path.stem] = record
    return records


def lookup(records: dict[str, dict[str, Any]], name: str, part: str, key: str) -> Any:
    """``records[name][part][key]``, or a :class:`RecordError` saying what exists."""
    if name not in records:
        msg = f"no record {name!r} in benchmarks/results (records: {', '.join(sorted(records))})"
        raise RecordError(msg)
    entries = records[name].get(part) or {}
    if key not in entries:
        known = ", ".join(sorted(entries)) or "none"
        msg = f"record {name!r} has no {part[:-1]} {key!r} ({part}: {known})"
        raise RecordError(msg)
    return entries[key]


def _folder(app: Sphinx) -> Path:
    return Path(app.confdir, app.config.kvcore_records_dir).resolve()


def _records(env: Any, name: str | None = None) -> dict[str, dict[str, Any]]:
    """The records read when the build started; a page using ``name`` depends on its file."""
    if name is not None:
        env.note_dependency(str(_folder(env.app) / f"{name}.json"))
    return env.app.kvcore_records  # type: ignore[no-any-return]


def on_builder_inited(app: Sphinx) -> None:
    """Read every record once per build."""
    app.kvcore_records = load_records(_folder(app))  # type: ignore[attr-defined]


def _mark(node: nodes.Element, name: str) -> nodes.Element:
    node["kvcore_record"] = name
    return node


class FigureRole(SphinxRole):
    """``:fig:`RECORD KEY```: one recorded figure."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        """The figure as inline text marked with its record."""
        try:
            name, key = self.text.split()
            value = lookup(_records(self.env, name), name, "figures", key)
        except (ValueError, RecordError) as exc:
            message = self.inliner.reporter.error(f":fig:`{self.text}`: {exc}", line=self.lineno)
            return [], [message]
        node = nodes.inline(self.rawtext, value, classes=["kvcore-figure"])
        return [_mark(node, name)], []


class GivenRole(SphinxRole):
    """``:given:`TEXT```: a value that looks measured and is not (exempt from the check)."""

    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        """The text, unchanged, marked as given."""
        return [_mark(nodes.inline(self.rawtext, self.text), "(given)")], []


class RecordedTable(SphinxDirective):
    """``.. recorded-table:: RECORD KEY``: a recorded table."""

    required_arguments = 2
    option_spec: ClassVar[dict[str, Any]] = {
        "widths": directives.positive_int_list,
        "class": directives.class_option,
        "title": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        """The table, header row first."""
        name, key = self.arguments
        try:
            recorded = lookup(_records(self.env, name), name, "tables", key)
        except RecordError as exc:
            raise self.error(str(exc)) from exc
        header, rows = recorded["header"], recorded["rows"]
        widths = self.options.get("widths") or [1] * len(header)
        table = nodes.table(classes=self.options.get("class", []))
        title = self.options.get("title", recorded.get("title"))
        if title:
            table += nodes.title(title, title)
        group = nodes.tgroup(cols=len(header))
        table += group
        group.extend(nodes.colspec(colwidth=width) for width in widths)
        group += nodes.thead("", self._row(header))
        group += nodes.tbody("", *(self._row(row) for row in rows))
        self.set_source_info(table)
        return [_mark(table, name)]

    @staticmethod
    def _row(cells: list[str]) -> nodes.row:
        return nodes.row("", *(nodes.entry("", nodes.paragraph(c, c)) for c in cells))


class RecordedOutput(SphinxDirective):
    """``.. recorded-output:: RECORD KEY``: recorded program output."""

    required_arguments = 2
    option_spec: ClassVar[dict[str, Any]] = {
        "console": directives.unchanged_required,
        "keep": directives.unchanged_required,
        "class": directives.class_option,
    }

    def run(self) -> list[nodes.Node]:
        """The output (or console session) as a literal block."""
        name, key = self.arguments
        try:
            text = lookup(_records(self.env, name), name, "outputs", key)
        except RecordError as exc:
            raise self.error(str(exc)) from exc
        if "keep" in self.options:
            text = keep_lines(text, [w.strip() for w in self.options["keep"].split(",")])
        language = "text"
        if "console" in self.options:
            text = f"$ {self.options['console']}\n{text}"
            language = "console"
        block = nodes.literal_block(text, text, classes=self.options.get("class", []))
        block["language"] = language
        self.set_source_info(block)
        return [_mark(block, name)]


def keep_lines(text: str, starts: list[str]) -> str:
    """The lines of ``text`` whose first word(s) are in ``starts``; ``...`` for each gap."""
    kept: list[str] = []
    for line in text.splitlines():
        if any(line.strip().startswith(start) for start in starts):
            kept.append(line)
        elif not kept or kept[-1] != "...":
            kept.append("...")
    return "\n".join(kept)


def _recorded_in(node: nodes.Node) -> bool:
    while node is not None:
        if isinstance(node, nodes.Element) and "kvcore_record" in node:
            return True
        node = node.parent
    return False


def unsourced(doctree: nodes.document) -> Iterator[tuple[nodes.Node, str]]:
    """``(node, figure)`` for every measured figure not taken from a record."""
    for block in doctree.findall(nodes.literal_block):
        if _recorded_in(block) or block.get("language") in CODE_LANGUAGES:
            continue
        verified = block.get("language") == "console" or "output" in block.get("classes", ())
        for figure in figures_in(block.astext(), times_only=verified):
            yield block, figure
    for text in doctree.findall(nodes.Text):
        parent = text.parent
        if isinstance(parent, nodes.literal | nodes.literal_block | nodes.raw | nodes.comment):
            continue
        if isinstance(parent, nodes.FixedTextElement) or _recorded_in(text):
            continue
        for figure in figures_in(text.astext()):
            yield parent, figure


def on_doctree_read(app: Sphinx, doctree: nodes.document) -> None:
    """List the page's records at its end, then check it for unsourced figures."""
    env = app.env
    used = sorted({
        node["kvcore_record"] for node in doctree.findall(nodes.Element)
        if node.get("kvcore_record", "(given)") != "(given)"
    })
    if used:
        records = _records(env)
        items = nodes.bullet_list()
        for name in used:
            record = records[name]
            para = nodes.paragraph()
            para += nodes.strong(name, name)
            para += nodes.Text(": ")
            para += nodes.literal(record["command"], record["command"])
            para += nodes.Text(f", {record['date']}, {record['load']}, commit {record['commit']}")
            if (record.get("data") or {}).get("transcribed"):
                para += nodes.Text(" (transcribed from runs made before kvcore recorded them)")
            para += nodes.Text(".")
            items += nodes.list_item("", para)
        sources = nodes.container(classes=["kvcore-sources"])
        title = "Where the figures on this page come from"
        sources += nodes.rubric(title, title)
        sources += nodes.paragraph(
            "", "Each figure was measured by the command below and is rendered from "
            "its record in benchmarks/results/ (date in UTC, machine load at the "
            "start and end of the run):",
        )
        sources += items
        section = next(iter(doctree.findall(nodes.section)), doctree)
        section += _mark(sources, "(sources)")
    if not app.config.kvcore_figures_check or env.docname in app.config.kvcore_figures_exempt:
        return
    for node, figure in unsourced(doctree):
        logger.warning(
            "%r is a measured figure typed into the page: render it from a record "
            "(:fig:`RECORD KEY`, recorded-table, recorded-output), or mark a value that "
            "is not measured with :given:`...` (see CONTRIBUTING.md, \"Figures\")",
            figure, location=node, type="kvcore", subtype="figure",
        )


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the roles, the directives and the check."""
    app.add_config_value("kvcore_records_dir", "../benchmarks/results", "env")
    app.add_config_value("kvcore_figures_check", True, "env")
    app.add_config_value("kvcore_figures_exempt", set(), "env", types=[set, frozenset, list])
    app.add_role("fig", FigureRole())
    app.add_role("given", GivenRole())
    app.add_directive("recorded-table", RecordedTable)
    app.add_directive("recorded-output", RecordedOutput)
    app.connect("builder-inited", on_builder_inited)
    app.connect("doctree-read", on_doctree_read)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
