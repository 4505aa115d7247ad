"""``kvcore workload``: write kvcore's seeded built-in workload to a JSONL file."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kvcore._sim.generator import GeneratorConfig, generate_workload
from kvcore._sim.workload import write_workload

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Register the ``workload`` subcommand."""
    defaults = GeneratorConfig()
    parser = subparsers.add_parser(
        "workload",
        help="write the seeded built-in workload (multi-turn conversations) as JSONL",
        description=(
            "Generate kvcore's built-in workload, multi-turn conversations over shared "
            "system prompts with log-normal message and answer lengths, and write it in "
            "the Mooncake JSONL format (timestamp, input_length, output_length, hash_ids; "
            "plus request_id). 'kvcore simulate --trace FILE' replays it; the same seed "
            "gives the same file."
        ),
    )
    parser.add_argument("output", metavar="OUTPUT", help="file to write, or - for stdout")
    parser.add_argument(
        "--requests",
        type=int,
        default=defaults.num_requests,
        metavar="N",
        help=f"requests to generate (default: {defaults.num_requests})",
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, metavar="N", help="random seed (default: 0)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=defaults.conversations_per_s,
        metavar="R",
        help=f"new conversations per second (default: {defaults.conversations_per_s:g})",
    )
    parser.add_argument(
        "--system-prompts",
        type=int,
        default=defaults.num_system_prompts,
        metavar="N",
        help=f"distinct shared system prompts (default: {defaults.num_system_prompts})",
    )
    parser.add_argument(
        "--max-context",
        type=int,
        default=defaults.max_context,
        metavar="N",
        help="longest prompt plus answer of a turn, in tokens; a conversation ends "
        f"before exceeding it (default: {defaults.max_context})",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Generate and write the workload."""
    config = GeneratorConfig(
        num_requests=args.requests,
        seed=args.seed,
        conversations_per_s=args.rate,
        num_system_prompts=args.system_prompts,
        max_context=args.max_context,
    )
    requests = generate_workload(config)
    count = write_workload(requests, args.output)
    if args.output != "-":
        prompt = sum(r.input_length for r in requests)
        span = requests[-1].arrival_ms / 1000 if requests else 0.0
        print(
            f"wrote {count:,} requests ({prompt:,} prompt tokens over {span:,.0f} s, "
            f"seed {args.seed}) to {args.output}",
            file=sys.stdout,
        )
    return 0
