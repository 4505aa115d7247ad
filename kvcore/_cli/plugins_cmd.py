"""``kvcore plugins``: list the discovered plugins and what they provide."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore._plugin_loader import load_registry
from kvcore._registry import PluginInfo, Registry

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    """Register the ``plugins`` subcommand."""
    parser = subparsers.add_parser(
        "plugins",
        help="list the installed plugins, their spec types and manager classes",
        description=(
            "List the kvcore plugins found through the 'kvcore' entry-point group: for "
            "each, its distribution, its attention types (spec class, event kind, manager "
            "class). Plugins left out by the selection are listed as not loaded."
        ),
    )
    add_selection_options(parser)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--only`` / ``--disable`` (shared by every subcommand that loads plugins)."""
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help="comma-separated plugin names to load, all others left out "
        "(default: $KVCORE_PLUGINS, else every installed plugin)",
    )
    parser.add_argument(
        "--disable",
        metavar="NAMES",
        help="comma-separated plugin names not to load (default: $KVCORE_DISABLE_PLUGINS)",
    )


def registry_from_args(args: argparse.Namespace) -> Registry:
    """Load the registry selected by ``--only`` / ``--disable`` (else the environment)."""
    if args.only is None and args.disable is None:
        return load_registry()
    return load_registry(
        only=args.only.split(",") if args.only is not None else None,
        disable=args.disable.split(",") if args.disable is not None else (),
    )


def _describe(plugin: PluginInfo, loaded: bool) -> dict[str, Any]:
    return {
        "name": plugin.name,
        "loaded": loaded,
        "distribution": plugin.distribution,
        "version": plugin.version,
        "module": plugin.module,
        "layer_types": [
            {
                "spec": f"{lt.spec.__module__}.{lt.spec.__qualname__}",
                "kind": lt.spec.kind,
                "manager": f"{lt.manager.__module__}.{lt.manager.__qualname__}",
            }
            for lt in plugin.layer_types
        ],
    }


def run(args: argparse.Namespace) -> int:
    """Print the plugin list."""
    registry = registry_from_args(args)
    rows = [_describe(p, True) for p in registry.plugins]
    rows += [_describe(p, False) for p in registry.unselected]
    rows.sort(key=lambda row: row["name"])
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        source = f"{row['distribution']} {row['version']}" if row["distribution"] else "in-process"
        status = "" if row["loaded"] else "  [not loaded: left out by the selection]"
        print(f"{row['name']}  ({source}, {row['module']}){status}")
        for layer_type in row["layer_types"]:
            print(f"    {layer_type['spec']}  [{layer_type['kind']}]")
            print(f"        managed by {layer_type['manager']}")
    loaded = sum(row["loaded"] for row in rows)
    print(f"{loaded} of {len(rows)} installed plugins loaded")
    return 0
