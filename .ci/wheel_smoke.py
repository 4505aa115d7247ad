"""Smoke test of a built kvcore wheel, run by ``.ci/run`` from a venv outside the tree.

``.ci/run`` builds the sdist and the wheel, installs the wheel alone (with its
dependencies, no ``-e``) into a fresh virtual environment in a temporary
folder, and runs this file with that environment's Python from that folder,
passing the sdist, the wheel and the repository's version. What it checks is
what an editable install cannot show:

* kvcore and its plugins are imported from the environment, not the checkout;
* one version: the package, the wheel's metadata and ``kvcore --version``
  (which names the native backend: the wheel carries the compiled module);
* the package data shipped (the model configs ``kvcore plan`` reads, the tiny
  models of the executor, ``py.typed``) and the licence;
* the eight built-in plugins found through their entry points;
* a plan, a manager and a step of the reference executor work;
* the sdist holds the licence, the changelog, every plugin and the C source.

Usage: ``python wheel_smoke.py SDIST WHEEL VERSION``. Exits non-zero with the
failed check's message.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

BUILT_IN = {
    "chunked_local",
    "cross_attention",
    "full_attention",
    "hidden_state",
    "mamba",
    "mla",
    "sink_full_attention",
    "sliding_window",
}


def check(condition: object, message: str) -> None:
    """Fail the smoke test with ``message`` unless ``condition`` holds."""
    if not condition:
        print(f"wheel smoke test FAILED: {message}", file=sys.stderr)
        raise SystemExit(1)


def check_installed(version: str) -> None:
    """The kvcore package comes from this environment's site-packages, at ``version``."""
    import kvcore
    import kvcore_plugins

    site = Path(sysconfig.get_paths()["purelib"]).resolve()
    for module in (kvcore, kvcore_plugins):
        where = Path(module.__file__ or "").resolve()
        check(where.is_relative_to(site), f"{module.__name__} imported from {where}, not {site}")
    check(kvcore.__version__ == version, f"kvcore.__version__ {kvcore.__version__} != {version}")
    meta = importlib.metadata.version("kvcore")
    check(meta == version, f"the wheel's metadata says {meta}, the repository {version}")
    cli = Path(sys.executable).with_name("kvcore")
    printed = subprocess.run([cli, "--version"], capture_output=True, text=True, check=True)
    # The wheel is built where a C compiler is: it carries the native backend.
    expected = f"kvcore {version} (native backend)"
    check(printed.stdout.strip() == expected, f"kvcore --version: {printed.stdout!r}")
    files = importlib.metadata.files("kvcore") or []
    names = {str(f) for f in files}
    check(any(n.endswith("LICENSE") for n in names), "no LICENSE in the wheel's metadata")
    for data in ("kvcore/py.typed", "kvcore/_planning/models/gemma-3-27b.json",
                 "kvcore/_exec/models/tiny-gemma.json"):
        check(data in names, f"package data {data} missing from the wheel")


def check_plugins_and_a_plan() -> None:
    """The entry points load, a shipped model plans, a manager serves a request."""
    import kvcore

    found = {ep.name for ep in importlib.metadata.entry_points(group="kvcore")}
    check(found >= BUILT_IN, f"entry points {sorted(found)} lack {sorted(BUILT_IN - found)}")
    registry = kvcore.load_registry()
    loaded = {plugin.name for plugin in registry.plugins}
    check(loaded >= BUILT_IN, f"the registry loaded {sorted(loaded)}")
    plan = kvcore.plan("gemma-3-27b", memory="8GiB", max_model_len=4096)
    manager = kvcore.KVCacheManager(plan.kv_cache_config, plan.max_model_len)
    check(manager.backend == "native", f"the wheel's manager runs the {manager.backend} backend")
    request = kvcore.Request("r", prompt_token_ids=list(range(100)))
    hit, num_hit = manager.get_computed_blocks(request)
    blocks = manager.allocate_slots(request, request.num_tokens - num_hit, num_hit, hit)
    check(blocks is not None and num_hit == 0, "the first request got no blocks")
    manager.free(request)


def check_executor() -> None:
    """A tiny model runs through the cache and matches the uncached model."""
    from kvcore._cli.main import main

    status = main(["simulate", "tiny-gemma", "--execute", "--memory", "64MiB",
                   "--max-model-len", "4096", "--block-size", "16", "--limit", "3"])
    check(status == 0, f"kvcore simulate tiny-gemma --execute exited with {status}")


def check_sdist(sdist: Path) -> None:
    """The source distribution carries the licence, the changelog and the plugins."""
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    for wanted in ("LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml", "setup.py",
                   "kvcore/_native_module.c", "kvcore/_native.c", "kvcore/_native_core.h",
                   "kvcore/_native_hash.c",
                   "kvcore/_digest_table.c", "kvcore/_digest_table.h",
                   "kvcore/_value_queue.c", "kvcore/_value_queue.h",
                   *(f"plugins/{name}/__init__.py" for name in BUILT_IN)):
        check(wanted in names, f"{wanted} missing from {sdist.name}")


def check_wheel_file(wheel: Path) -> None:
    """The wheel holds no tests, docs or benchmarks (only the two packages), and the C modules."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/", 1)[0] for name in names}
    extra = {t for t in tops if not t.endswith(".dist-info")} - {"kvcore", "kvcore_plugins"}
    check(not extra, f"the wheel ships more than kvcore and kvcore_plugins: {sorted(extra)}")
    compiled = [n for n in names if n.startswith("kvcore/_native.") and n.endswith(".so")]
    check(len(compiled) == 1, f"the wheel holds {compiled} for the native backend, not one module")
    hashing = [n for n in names if n.startswith("kvcore/_native_hash.") and n.endswith(".so")]
    check(len(hashing) == 1, f"the wheel holds {hashing} for the compiled hashing, not one module")


def main(argv: list[str]) -> int:
    """Run every check; print one line per passed group."""
    sdist, wheel, version = Path(argv[0]), Path(argv[1]), argv[2]
    for name, run in (
        ("installed from the wheel, one version", lambda: check_installed(version)),
        ("plugins, a plan and a manager", check_plugins_and_a_plan),
        ("the reference executor", check_executor),
        ("the sdist's files", lambda: check_sdist(sdist)),
        ("the wheel's files", lambda: check_wheel_file(wheel)),
    ):
        run()
        print(f"wheel smoke test: {name}: ok")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
