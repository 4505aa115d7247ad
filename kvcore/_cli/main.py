"""Entry point of the ``kvcore`` command: parses arguments, dispatches subcommands.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``,
which registers the subcommand and sets ``handler`` (a function taking the
parsed namespace and returning an exit status).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvcore import __version__, backend
from kvcore._cli import plan_cmd, plugins_cmd, simulate_cmd, workload_cmd
from kvcore.errors import InvalidConfigError, KVCoreError

__all__ = ["build_parser", "main"]

SUBCOMMANDS = (plan_cmd, plugins_cmd, simulate_cmd, workload_cmd)


def version_line() -> str:
    """What ``kvcore --version`` prints: the version and the backend pools get by default."""
    try:
        name = backend()
    except InvalidConfigError as error:
        # A bad KVCORE_BACKEND must not hide the version; say what is wrong.
        return f"kvcore {__version__} ({one_line(str(error))})"
    return f"kvcore {__version__} ({name} backend)"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kvcore`` command, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="kvcore",
        description="Plan and simulate the paged KV cache of hybrid LLMs.",
    )
    parser.add_argument("--version", action="version", version=version_line())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def one_line(message: str) -> str:
    """``message`` on one line: its lines joined with ``"; "`` (blank ones dropped)."""
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcore`` command; returns the exit status.

    Bad input is printed as one line (``kvcore: error: ...``) with exit
    status 2, without a traceback: every kvcore error (the message names the
    file, line, field or option and the fix), and a file the system refuses
    to open. Anything else is a bug and keeps its traceback. Ctrl-C exits
    with status 130.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except KVCoreError as exc:
        print(f"kvcore: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        return 0
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"kvcore: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvcore: interrupted", file=sys.stderr)
        return 130
