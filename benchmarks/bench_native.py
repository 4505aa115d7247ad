"""The Python and the native backend on the allocation replay, in instructions (callgrind).

The op sequence of ``bench_allocation.py`` (Mooncake prompts, block size 16,
an aged pool; see ``_replay.py``) is replayed once per backend under
``valgrind --tool=callgrind``. Instructions are counted only inside the
operations: each timed operation runs through a marker function of a small C
module compiled at run time (``_callgrind_marks.c``), and callgrind collects
only inside the markers, one per category (lookup, admission, decode, free).
Instruction counts do not depend on the machine's load, so the two backends
compare without timing noise on a shared machine. Every result (hit lengths,
block ids, refusals) of the two replays must be identical.

Run::

    python benchmarks/bench_native.py            # needs valgrind and a C compiler
    python benchmarks/bench_native.py --record   # writes benchmarks/results/bench-native.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from _common import REPO
from _record import Recorder, ratio, table
from _replay import (
    ADMIT,
    CATEGORIES,
    DECODE,
    LOOKUP,
    NEW,
    PREEMPT,
    add_trace_options,
    freeze_heap,
    make_kvcore,
    record_ops,
    trace_option_flags,
    trace_workload,
)

import kvcore
from kvcore._backend import native_available
from kvcore_plugins.full_attention import FullAttentionSpec

BACKENDS = ("python", "native")
MARKS = Path(__file__).with_name("_callgrind_marks.c")


class _Case:
    """Full attention, block size as asked: the case of ``bench_allocation.py``."""

    name = "full_attention"
    enable_caching = True
    num_encoder_tokens = 0

    @staticmethod
    def kvcore_specs(block_size: int) -> list[FullAttentionSpec]:
        return [
            FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype="float16")
        ]


def build_marks(folder: Path) -> Path:
    """Compile the marker module into ``folder``; return the folder."""
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = folder / f"_callgrind_marks{suffix}"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [*compiler, "-shared", "-fPIC", "-O1", f"-I{include}", str(MARKS), "-o", str(target)],
        check=True,
    )
    return folder


# -- the child: one replay under callgrind ----------------------------------------------------


def replay_marked(args: argparse.Namespace) -> dict[str, Any]:
    """Record the op sequence, replay it through ``args.backend`` inside the markers."""
    sys.path.insert(0, args.marks)
    import _callgrind_marks as marks  # type: ignore[import-not-found]

    rec = record_ops(
        _Case,
        *trace_workload(args),
        args.num_blocks,
        args.block_size,
        args.max_running,
    )
    manager = make_kvcore(_Case, rec.num_blocks, rec.block_size, "sha256", backend=args.backend)
    assert manager.backend == args.backend, manager.backend
    requests: dict[int, Any] = {}
    hits: dict[int, Any] = {}
    out: list[Any] = []

    def direct(call: Any) -> Any:
        return call()

    for position, op in enumerate(rec.ops):
        timed = position >= rec.timed_from
        if position == rec.timed_from:
            freeze_heap()
        kind, index = op[0], op[1]
        if kind == NEW:
            mark = marks.lookup if timed else direct
            requests[index] = mark(lambda i=index: kvcore.Request(str(i), rec.prompts[i]))
        elif kind == LOOKUP:
            mark = marks.lookup if timed else direct
            hit = hits[index] = mark(lambda r=requests[index]: manager.get_computed_blocks(r))
            out.append(repr((hit[1], [list(g) for g in hit[0].blocks])))
        elif kind == ADMIT:
            request = requests[index]
            hit_blocks, num_hit = hits.pop(index)
            mark = marks.admission if timed else direct
            blocks = mark(
                lambda r=request, n=op[2], k=num_hit, h=hit_blocks: manager.allocate_slots(
                    r, n, k, h
                )
            )
            if blocks is not None:
                request.num_computed_tokens = request.num_tokens
            out.append(None if blocks is None else repr([list(g) for g in blocks.blocks]))
        elif kind == DECODE:
            request = requests[index]

            def decode(request: Any = request, token: int = op[2]) -> Any:
                request.append_output_token_ids(token)
                return manager.allocate_slots(request, 1)

            blocks = (marks.decode if timed else direct)(decode)
            if blocks is None:
                request._all_token_ids.pop()
            else:
                request.num_computed_tokens += 1
            out.append(None if blocks is None else repr([list(g) for g in blocks.blocks]))
        else:
            request = requests[index]
            (marks.free if timed else direct)(lambda r=request: manager.free(r))
            if kind == PREEMPT:
                request.num_computed_tokens = 0
    gc.unfreeze()
    return {"results": out, "counts": rec.counts(), "ops": len(rec.ops) - rec.timed_from}


# -- the parent: both backends, then the table --------------------------------------------------


def inclusive_counts(profile: Path) -> dict[str, int]:
    """Instructions inside each marker (callgrind_annotate's inclusive counts)."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(profile)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts: dict[str, int] = {}
    for line in text.splitlines():
        found = re.match(r"\s*([\d,]+)\s.*\bkvbench_(\w+)\b", line)
        if found:
            counts[found.group(2)] = counts.get(found.group(2), 0) + int(
                found.group(1).replace(",", "")
            )
    return counts


def run_backend(args: argparse.Namespace, backend: str, folder: Path) -> tuple[dict[str, int], Any]:
    profile = folder / f"callgrind.{backend}.out"
    result = folder / f"result.{backend}.json"
    toggles = [f"--toggle-collect=kvbench_{c}" for c in CATEGORIES]
    command = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        *toggles,
        f"--callgrind-out-file={profile}",
        sys.executable,
        __file__,
        "--child",
        "--backend",
        backend,
        "--marks",
        str(folder),
        "--out",
        str(result),
        *trace_option_flags(args),
    ]
    subprocess.run(command, check=True, stderr=subprocess.DEVNULL)
    return inclusive_counts(profile), json.loads(result.read_text())


