"""Records: the data files the documentation's figures come from.

A benchmark or simulation script that produces figures for the docs ends with
:func:`write_record`. A record is one JSON file in ``benchmarks/results/``,
named after what it measured, holding one run:

``command``
    How to reproduce it, from the repository root (``python benchmarks/...``).
``date``, ``load``, ``commit``
    When it ran (UTC), the machine's load average at its start and at its end
    (with the number of cores), and the commit it ran on (``+ changes`` when
    the working tree differed from it).
``figures``
    Name -> the figure as the page shows it (``"2.32×"``, ``"63.1 %"``),
    rendered by the ``:fig:`` role.
``tables``
    Name -> ``{"title", "header", "rows"}``, rendered by ``recorded-table``.
``outputs``
    Name -> text the script printed, rendered by ``recorded-output``.
``data``
    Anything else worth keeping (raw samples, full reports); not rendered.

The docs build (``docs/_ext/kvcore_figures.py``) renders them and fails on
any measured figure a page states without one (see ``CONTRIBUTING.md``).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from _common import REPO, machine_load

RESULTS = REPO / "benchmarks" / "results"
#: Set by :func:`start` (the load when the measurement began).
_START_LOAD: list[str] = []


def start() -> None:
    """Note the load average at the start of a measurement (call it first)."""
    _START_LOAD[:] = [machine_load()]


#: What the scripts write themselves (records, plots): not a change of the code measured.
OUTPUTS = ("benchmarks/results/", "docs/_static/")


def commit() -> str:
    """The checked-out commit, ``+ changes`` if tracked files other than outputs differ."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    dirty = [line for line in changed if not line[3:].startswith(OUTPUTS)]
    return f"{head} + changes" if dirty else head


def last_change(path: Path) -> dict[str, str]:
    """Date and commit of the last commit that changed ``path`` (cached results)."""
    try:
        out = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "log",
                "-1",
                "--format=%h %cd",
                "--date=format-local:%Y-%m-%d %H:%M",
                "--",
                str(path),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "TZ": "UTC"},
        ).stdout.split(maxsplit=1)
    except (OSError, subprocess.CalledProcessError):
        out = []
    if len(out) != 2:
        return {"date": "unknown", "commit": "unknown"}
    return {"date": f"stored {out[1].strip()} UTC", "commit": out[0]}


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran, as typed from the repository root."""
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0]).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else Path(args[0])
    return shlex.join(["python", str(shown), *args[1:]])


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> dict[str, Any]:
    """A table for ``recorded-table``: every cell as text, every row as wide as the header."""
    for row in rows:
        if len(row) != len(header):
            msg = f"table {title!r}: a row of {len(row)} cells under {len(header)} columns"
            raise ValueError(msg)
    return {"title": title, "header": list(header), "rows": [[str(c) for c in r] for r in rows]}


def write_record(
    name: str,
    *,
    figures: Mapping[str, str] = {},
    tables: Mapping[str, Mapping[str, Any]] = {},
    outputs: Mapping[str, str] = {},
    data: Any = None,
    command: str | None = None,
    provenance: Mapping[str, str] | None = None,
    results: Path | None = None,
) -> Path:
    """Write ``results/NAME.json`` (see the module docstring); return its path.

    ``provenance`` overrides ``date``, ``load`` and ``commit`` for figures this
    run did not measure itself (cached results measured by an earlier run).
    ``results`` defaults to :data:`RESULTS`, read when the record is written
    (a test points it at a folder of its own).
    """
    end_load = machine_load()
    loads = [*_START_LOAD, end_load] if _START_LOAD else [end_load]
    record = {
        "command": command or command_line(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load": " at start; ".join(loads) + (" at end" if len(loads) > 1 else ""),
        "commit": commit(),
        **(provenance or {}),
        "figures": {key: str(value) for key, value in figures.items()},
        "tables": dict(tables),
        "outputs": dict(outputs),
        "data": data,
    }
    folder = RESULTS if results is None else results
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"[record: {os.path.relpath(path, REPO)}]")
    return path


class Recorder:
    """Collects a script's figures, tables and printed sections for one record.

    ``with recorder.section("table"): print(...)`` prints as usual and keeps
    the text; :meth:`write` writes the record if the script was asked to
    (``--record``), so an exploratory run never overwrites the docs' figures.
    """

    def __init__(self, name: str, *, enabled: bool, command: str | None = None) -> None:
        """``command``: what the record says ran (default: this process's command line)."""
        self.name = name
        self.enabled = enabled
        self.command = command
        self.figures: dict[str, str] = {}
        self.tables: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        start()

    @contextlib.contextmanager
    def section(self, key: str) -> Iterator[None]:
        """Print as usual inside the block, and keep what was printed as ``outputs[key]``."""
        buffer = io.StringIO()
        tee = _Tee(sys.stdout, buffer)
        with contextlib.redirect_stdout(tee):  # type: ignore[type-var]
            yield
        self.outputs[key] = self.outputs.get(key, "") + buffer.getvalue()

    def figure(self, key: str, text: str) -> None:
        """One figure as the page shows it."""
        self.figures[key] = text

    def write(self) -> Path | None:
        """Write ``benchmarks/results/NAME.json`` if recording is on."""
        if not self.enabled:
            return None
        outputs = {key: text.strip("\n") for key, text in self.outputs.items()}
        return write_record(
            self.name,
            figures=self.figures,
            tables=self.tables,
            outputs=outputs,
            data=self.data or None,
            command=self.command,
        )


class _Tee(io.TextIOBase):
    def __init__(self, *streams: Any) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def ratio(value: float) -> str:
    """A ratio as the docs print it: ``2.32×``."""
    return f"{value:.2f}×"


def percent(fraction: float, digits: int = 1) -> str:
    """A fraction as a percentage: ``63.1 %``."""
    return f"{fraction * 100:.{digits}f} %"


def span(low: float, high: float, fmt: str = "{:.2f}", unit: str = "") -> str:
    """A range of two figures: ``1.45–1.64×``, or one figure when they round alike."""
    a, b = fmt.format(low), fmt.format(high)
    return f"{a}{unit}" if a == b else f"{a}–{b}{unit}"
