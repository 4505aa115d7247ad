"""A transformers model on kvcore's cache: the memory it holds and its generation speed.

For a sliding-window model (Gemma-3-like: window and full layers) and a
linear-attention hybrid (Qwen3-Next-like), both tiny and built from configs
with seeded weights (``kvcore.integrations.transformers.tiny_model``):

* **memory** held for one request of ``--prompt`` + ``--new`` tokens at its
  last step: kvcore's blocks in use (whole blocks, as allocated), the
  tensors transformers' default cache holds after ``model.generate()``, and
  the blocks of a paged cache keeping every block of every group (windows
  allocated for every token, as ``hybrid=False`` plans them, and a state for
  every block: a paged cache without per-type managers);
* **speed**: generated tokens per second of
  ``kvcore.integrations.transformers.generate`` against ``model.generate()``
  (greedy, default cache), for batch 1 and batch 8 (eight prompts of the
  same length, so transformers needs no padding). Candidates alternate in
  rounds; the median and the spread are printed.

Each implementation also runs once untimed first (a warm-up, which counts
its model forwards). With ``--record`` the tables and the ratios are written
to ``benchmarks/results/transformers-on-kvcore.json``, which the how-to
"Run a transformers model on kvcore" renders.

Usage::

    python benchmarks/transformers_on_kvcore.py [--prompt 256] [--new 32] [--rounds 3] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import transformers
from _common import positive_int, print_load
from _record import Recorder, ratio, table

from kvcore.integrations.transformers import PagedModelCache, generate, tiny_model
from kvcore.specs import cdiv

#: The tiny models measured, and their names in the tables.
MODELS = {"gemma3": "Gemma-3-like", "qwen3-next": "Qwen3-Next-like"}
BLOCK_SIZE = 16


def held_bytes(paged: PagedModelCache, request_id: str) -> int:
    """Bytes of the blocks a request holds (non-null table entries), over every layer."""
    tables = paged.manager.get_block_ids(request_id)
    config = paged.plan.kv_cache_config
    total = 0
    for group_id, group in enumerate(config.kv_cache_groups):
        blocks = sum(1 for block in tables[group_id] if block)
        total += blocks * sum(spec.page_size_bytes for _, spec in group.items())
    return total


def default_cache_bytes(cache: object) -> int:
    """Bytes of the tensors a transformers cache holds."""
    total = 0
    for layer in getattr(cache, "layers", []):
        for name in ("keys", "values"):
            tensor = getattr(layer, name, None)
            if isinstance(tensor, torch.Tensor):
                total += tensor.numel() * tensor.element_size()
        for states in (getattr(layer, "conv_states", {}), getattr(layer, "recurrent_states", {})):
            for tensor in states.values():
                if isinstance(tensor, torch.Tensor):
                    total += tensor.numel() * tensor.element_size()
    return total


def keep_all_bytes(paged: PagedModelCache, tokens: int) -> int:
    """Bytes of a paged cache that keeps a block of every group for every block of a request.

    What a paged cache without per-type managers holds (a window allocated for
    every token, as ``hybrid=False`` plans it; a state checkpoint kept for
    every block): kvcore's plan, with nothing freed.
    """
    total = 0
    for group in paged.plan.kv_cache_config.kv_cache_groups:
        blocks = cdiv(tokens, group.kv_cache_spec.block_size)
        total += blocks * sum(spec.page_size_bytes for _, spec in group.items())
    return total


def memory_bytes(name: str, prompt_len: int, new: int) -> dict[str, int]:
    """Bytes one request of ``prompt_len`` + ``new`` tokens holds at its last step.

    ``kvcore``: the blocks it holds just before it is freed; ``default``:
    transformers' default cache after ``model.generate()``; ``keep_all``:
    :func:`keep_all_bytes`.
    """
    model = tiny_model(name, dtype=torch.float32)
    prompt = torch.randint(0, 128, (prompt_len,), generator=torch.Generator().manual_seed(0))
    out = model.generate(
        prompt[None],
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        return_dict_in_generate=True,
    )
    paged = PagedModelCache.for_model(
        model, memory="64MiB", block_size=BLOCK_SIZE, max_num_batched_tokens=256
    )
    peak = 0
    original_free = paged.manager.free

    def free_and_measure(request: object) -> None:
        nonlocal peak
        peak = max(peak, held_bytes(paged, request.request_id))  # type: ignore[attr-defined]
        original_free(request)  # type: ignore[arg-type]

    paged.manager.free = free_and_measure  # type: ignore[method-assign]
    generate(model, [prompt.tolist()], max_new_tokens=new, cache=paged)
    return {
        "kvcore": peak,
        "default": default_cache_bytes(out.cache),
        "keep_all": keep_all_bytes(paged, prompt_len + new),
    }


def memory_cells(label: str, held: dict[str, int]) -> list[str]:
    """A row of the memory table: KiB held, then the others' bytes over kvcore's."""
    kib = [f"{held[key] / 1024:.1f}" for key in ("kvcore", "default", "keep_all")]
    return [
        label,
        *kib,
        ratio(held["default"] / held["kvcore"]),
        ratio(held["keep_all"] / held["kvcore"]),
    ]


def time_once(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def count_forwards(model: torch.nn.Module, fn: Callable[[], object]) -> int:
    """Forward passes of ``model`` during one (untimed) call of ``fn``."""
    calls = [0]

    def hook(*_: object) -> None:
        calls[0] += 1

    handle = model.register_forward_hook(hook)
    try:
        fn()
    finally:
        handle.remove()
    return calls[0]


def speed_measurement(
    model: Any, prompts: list[list[int]], new: int, rounds: int
) -> dict[str, Any]:
    """Seconds per round and forwards of kvcore's ``generate`` and ``model.generate()``.

    Both generate ``new`` tokens for each prompt, greedily; one warm-up run
    each (counting forwards), then ``rounds`` timed rounds, alternating which
    goes first.
    """
    paged = PagedModelCache.for_model(
        model,
        memory="64MiB",
        block_size=BLOCK_SIZE,
        max_num_batched_tokens=256,
        enable_caching=False,
    )

    def ours() -> None:
        generate(model, prompts, max_new_tokens=new, cache=paged, max_num_batched_tokens=256)

    def theirs() -> None:
        model.generate(
            torch.tensor(prompts), max_new_tokens=new, min_new_tokens=new, do_sample=False
        )

    candidates = {"kvcore": ours, "transformers": theirs}
    measured: dict[str, Any] = {}
    with torch.no_grad():
        for label, fn in candidates.items():
            measured[label] = {"forwards": count_forwards(model, fn), "seconds": []}
        order = list(candidates)
        for index in range(rounds):
            for label in order[index % 2 :] + order[: index % 2]:
                measured[label]["seconds"].append(time_once(candidates[label]))
    return measured


def rate_cell(tokens: int, seconds: list[float]) -> str:
    """Tokens per second, median (min–max) over the rounds."""
    median = tokens / statistics.median(seconds)
    return f"{median:.0f} ({tokens / max(seconds):.0f}–{tokens / min(seconds):.0f})"


def speed_cells(label: str, batch: int, new: int, measured: dict[str, Any]) -> list[str]:
    """A row of the speed table (rates, kvcore's rate over transformers', forwards)."""
    tokens = batch * new
    ours, theirs = measured["kvcore"], measured["transformers"]
    speedup = statistics.median(theirs["seconds"]) / statistics.median(ours["seconds"])
    return [
        label,
        str(batch),
        rate_cell(tokens, ours["seconds"]),
        rate_cell(tokens, theirs["seconds"]),
        ratio(speedup),
        f"{ours['forwards']} / {theirs['forwards']}",
    ]


def print_table(recorded: dict[str, Any]) -> None:
    """A recorded table as plain text."""
    rows = [recorded["header"], *recorded["rows"]]
    widths = [max(len(row[col]) for row in rows) for col in range(len(rows[0]))]
    print(recorded["title"])
    for row in rows:
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        print("  ".join(cells).rstrip())


MEMORY_HEADER = (
    "model",
    "kvcore (KiB)",
    "default cache (KiB)",
    "keep-all paged (KiB)",
    "default / kvcore",
    "keep-all / kvcore",
)
SPEED_HEADER = (
    "model",
    "batch",
    "kvcore generate",
    "model.generate",
    "ratio",
    "forwards (kvcore / transformers)",
)


def measure_memory(args: argparse.Namespace, recorder: Recorder) -> None:
    """The memory table, and each model's ratios as figures."""
    rows = []
    for name, label in MODELS.items():
        held = memory_bytes(name, args.prompt, args.new)
        recorder.data.setdefault("memory_bytes", {})[name] = held
        rows.append(memory_cells(label, held))
        recorder.figure(f"memory.{name}.default", rows[-1][4])
        recorder.figure(f"memory.{name}.keep-all", rows[-1][5])
    title = (
        f"Memory held by one request of {args.prompt} + {args.new} tokens at its last"
        " step (float32)"
    )
    recorder.tables["memory"] = table(title, MEMORY_HEADER, rows)
    print_table(recorder.tables["memory"])


