"""Where the native backend's time goes, by layer, on the allocation replay (py-spy).

The op sequence of ``bench_allocation.py`` (Mooncake prompts, block size 16,
an aged pool; see ``_replay.py``) is replayed on the native backend, many
times over, under the sampling profiler py-spy with native frames. Each
operation runs through a marker function (lookup, admission, decode, free),
so every sample names the operation it fell in; the sample's innermost
kvcore frame names the layer:

``compiled pool``
    the native core's C (reference counts, free queue, digest map, loops);
``compiled hashing``
    the block hashes in C (``kvcore/_native_hash.c`` and OpenSSL);
``pool, Python part``
    the pool's own Python: the native pool's methods and what they inherit
    from the Python pool (transactions, the caching step's bookkeeping);
``manager layers``
    the engine-facing ``KVCacheManager``, the coordinator, each group's
    manager (the plugin interface) and the hit rule: Python by design, so
    that a plugin's manager stays a Python class;
``request``
    the request object (appending tokens, its hash list);
``replay``
    the replay's own call into kvcore (no kvcore frame below the marker);
``garbage collection``
    CPython's cyclic collector, started by whichever allocation crosses its
    threshold (counted apart: it is no layer's work; the replay keeps every
    result, so most of what it traverses is the replay's).

The shares are of samples, so of time, and do not depend on the machine's
load the way absolute times do. The last column bounds what compiling more
of the pool could give: with the pool (both its parts) and the hashing at no
cost, an operation would still take the manager layers', the request's and
the replay's share of its time, so its ratio to vLLM 0.14 could at most be
the recorded ratio (``benchmarks/results/bench-allocation.json``, the native
backend with SHA-256 against vLLM's ``sha256``) divided by that share. The
collector's share counts as remaining: it runs whatever the pool is compiled
to.

Run::

    python benchmarks/profile_layers.py            # needs py-spy (pip install py-spy)
    python benchmarks/profile_layers.py --record   # writes benchmarks/results/profile-layers.json
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from _common import REPO, positive_int, print_load
from _record import Recorder, percent, table
from _replay import CATEGORIES, add_trace_options, trace_option_flags

from kvcore._backend import native_available

#: The layers, in the order the table shows them; the first three are the pool's.
LAYERS = (
    "compiled pool",
    "compiled hashing",
    "pool, Python part",
    "manager layers",
    "request",
    "replay",
    "garbage collection",
)
#: The layers that stay whatever more of the pool is compiled.
REMAINING = ("manager layers", "request", "replay", "garbage collection")
_MARKS = """\
def lookup(call): return call()
def admission(call): return call()
def decode(call): return call()
def free(call): return call()
"""
_POOL_PYTHON = re.compile(r"kvcore/(_native_pool|_block_pool|_blocks|_free_ages)\.py$|_eviction/")
_MARKER = re.compile(r"^(\w+) \(_callgrind_marks\.py")
_FILE = re.compile(r"\(([^():]+)(?::\d+)?\)$")


def layer_of(frames: list[str]) -> str:
    """The layer of one sample: that of its innermost kvcore frame (frames outermost first)."""
    if any("gc_collect" in frame for frame in frames):
        return "garbage collection"
    for frame in reversed(frames):
        found = _FILE.search(frame)
        path = found.group(1) if found else ""
        if "_native_hash.c" in path or "libcrypto" in path:
            return "compiled hashing"
        if path.startswith("kvcore/") and path.endswith((".c", ".h")):
            return "compiled pool"
        if not path.endswith(".py") or not ("kvcore" in path or path.startswith("plugins/")):
            continue  # (the built-in plugins' managers lie in plugins/)
        if _POOL_PYTHON.search(path):
            return "pool, Python part"
        if path.endswith("kvcore/_request.py"):
            return "request"
        return "manager layers"
    return "replay"


def tally(lines: Iterable[str]) -> dict[str, Counter[str]]:
    """Samples per operation and layer, from py-spy's raw output (``stack count`` lines).

    Samples outside every marker (the replay's setup) are left out.
    """
    counts: dict[str, Counter[str]] = {category: Counter() for category in CATEGORIES}
    for line in lines:
        stack, _, number = line.rstrip("\n").rpartition(" ")
        if not stack or not number.isdigit():
            continue
        frames = stack.split(";")
        for position, frame in enumerate(frames):
            marker = _MARKER.match(frame)
            if marker and marker.group(1) in counts:
                counts[marker.group(1)][layer_of(frames[position + 1 :])] += int(number)
                break
    return counts


def recorded_ratios() -> dict[str, float]:
    """vLLM 0.14 / kvcore per operation, native backend with SHA-256, from the allocation record."""
    record = json.loads((REPO / "benchmarks/results/bench-allocation.json").read_text())
    figures = record["figures"]
    return {
        category: float(figures[f"ratio.native.sha256.{category}"].rstrip("x×"))
        for category in CATEGORIES
    }


def child(args: argparse.Namespace) -> None:
    """Replay the op sequence ``args.repeats`` times on the native backend, inside the markers."""
    import bench_native

    args.backend = "native"
    for _ in range(args.repeats):
        bench_native.replay_marked(args)


def profile(args: argparse.Namespace, spy: str) -> dict[str, Counter[str]]:
    """Run the child under py-spy; the samples per operation and layer."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        (folder / "_callgrind_marks.py").write_text(_MARKS)
        raw = folder / "samples.txt"
        command = [
            spy, "record", "--native", "--rate", str(args.rate), "--format", "raw",
            "--output", str(raw), "--", sys.executable, __file__, "--child",
            "--marks", str(folder), "--repeats", str(args.repeats), *trace_option_flags(args),
        ]  # fmt: skip
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return tally(raw.read_text().splitlines())


def report(counts: dict[str, Counter[str]], recorder: Recorder) -> None:
    ratios = recorded_ratios()
    header = ["operation", "samples", *LAYERS, "vLLM / kvcore (recorded)", "at most, pool free"]
    rows = []
    for category in CATEGORIES:
        samples = sum(counts[category].values())
        if not samples:
            continue
        shares = {layer: counts[category][layer] / samples for layer in LAYERS}
        remaining = sum(shares[layer] for layer in REMAINING)
        bound = ratios[category] / remaining if remaining else float("inf")
        recorder.figure(f"{category}.remaining", percent(remaining))
        recorder.figure(f"{category}.bound", f"{bound:.1f}x")
        rows.append(
            [
                category,
                samples,
                *(percent(shares[layer]) for layer in LAYERS),
                f"{ratios[category]:.2f}x",
                f"{bound:.1f}x",
            ]
        )
    recorder.tables["layers"] = table(
        "Native backend, allocation replay: share of each operation's samples by layer",
        header,
        rows,
    )
    recorder.data["samples"] = {category: dict(counts[category]) for category in CATEGORIES}
    print("  " + " | ".join(header))
    for row in rows:
        print("  " + " | ".join(str(cell) for cell in row))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_options(parser)
    parser.add_argument("--rate", type=positive_int, default=1000, help="samples per second")
    parser.add_argument("--repeats", type=positive_int, default=20, help="replays profiled")
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/profile-layers.json"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--marks", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        sys.path.insert(0, args.marks)
        child(args)
        return 0
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        print("profile_layers needs py-spy (pip install py-spy)")
        return 2
    if not native_available():
        print("the native backend is not built (pip install -e . with a C compiler)")
        return 2
    recorder = Recorder("profile-layers", enabled=args.record)
    with recorder.section("table"):
        print(
            f"The allocation replay on the native backend, {args.repeats} times under py-spy "
            f"({args.rate} samples/s, native frames)"
        )
        print_load()
        report(profile(args, spy), recorder)
    recorder.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
