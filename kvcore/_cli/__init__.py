"""The ``kvcore`` command line: one module per subcommand."""

from __future__ import annotations

from kvcore._cli.main import main

__all__ = ["main"]
