"""Run the code blocks of a built page and check what they print.

Every literal block of a page's doctree (as Sphinx read it: ``.. code-block::``,
``::`` blocks, ``literalinclude`` and the docstrings autodoc pulled in) is
classified by its language:

``python``
    Executed, in page order, in one namespace per page (a page reads like a
    notebook). A block taken from a docstring runs in a namespace of its own
    with ``kvcore`` imported. What it prints must be shown by an *output
    block* (``.. code-block:: text`` with ``:class: output``) after it, and
    match it; a block that prints with no output block after it fails.
``console``
    Each ``$`` command is run (``kvcore ...`` in-process, in a scratch folder
    per page) and its output compared with the lines shown under it, if any.
    Install commands (``python3 -m venv``, ``source .venv/bin/activate``,
    ``pip install`` or ``python -m pip install``, ``python -m build``) are not
    run: they are checked against what the project offers (the extras in
    ``pyproject.toml``, the paths in the repository, the wheel ``python -m
    build`` writes), CI itself running the README's install command and
    building and installing the wheel. A console block with ``:class:
    not-run-in-ci`` (a clone, a CUDA build of torch) is not run, and the page
    shows it as not run in CI.
``toml`` / ``json``
    Parsed.
``text`` (the default, for ``::`` blocks) / ``none``
    Not code (diagrams, formulas): not run. With ``:class: output``: the
    output of the block before.

Comparison is doctest's, with ``...`` matching any text (ELLIPSIS), runs of
spaces compared as one space, and measured times (a number followed by
``s``, ``ms`` or ``µs``) matching any number: they vary from run to run.
"""

from __future__ import annotations

import ast
import contextlib
import doctest
import io
import json
import os
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from docbuild import DATA, REPO
from docutils import nodes

PYTHON = frozenset({"python", "python3", "py"})
NOT_CODE = frozenset({"text", "none", "default"})
DATA_LANGUAGES = frozenset({"toml", "json"})

#: Third-party trace files a command may name, as the tutorial tells readers to
#: download them, and where the shared data folder holds them.
TRACES = {
    "conversation_trace.jsonl": "mooncake/mooncake_conversation_trace.jsonl",
    "synthetic_trace.jsonl": "mooncake/mooncake_synthetic_trace.jsonl",
}

_MEASURED = re.compile(r"\d[\d,]*(?:\.\d+)?(?=\s*(?:s|ms|µs)\b)")
_SPACES = re.compile(r"[ \t]+")


class ExampleError(AssertionError):
    """A code block failed, or printed something other than what the page shows."""


class MissingData(Exception):
    """A command needs third-party data that is not on this machine."""


@attrs.frozen
class Block:
    """One literal block of a page."""

    text: str
    language: str
    classes: tuple[str, ...]
    where: str
    from_docstring: bool

    @property
    def is_output(self) -> bool:
        """Whether the block shows the output of the block before it."""
        return "output" in self.classes


def _where(node: nodes.Element, docname: str) -> str:
    source = node.get("source") or node.source or docname
    line = node.line
    if line is None and node.parent is not None:
        line = node.parent.line
    return f"{source}:{line}" if line else str(source)


def blocks(doctree: nodes.document, docname: str) -> list[Block]:
    """Every literal block and doctest block of a page, in page order."""
    found = []
    for node in doctree.findall(lambda n: isinstance(n, nodes.literal_block | nodes.doctest_block)):
        if isinstance(node, nodes.doctest_block):
            language = "pycon"
        else:
            language = node.get("language") or "text"
        source = str(node.get("source") or node.source or "")
        found.append(
            Block(
                text=node.astext(),
                language=language,
                classes=tuple(node.get("classes", ())),
                where=_where(node, docname),
                from_docstring="docstring of" in source,
            )
        )
    return found


