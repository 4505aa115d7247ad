"""``kvcore plan``: plan a model's KV cache and print its groups, blocks and waste."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore._cli.plugins_cmd import (
    add_plan_option_argument,
    add_selection_options,
    plan_options_from_args,
    registry_from_args,
)
from kvcore._cli.pool_options import add_pool_options
from kvcore._planning.group_size import GROUP_SIZE_RULES
from kvcore._planning.model_config import list_models
from kvcore._planning.plan import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, plan
from kvcore.errors import InvalidConfigError

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Register the ``plan`` subcommand."""
    parser = subparsers.add_parser(
        "plan",
        help="plan a model's KV cache: groups, blocks, capacity, waste",
        description=(
            "Read MODEL's config, build every layer's spec through the plugins, group the "
            "layers that share a block table, and size the pool for the memory given. "
            "Prints each group (type, layers, block size, page size, blocks one longest "
            "request holds in it, bytes wasted per block), the number of blocks, the token "
            "capacity, the maximum concurrency at max_model_len and the wasted bytes; for "
            "a two-level pool also the page classes, the large pages and the token grid "
            "prefix hits land on."
        ),
    )
    parser.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="a shipped model name (see --list-models) or a path to a config.json",
    )
    parser.add_argument(
        "--memory", default="80GiB", help="KV cache memory, e.g. 80GiB or 24GB (default: 80GiB)"
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        metavar="N",
        help="longest request in tokens; must fit (default: the model's, lowered to fit)",
    )
    parser.add_argument(
        "--block-size",
        type=int,
        metavar="N",
        help=f"tokens per attention block (default: {DEFAULT_BLOCK_SIZE}; under the shared "
        "pool raised for models with recurrent-state layers until a page holds a state)",
    )
    parser.add_argument(
        "--dtype",
        metavar="NAME",
        help="KV cache dtype: a plain dtype such as bfloat16 or fp8, or a KV format a plugin "
        "declares, such as nvfp4 ('kvcore plugins' lists them); it applies to every layer "
        "whose type takes the model's dtype (default: the model's)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        metavar="N",
        help="tokens scheduled per step; windowed layers keep that many past the window "
        f"(default: {DEFAULT_MAX_NUM_BATCHED_TOKENS})",
    )
    parser.add_argument(
        "--num-blocks",
        type=int,
        metavar="N",
        help="use this many blocks (large pages, under the two-level pool) instead of what "
        "the memory holds",
    )
    parser.add_argument(
        "--group-size-rule",
        choices=GROUP_SIZE_RULES,
        default="reference",
        help="reference: the reference engine's layout; gcd: the layout wasting the least, "
        "printed next to the reference (default: reference)",
    )
    parser.add_argument(
        "--layout",
        choices=("layer-outer", "block-outer"),
        default="layer-outer",
        help="layer-outer: one page size for all layers; block-outer: pages of different "
        "sizes packed side by side in each block (default: layer-outer)",
    )
    parser.add_argument(
        "--no-hybrid",
        action="store_true",
        help="allocate the layers of local attention types (windows, chunks) for every "
        "token, in one block table, as engines without the hybrid manager do",
    )
    add_pool_options(parser)
    add_plan_option_argument(parser)
    add_selection_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    parser.add_argument(
        "--list-models", action="store_true", help="list the shipped model names and exit"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Plan the model and print the plan."""
    if args.list_models:
        print("\n".join(list_models()))
        return 0
    if args.model is None:
        msg = (
            "give a MODEL: a shipped model name or a path to a config.json. Shipped models: "
            + ", ".join(list_models())
        )
        raise InvalidConfigError(msg)
    result = plan(
        args.model,
        memory=args.memory,
        max_model_len=args.max_model_len,
        block_size=args.block_size,
        dtype=args.dtype,
        registry=registry_from_args(args),
        group_size_rule=args.group_size_rule,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_blocks=args.num_blocks,
        layout=args.layout.replace("-", "_"),
        hybrid=not args.no_hybrid,
        options=plan_options_from_args(args),
        pool=args.pool,
        mamba_checkpoint=args.mamba_checkpoint,
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result.summary())
    return 0