def compare(args: argparse.Namespace, recorder: Recorder) -> bool:
    with tempfile.TemporaryDirectory() as name:
        folder = build_marks(Path(name))
        measured = {backend: run_backend(args, backend, folder) for backend in BACKENDS}
    (py_counts, py_run), (native_counts, native_run) = measured["python"], measured["native"]
    same = py_run["results"] == native_run["results"]
    ops = py_run["counts"]
    print(
        f"{py_run['ops']} timed ops after the ageing prefix ({args.requests} Mooncake requests, "
        f"block size {args.block_size}, {args.num_blocks} blocks, sha256): "
        + ", ".join(f"{n} {c}" for c, n in zip(CATEGORIES, ops, strict=True))
    )
    header = ["operation", "ops", "python, instructions/op", "native, instructions/op", "ratio"]
    rows = []
    totals = [0, 0]
    for category, count in zip(CATEGORIES, ops, strict=True):
        python_ir, native_ir = py_counts.get(category, 0), native_counts.get(category, 0)
        totals[0] += python_ir
        totals[1] += native_ir
        fraction = python_ir / native_ir if native_ir else float("nan")
        rows.append(
            [
                category,
                count,
                f"{python_ir / count:,.0f}",
                f"{native_ir / count:,.0f}",
                ratio(fraction),
            ]
        )
        recorder.figure(f"ratio.{category}", ratio(fraction))
        recorder.figure(f"ir.python.{category}", f"{python_ir:,}")
        recorder.figure(f"ir.native.{category}", f"{native_ir:,}")
    rows.append(
        [
            "all",
            sum(ops),
            f"{totals[0] / sum(ops):,.0f}",
            f"{totals[1] / sum(ops):,.0f}",
            ratio(totals[0] / totals[1]),
        ]
    )
    recorder.figure("ratio.all", ratio(totals[0] / totals[1]))
    recorder.figure("ir.python.all", f"{totals[0]:,}")
    recorder.figure("ir.native.all", f"{totals[1]:,}")
    recorder.tables["instructions"] = table(
        "Instructions per operation (callgrind), Python and native backends", header, rows
    )
    recorder.data["instructions"] = {"python": py_counts, "native": native_counts}
    for row in [header, *rows]:
        print("  " + "".join(f"{cell!s:>26}" for cell in row))
    print(f"  identical results (hit lengths, block ids, refusals) on both backends: {same}")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_trace_options(parser)
    parser.add_argument(
        "--record", action="store_true", help="write benchmarks/results/bench-native.json"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--marks", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.out).write_text(json.dumps(replay_marked(args)))
        return 0
    missing = [tool for tool in ("valgrind", "callgrind_annotate") if shutil.which(tool) is None]
    if missing:
        print(f"bench_native needs {' and '.join(missing)} (apt-get install valgrind)")
        return 2
    if not native_available():
        print("the native backend is not built (pip install -e . with a C compiler)")
        return 2
    os.chdir(REPO)
    recorder = Recorder("bench-native", enabled=args.record)
    with recorder.section("replay"):
        same = compare(args, recorder)
    if same:
        recorder.write()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