def looks_like_code(text: str) -> str | None:
    """What a plain-text block holds if it is code in disguise (it would never run)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    if lines[0].startswith("$ ") or any(
        line.startswith(("pip install", "python3 -m", "python -m", "kvcore ")) for line in lines
    ):
        return "a console session"
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    if any(
        isinstance(n, ast.Call | ast.Import | ast.ImportFrom | ast.FunctionDef)
        for n in ast.walk(tree)
    ):
        return "Python"
    return None


def normalize(text: str) -> str:
    """Output as compared: measured times blanked, runs of spaces as one space."""
    lines = [_SPACES.sub(" ", _MEASURED.sub("<t>", line)).rstrip() for line in text.splitlines()]
    return "\n".join(lines).strip("\n") + "\n"


def check_output(want: str, got: str, where: str) -> None:
    """Raise :class:`ExampleError` unless ``got`` matches ``want`` (see the module doc)."""
    checker = doctest.OutputChecker()
    expected, actual = normalize(want), normalize(got)
    if not checker.check_output(expected, actual, doctest.ELLIPSIS):
        msg = f"{where}: the output differs from the page\n--- shown:\n{want}\n--- printed:\n{got}"
        raise ExampleError(msg)


@contextlib.contextmanager
def _capture() -> Iterator[io.StringIO]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        yield out


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_python(source: str, namespace: dict[str, Any], where: str) -> str:
    """Execute a Python block; return what it printed."""
    code = compile(source, where, "exec")
    with _capture() as out:
        try:
            exec(code, namespace)
        except Exception as exc:
            msg = f"{where}: the example raised {type(exc).__name__}: {exc}"
            raise ExampleError(msg) from exc
    return out.getvalue()


def run_doctest(source: str, namespace: dict[str, Any], where: str) -> None:
    """Run a ``>>>`` block as a doctest in the page's namespace."""
    parser = doctest.DocTestParser()
    test = parser.get_doctest(source, namespace, where, where, 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report = io.StringIO()
    runner.run(test, out=report.write, clear_globs=False)
    if runner.failures:
        raise ExampleError(f"{where}:\n{report.getvalue()}")


def commands(text: str) -> list[tuple[str, str]]:
    """``(command, shown output)`` pairs of a console block (``\\`` continues a command)."""
    pairs: list[tuple[str, list[str]]] = []
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            pairs.append((command, []))
        elif pairs:
            pairs[-1][1].append(line)
        elif line.strip():
            msg = f"console output before any '$ ' command: {line!r}"
            raise ExampleError(msg)
    return [(command, "\n".join(out)) for command, out in pairs]


def _check_install(argv: list[str], where: str) -> None:
    """An install command names only extras and paths the project has."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    for arg in argv:
        if arg.startswith("-"):
            continue
        path, _, extra = arg.partition("[")
        if path in (".", "") or (REPO / path).exists() or _WHEEL.fullmatch(arg):
            wanted = {e.strip() for e in extra.rstrip("]").split(",") if e.strip()}
            if wanted - extras:
                msg = f"{where}: unknown extra {sorted(wanted - extras)} in {arg!r}"
                raise ExampleError(msg)
        elif arg not in ("install", "venv", ".venv", "constraints.txt", "build"):
            msg = f"{where}: {arg!r} is neither a path of the repository nor kvcore's extra"
            raise ExampleError(msg)
    if "install" in argv and "-c" in argv and argv[argv.index("-c") + 1] != "constraints.txt":
        msg = f"{where}: installs must use -c constraints.txt (it pins the torch version CI tests)"
        raise ExampleError(msg)


#: The wheel ``python -m build --wheel`` writes, as an install names it.
_WHEEL = re.compile(r"dist/kvcore-(?:\*|[\w.]+-py3-none-any)\.whl(?:\[[\w,]+\])?")


def _setup_command(argv: list[str], where: str) -> bool:
    """Check an environment or install command (not run); False if it is not one."""
    program = Path(argv[0]).name
    if program in ("source", ".") and argv[1:] == [".venv/bin/activate"]:
        return True
    if program in ("python3", "python") and argv[1:3] in (["-m", "venv"], ["-m", "build"]):
        return True
    if program in ("python3", "python") and argv[1:3] == ["-m", "pip"]:
        argv = argv[2:]
        program = "pip"
    if program == "pip":
        _check_install(argv[1:], where)
        return True
    return False


def run_command(command: str, scratch: Path, where: str) -> str:
    """Run one console command; return what it printed."""
    argv = shlex.split(command)
    program = Path(argv[0]).name
    if _setup_command(argv, where):
        return ""
    if program != "kvcore":
        msg = f"{where}: the doc-example runner does not run {program!r} commands"
        raise ExampleError(msg)
    for name, shared in TRACES.items():
        if name in argv and not (scratch / name).exists():
            if not (DATA / shared).is_file():
                msg = f"{command!r} needs {DATA / shared} (set KVCORE_DATA to the shared data)"
                raise MissingData(msg)
            (scratch / name).symlink_to(DATA / shared)
    from kvcore._cli.main import main

    with _cwd(scratch), _capture() as out, contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            status = main(argv[1:])
        except SystemExit as exit_:  # --version and --help exit through argparse
            status = exit_.code if isinstance(exit_.code, int) else 1
    if status != 0:
        msg = f"{where}: {command!r} exited with {status}: {err.getvalue()}"
        raise ExampleError(msg)
    return out.getvalue()


def run_page(page_blocks: list[Block], scratch: Path) -> int:
    """Run every block of one page; return how many blocks ran or were checked."""
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    pending: tuple[str, str] | None = None  # (printed, where) of the last Python block
    checked = 0

    def settle() -> None:
        if pending is not None and pending[0]:
            printed, where = pending
            msg = f"{where}: the example prints but the page shows no output block after it:\n"
            raise ExampleError(msg + printed)

    for block in page_blocks:
        if block.is_output:
            if pending is None:
                msg = f"{block.where}: an output block with no Python block before it"
                raise ExampleError(msg)
            check_output(block.text, pending[0], block.where)
            pending = None
            checked += 1
        elif block.language in PYTHON:
            settle()
            if block.from_docstring:
                scope: dict[str, Any] = {"__name__": "__docs__", "kvcore": __import__("kvcore")}
                pending = (run_python(block.text, scope, block.where), block.where)
            else:
                pending = (run_python(block.text, namespace, block.where), block.where)
            checked += 1
        elif block.language == "pycon":
            settle()
            pending = None
            run_doctest(block.text, namespace, block.where)
            checked += 1
        elif block.language == "console" and "not-run-in-ci" in block.classes:
            settle()
            pending = None
        elif block.language == "console":
            settle()
            pending = None
            for command, shown in commands(block.text):
                printed = run_command(command, scratch, block.where)
                if shown.strip():
                    check_output(shown, printed, f"{block.where} ({command})")
            checked += 1
        elif block.language in DATA_LANGUAGES:
            try:
                json.loads(block.text) if block.language == "json" else tomllib.loads(block.text)
            except ValueError as exc:
                msg = f"{block.where}: not valid {block.language}: {exc}"
                raise ExampleError(msg) from exc
            checked += 1
        elif block.language not in NOT_CODE:
            msg = f"{block.where}: no runner for language {block.language!r}"
            raise ExampleError(msg)
        elif (kind := looks_like_code(block.text)) is not None:
            msg = (
                f"{block.where}: this plain-text block holds {kind}, which would never run: "
                "say what it is (.. code-block:: python / console), or mark output with "
                ":class: output"
            )
            raise ExampleError(msg)
    settle()
    sys.stdout.flush()
    return checked
