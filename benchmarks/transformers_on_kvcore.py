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

Usage::

    python benchmarks/transformers_on_kvcore.py [--prompt 256] [--new 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import positive_int, print_load

from kvcore.integrations.transformers import PagedModelCache, generate, tiny_model
from kvcore.specs import cdiv

MODELS = ("gemma3", "qwen3-next")
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


def memory_row(name: str, prompt_len: int, new: int) -> str:
    model = tiny_model(name, dtype=torch.float32)
    prompt = torch.randint(0, 128, (prompt_len,), generator=torch.Generator().manual_seed(0))
    out = model.generate(
        prompt[None], max_new_tokens=new, min_new_tokens=new, do_sample=False,
        return_dict_in_generate=True,
    )
    hf = default_cache_bytes(out.cache)
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
    full = keep_all_bytes(paged, prompt_len + new)
    return (
        f"{name:<11} {peak / 1024:>10.1f} {hf / 1024:>14.1f} {full / 1024:>16.1f}"
        f" {hf / peak:>12.2f}x {full / peak:>12.2f}x"
    )


def time_once(fn: object) -> float:
    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


def speed_rows(name: str, prompt_len: int, new: int, rounds: int) -> list[str]:
    model = tiny_model(name, dtype=torch.float32)
    rows = []
    for batch in (1, 8):
        g = torch.Generator().manual_seed(batch)
        prompts = [torch.randint(0, 128, (prompt_len,), generator=g).tolist() for _ in range(batch)]
        paged = PagedModelCache.for_model(
            model, memory="64MiB", block_size=BLOCK_SIZE, max_num_batched_tokens=256,
            enable_caching=False,
        )

        def ours(prompts: list[list[int]] = prompts, paged: PagedModelCache = paged) -> None:
            generate(model, prompts, max_new_tokens=new, cache=paged, max_num_batched_tokens=256)

        def theirs(prompts: list[list[int]] = prompts) -> None:
            model.generate(
                torch.tensor(prompts), max_new_tokens=new, min_new_tokens=new, do_sample=False
            )

        timings: dict[str, list[float]] = {"kvcore": [], "transformers": []}
        for index in range(rounds):
            order = [("kvcore", ours), ("transformers", theirs)]
            for label, fn in order[index % 2 :] + order[: index % 2]:
                with torch.no_grad():
                    timings[label].append(time_once(fn))
        tokens = batch * new
        rate = {k: tokens / statistics.median(v) for k, v in timings.items()}
        spread = {k: f"{tokens / max(v):.0f}-{tokens / min(v):.0f}" for k, v in timings.items()}
        rows.append(
            f"{name:<11} {batch:>5} {rate['kvcore']:>10.0f} ({spread['kvcore']:>9})"
            f" {rate['transformers']:>10.0f} ({spread['transformers']:>9})"
            f" {rate['kvcore'] / rate['transformers']:>8.2f}x"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=positive_int, default=256, help="prompt tokens")
    parser.add_argument("--new", type=positive_int, default=32, help="generated tokens")
    parser.add_argument("--rounds", type=positive_int, default=3, help="timed rounds")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"memory held by one request of {args.prompt} + {args.new} tokens (KiB, float32)")
    print(f"{'model':<11} {'kvcore':>10} {'default cache':>14} {'keep-all paged':>16}"
          f" {'default/kv':>13} {'keep-all/kv':>13}")
    for name in MODELS:
        print(memory_row(name, args.prompt, args.new))
    print()
    print(f"generated tokens per second, {args.prompt}-token prompts, {args.new} new tokens,"
          f" median of {args.rounds} rounds (min-max)")
    print(f"{'model':<11} {'batch':>5} {'kvcore':>22} {'transformers':>22} {'ratio':>9}")
    for name in MODELS:
        for row in speed_rows(name, args.prompt, args.new, args.rounds):
            print(row)
    print_load()


if __name__ == "__main__":
    main()
