"""``--pool`` and ``--mamba-checkpoint``, shared by ``kvcore plan`` and ``kvcore simulate``."""

from __future__ import annotations

import argparse

from kvcore._planning.pool_choice import DEFAULT_MAMBA_CHECKPOINT, POOLS

__all__ = ["add_pool_options"]


def add_pool_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--pool {auto,shared,two-level}`` and ``--mamba-checkpoint TOKENS``."""
    parser.add_argument(
        "--pool",
        choices=POOLS,
        default="auto",
        help="shared: one page size for every group (the reference engine's design: state "
        "pages aligned with attention pages, pages padded, the block size raised); "
        "two-level: every group keeps its natural block size and page, carved from large "
        "pages; auto: two-level where the layers' pages differ, or where they agree but the "
        "shared pool would waste more (padding layer slots), else shared (default: auto)",
    )
    parser.add_argument(
        "--mamba-checkpoint",
        type=int,
        metavar="TOKENS",
        help="tokens between two cached states of a group of recurrent states cached on a "
        "grid, a multiple of the attention block size (default under the two-level pool: "
        f"{DEFAULT_MAMBA_CHECKPOINT}; under the shared pool only the raised block size is "
        "accepted)",
    )
