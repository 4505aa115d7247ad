"""Write the intersphinx inventories the docs link torch, numpy and pluggy types with.

Intersphinx downloads each project's ``objects.inv`` when the docs are
built, and CI reaches nothing but the package registries. So the docs ship
small inventories of their own (``docs/_inventories/*.inv``), listing the
names kvcore's API pages use, each pointing at its page in that project's
documentation. Run this after adding a name::

    python docs/_tools/inventories.py

The format is Sphinx's (version 2: a four-line header, then zlib-compressed
lines ``name domain:role priority uri display-name``).
"""

from __future__ import annotations

import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "_inventories"

#: project -> (version, base URL, [(name, role, path#anchor)])
PROJECTS: dict[str, tuple[str, str, list[tuple[str, str, str]]]] = {
    "torch": ("2.13", "https://pytorch.org/docs/stable/", [
        ("torch.Tensor", "class", "tensors.html#torch.Tensor"),
        ("torch.device", "class", "tensor_attributes.html#torch.device"),
        ("torch.dtype", "class", "tensor_attributes.html#torch.dtype"),
        ("torch.Generator", "class", "generated/torch.Generator.html#torch.Generator"),
        ("torch._C.Generator", "class", "generated/torch.Generator.html#torch.Generator"),
        ("torch.nn.Module", "class", "generated/torch.nn.Module.html#torch.nn.Module"),
        (
            "torch.nn.modules.module.Module",
            "class",
            "generated/torch.nn.Module.html#torch.nn.Module",
        ),
    ]),
    "numpy": ("2.0", "https://numpy.org/doc/stable/", [
        ("numpy.ndarray", "class", "reference/generated/numpy.ndarray.html#numpy.ndarray"),
        ("numpy.dtype", "class", "reference/generated/numpy.dtype.html#numpy.dtype"),
        ("numpy.int32", "class", "reference/arrays.scalars.html#numpy.int32"),
        ("numpy.int64", "class", "reference/arrays.scalars.html#numpy.int64"),
    ]),
    "pluggy": ("1.5", "https://pluggy.readthedocs.io/en/stable/", [
        ("pluggy.PluginManager", "class", "api_reference.html#pluggy.PluginManager"),
        ("pluggy.HookimplMarker", "class", "api_reference.html#pluggy.HookimplMarker"),
        ("pluggy.HookspecMarker", "class", "api_reference.html#pluggy.HookspecMarker"),
        ("pluggy.HookCallError", "exception", "api_reference.html#pluggy.HookCallError"),
    ]),
}


def inventory(project: str, version: str, entries: list[tuple[str, str, str]]) -> bytes:
    """One ``objects.inv`` in Sphinx's version-2 format."""
    header = (
        "# Sphinx inventory version 2\n"
        f"# Project: {project}\n"
        f"# Version: {version}\n"
        "# The remainder of this file is compressed using zlib.\n"
    ).encode()
    lines = "".join(
        f"{name} py:{role} 1 {uri} -\n" for name, role, uri in sorted(entries)
    ).encode()
    return header + zlib.compress(lines, 9)


def main() -> int:
    """Write every inventory."""
    HERE.mkdir(exist_ok=True)
    for project, (version, _, entries) in PROJECTS.items():
        (HERE / f"{project}.inv").write_bytes(inventory(project, version, entries))
        print(f"{HERE.name}/{project}.inv: {len(entries)} names")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
