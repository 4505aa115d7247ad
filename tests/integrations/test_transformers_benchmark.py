"""What ``benchmarks/transformers_on_kvcore.py`` measures and records, on hand-worked cases.

The tiny models (``tiny_model``): 2 KV heads of 8 dimensions per layer, so one
token of one layer is 2 (key, value) x 2 x 8 float32 values = 128 bytes and a
16-token block of one layer 2,048 bytes. The Gemma-3-like model has one
sliding-window layer (window 8) and one full-attention layer, one KV cache
group each.
"""

from __future__ import annotations

import pytest
import torch
from benchmark_scripts import load_benchmark

pytest.importorskip("transformers")

from kvcore.integrations.transformers import PagedModelCache, generate, tiny_model

TOKEN = 2 * 2 * 8 * 4  # bytes of one token of one layer
BLOCK = 16 * TOKEN


bench = load_benchmark("transformers_on_kvcore")


def test_memory_of_one_request_worked_out_by_hand():
    # 40 + 4 tokens: the last step computes position 42 (the 4th token is never fed).
    held = bench.memory_bytes("gemma3", 40, 4)
    # kvcore: the full layer's 3 blocks (tokens 0-47) and the window's last
    # block (positions 35-42 lie in block 2).
    assert held["kvcore"] == 3 * BLOCK + 1 * BLOCK
    # transformers: the 43 tokens fed in the full layer, window - 1 = 7 in the sliding one.
    assert held["default"] == 43 * TOKEN + 7 * TOKEN
    # keep-all: cdiv(44, 16) = 3 blocks in each of the 2 groups.
    assert held["keep_all"] == 2 * 3 * BLOCK


def test_a_memory_row_is_kib_and_ratios_to_kvcore():
    row = bench.memory_cells("M", {"kvcore": 71_680, "default": 70_400, "keep_all": 139_264})
    assert row == ["M", "70.0", "68.8", "136.0", "0.98×", "1.94×"]


def test_a_speed_row_is_median_rates_spreads_ratio_and_forwards():
    measured = {
        "kvcore": {"forwards": 5, "seconds": [0.1, 0.2, 0.4]},
        "transformers": {"forwards": 4, "seconds": [0.05, 0.1, 0.1]},
    }
    # 2 prompts x 4 tokens = 8 tokens: kvcore 8 / 0.2 s, transformers 8 / 0.1 s.
    row = bench.speed_cells("M", 2, 4, measured)
    assert row == ["M", "2", "40 (20–80)", "80 (80–160)", "0.50×", "5 / 4"]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # One 40-token prefill forward (within the 256-token budget), 3 decode forwards.
        ("gemma3", 4),
        # A forward ends at each 16-token state block boundary: 16 + 16 + 8, then 3 decodes.
        ("qwen3-next", 6),
    ],
)
def test_forwards_counted_for_one_request(name: str, expected: int):
    model = tiny_model(name, dtype=torch.float32)
    prompt = list(range(40))
    paged = PagedModelCache.for_model(
        model, memory="4MiB", block_size=16, max_num_batched_tokens=256
    )
    counted = bench.count_forwards(
        model, lambda: generate(model, [prompt], max_new_tokens=4, cache=paged)
    )
    assert counted == expected
    theirs = bench.count_forwards(
        model,
        lambda: model.generate(
            torch.tensor([prompt]), max_new_tokens=4, min_new_tokens=4, do_sample=False
        ),
    )
    assert theirs == 4  # one prefill forward, then one per further token