def measure_speed(args: argparse.Namespace, recorder: Recorder) -> None:
    """The speed table, and each model's and batch's ratio as a figure."""
    rows = []
    for name, label in MODELS.items():
        model = tiny_model(name, dtype=torch.float32)
        for batch in (1, 8):
            g = torch.Generator().manual_seed(batch)
            prompts = [
                torch.randint(0, 128, (args.prompt,), generator=g).tolist() for _ in range(batch)
            ]
            measured = speed_measurement(model, prompts, args.new, args.rounds)
            recorder.data.setdefault("speed", {})[f"{name}.{batch}"] = measured
            rows.append(speed_cells(label, batch, args.new, measured))
            recorder.figure(f"speed.{name}.{batch}", rows[-1][4])
    title = (
        f"Generated tokens per second, {args.prompt}-token prompts, {args.new} new"
        f" tokens: median (min–max) of {args.rounds} rounds"
    )
    recorder.tables["speed"] = table(title, SPEED_HEADER, rows)
    print_table(recorder.tables["speed"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=positive_int, default=256, help="prompt tokens")
    parser.add_argument("--new", type=positive_int, default=32, help="generated tokens")
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed rounds")
    parser.add_argument(
        "--record",
        action="store_true",
        help="write benchmarks/results/transformers-on-kvcore.json",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    recorder = Recorder("transformers-on-kvcore", enabled=args.record)
    print_load()
    measure_memory(args, recorder)
    print()
    measure_speed(args, recorder)
    recorder.figure(
        "environment",
        f"torch {torch.__version__}, transformers {transformers.__version__},"
        f" {torch.get_num_threads()} torch thread",
    )
    print_load()
    recorder.write()


if __name__ == "__main__":
    main()
