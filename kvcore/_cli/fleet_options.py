"""``kvcore simulate --engines N``: the fleet options and the fleet run."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore._registry import Registry
from kvcore._sim.simulate import SimulationOptions
from kvcore._sim.workload import Workload
from kvcore.cluster._router import ROUTER_POLICIES
from kvcore.errors import InvalidConfigError

__all__ = ["add_fleet_options", "reject_fleet_options", "run_fleet"]


def add_fleet_options(parser: Any) -> None:
    """Add the fleet options to the ``simulate`` parser."""
    group = parser.add_argument_group(
        "fleet",
        "simulate N engines behind a router, fed by a cluster prefix index "
        "(each engine gets --memory)",
    )
    group.add_argument(
        "--engines", type=int, metavar="N", help="run a fleet of N engines behind a router"
    )
    group.add_argument(
        "--router",
        choices=ROUTER_POLICIES,
        default="prefix",
        help="routing policy (default: prefix: cached prefix against load)",
    )
    group.add_argument(
        "--index",
        metavar="URL",
        help="keep the cluster index in Redis: redis://[USER:PASSWORD@]HOST:PORT, "
        "rediss://... for TLS (?ssl_ca_certs=FILE to trust a private authority) or "
        "unix://PATH (needs kvcore[fleet]; default: in-process)",
    )
    group.add_argument(
        "--scoring",
        choices=("hybrid", "all-alike"),
        default="hybrid",
        help="'hybrid': each KV cache group scored by its own hit rule (default); "
        "'all-alike': every group by the longest-cached-prefix rule, as type-unaware indexes do",
    )
    group.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="replay arrivals X times faster than the trace (default 1)",
    )


def reject_fleet_options(args: argparse.Namespace) -> None:
    """Refuse fleet options given without ``--engines`` (they would be ignored).

    Raises:
        InvalidConfigError: naming the option.
    """
    given = [
        name
        for name, value, default in (
            ("--router", args.router, "prefix"),
            ("--index", args.index, None),
            ("--scoring", args.scoring, "hybrid"),
            ("--time-scale", args.time_scale, 1.0),
        )
        if value != default
    ]
    if given:
        msg = f"{', '.join(given)} applies to a fleet; add --engines N"
        raise InvalidConfigError(msg)


def run_fleet(
    args: argparse.Namespace, workload: Workload, options: SimulationOptions, registry: Registry
) -> int:
    """Run the fleet simulation and print its report."""
    from kvcore._sim.fleet import (
        FleetOptions,
        fleet_progress_printer,
        format_fleet_report,
        simulate_fleet,
    )

    if args.plot is not None:
        msg = "--plot draws one engine's run; it does not apply to --engines"
        raise InvalidConfigError(msg)
    if getattr(args, "execute", False):
        msg = (
            "--execute checks one engine's cache with a tiny model; it does not apply to --engines"
        )
        raise InvalidConfigError(msg)
    fleet = FleetOptions(
        engines=args.engines,
        router=args.router,
        index=args.index,
        hybrid_aware=args.scoring == "hybrid",
        time_scale=args.time_scale,
    )
    report = simulate_fleet(
        workload, options, fleet, registry=registry, progress=fleet_progress_printer()
    )
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_fleet_report(report))
    return 0
