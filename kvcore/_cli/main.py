"""Entry point of the ``kvcore`` command: parses arguments, dispatches subcommands.

Each subcommand lives in its own module exposing ``add_parser(subparsers)``,
which registers the subcommand and sets ``handler`` (a function taking the
parsed namespace and returning an exit status).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvcore import __version__
from kvcore._cli import plan_cmd, plugins_cmd, simulate_cmd, workload_cmd
from kvcore.errors import KVCoreError

__all__ = ["build_parser", "main"]

SUBCOMMANDS = (plan_cmd, plugins_cmd, simulate_cmd, workload_cmd)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``kvcore`` command, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="kvcore",
        description="Plan and simulate the paged KV cache of hybrid LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"kvcore {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``kvcore`` command; returns the exit status.

    kvcore errors are printed as one line (``kvcore: error: ...``) with exit
    status 2, without a traceback: they describe bad input, not bugs.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except KVCoreError as exc:
        print(f"kvcore: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like
        return 0
