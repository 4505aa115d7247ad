"""``kvcore plugins``: list the discovered plugins and what they provide."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvcore._plugin_loader import load_registry
from kvcore._registry import PluginInfo, Registry
from kvcore.errors import InvalidConfigError

__all__ = [
    "add_parser",
    "add_plan_option_argument",
    "add_selection_options",
    "plan_options_from_args",
    "registry_from_args",
]


def add_parser(subparsers: Any) -> None:
    """Register the ``plugins`` subcommand."""
    parser = subparsers.add_parser(
        "plugins",
        help="list the installed plugins, their spec types and manager classes",
        description=(
            "List the kvcore plugins found through the 'kvcore' entry-point group: for "
            "each, its distribution, its attention types (spec class, kind, manager "
            "class, the quantized KV formats it stores), the layer kinds it builds from "
            "model configs, whether it recognizes model configs, and its plan options. "
            "Loading calls the hooks of every selected plugin, so a broken plugin is "
            "reported here. Plugins left out by the selection are listed as not loaded."
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


def add_plan_option_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--option PLUGIN.NAME=VALUE`` (repeatable): a plugin's plan option."""
    parser.add_argument(
        "--option",
        "-o",
        action="append",
        default=[],
        metavar="PLUGIN.NAME=VALUE",
        help="set a plugin's plan option (repeatable; 'kvcore plugins' lists the options "
        "of the installed plugins)",
    )


def plan_options_from_args(args: argparse.Namespace) -> dict[str, str]:
    """The ``--option`` values as a mapping.

    Raises:
        InvalidConfigError: an option is not written ``PLUGIN.NAME=VALUE``.
    """
    options: dict[str, str] = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            msg = (
                f"--option {item!r}: write it as PLUGIN.NAME=VALUE ('kvcore plugins' lists the "
                "options of the installed plugins)"
            )
            raise InvalidConfigError(msg)
        options[key.strip()] = value.strip()
    return options


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
                "kv_formats": [
                    {"name": kv_format.name, "description": kv_format.description}
                    for kv_format in getattr(lt.spec, "kv_formats", ())
                ],
            }
            for lt in plugin.layer_types
        ],
        "layer_kinds": [
            {
                "name": kind.name,
                "aliases": list(kind.aliases),
                "deprecated_aliases": list(kind.deprecated_aliases),
            }
            for kind in plugin.layer_kinds
        ],
        "recognizes_model_configs": plugin.implements("kvcore_model_layers"),
        "plan_options": [
            {
                "name": f"{plugin.name}.{option.name}",
                "default": option.default,
                "choices": None if option.choices is None else list(option.choices),
                "help": option.help,
            }
            for option in plugin.plan_options
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
            for kv_format in layer_type["kv_formats"]:
                described = f" ({kv_format['description']})" if kv_format["description"] else ""
                print(f"        stores KV format {kv_format['name']}{described}")
        if row["layer_kinds"]:
            kinds = []
            for kind in row["layer_kinds"]:
                others = kind["aliases"] + [f"{a} (deprecated)" for a in kind["deprecated_aliases"]]
                kinds.append(kind["name"] + (f" (also {', '.join(others)})" if others else ""))
            print(f"    layer kinds: {', '.join(kinds)}")
        if row["recognizes_model_configs"]:
            print("    recognizes model configs (kvcore_model_layers)")
        for option in row["plan_options"]:
            allowed = "any" if option["choices"] is None else "|".join(option["choices"])
            print(f"    option {option['name']}={allowed} (default {option['default']})")
    loaded = sum(row["loaded"] for row in rows)
    print(f"{loaded} of {len(rows)} installed plugins loaded")
    return 0
