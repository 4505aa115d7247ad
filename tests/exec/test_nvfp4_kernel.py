"""The NVFP4 codec and reference kernel, against values worked out by hand and a brute force.

The brute force shares no code with the codec: it enumerates every finite
E4M3 value (from the bit layout: 4 exponent bits of bias 7, 3 mantissa bits,
subnormals at exponent 0, 0x7F the NaN) and every E2M1 value, and picks the
nearest, ties to the even bit pattern.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from exechelpers import run_engine, tiny_plan
from hypothesis import given, settings

import kvcore
from kvcore.executor import reference_kernels, tiny_model_path
from kvcore.reference import CacheLayer, StepInput, attend
from kvcore_plugins.nvfp4_attention import NVFP4AttentionSpec
from kvcore_plugins.nvfp4_attention.codec import decode, encode, quantize
from kvcore_plugins.nvfp4_attention.kernel import NVFP4AttentionKernel

F64 = torch.float64


def e4m3_values() -> list[tuple[int, float]]:
    """(bit pattern, value) of every finite non-negative E4M3 number."""
    values = []
    for pattern in range(0x7F):  # 0x7F is NaN
        exponent, mantissa = pattern >> 3, pattern & 7
        if exponent == 0:
            values.append((pattern, mantissa / 8 * 2.0**-6))
        else:
            values.append((pattern, (1 + mantissa / 8) * 2.0 ** (exponent - 7)))
    return values


E2M1 = [
    (code, sign * mag)
    for code, (sign, mag) in enumerate(
        [(1, m) for m in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
        + [(-1, m) for m in (0, 0.5, 1, 1.5, 2, 3, 4, 6)]
    )
    if code != 8
]  # code 8 is -0: never produced


def nearest(candidates: list[tuple[int, float]], target: float) -> tuple[int, float]:
    """The candidate nearest ``target``; a tie goes to the even pattern (its lowest bit 0)."""
    return min(candidates, key=lambda c: (abs(c[1] - target), c[0] & 1))


def brute_force_group(values: list[float]) -> tuple[float, list[int], list[float]]:
    """Scale, codes and decoded values of one group of 16, the slow way."""
    amax = max(abs(v) for v in values)
    _, scale = nearest(e4m3_values(), min(amax / 6, 448.0))
    if scale == 0:
        return 0.0, [0] * 16, [0.0] * 16
    chosen = [nearest(E2M1, v / scale) for v in values]
    return scale, [code for code, _ in chosen], [value * scale for _, value in chosen]


def test_one_group_by_hand():
    """amax 6: scale exactly 1, so each value is rounded on E2M1's own grid.

    Ties go to the even code: 0.25 → 0 (code 0, not 0.5's 1), 0.75 → 1 (code 2),
    1.25 → 1, 1.75 → 2 (code 4), 2.5 → 2, 3.5 → 4 (code 6), 5 → 4; -0.1 → +0.
    """
    row = [6, -3, 0.5, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, -0.1, -6, 0, 1.1, -4.4, 2.9]
    codes, scales = encode(torch.tensor(row, dtype=F64)[None])
    assert scales.to(F64).tolist() == [[1.0]]
    expected = [7, 8 | 5, 1, 0, 2, 2, 4, 4, 6, 6, 0, 8 | 7, 0, 2, 8 | 6, 5]
    # Two codes a byte, the first in the low four bits.
    assert codes.tolist() == [[expected[i] | expected[i + 1] << 4 for i in range(0, 16, 2)]]
    assert decode(codes, scales).tolist() == [[6, -3, 0.5, 0, 1, 1, 2, 2, 4, 4, 0, -6, 0, 1, -4, 3]]


def test_the_scale_is_rounded_to_e4m3_and_values_saturate():
    """amax 3.3: 3.3 / 6 = 0.55 rounds to 0.5625 (E4M3 steps by 1/16 in [0.5, 1)).

    3.3 / 0.5625 = 5.87 → 6 (saturated to the largest code): decodes to 3.375.
    """
    row = torch.tensor([3.3] + [0.0] * 15, dtype=F64)
    codes, scales = encode(row[None])
    assert scales.to(F64).item() == 0.5625
    assert decode(codes, scales)[0, 0].item() == 6 * 0.5625


def test_a_zero_group_and_an_underflowing_one_decode_to_zeros():
    """The smallest E4M3 number is 2⁻⁹; amax / 6 below half of it rounds the scale to 0."""
    tiny = 2.0**-9 * 6 / 2 * 0.99
    rows = torch.tensor([[0.0] * 16, [tiny] + [0.0] * 15], dtype=F64)
    codes, scales = encode(rows)
    assert scales.to(F64).tolist() == [[0.0], [0.0]]
    assert codes.eq(0).all()
    assert decode(codes, scales).eq(0).all()


def test_large_values_use_the_largest_scale():
    """Scale 448 (E4M3's largest): 10,000 saturates to 6 × 448 = 2,688; 300 / 448 = 0.67
    rounds to 0.5 (224); 1 / 448 rounds to 0: a group keeps its large values only.
    """
    row = torch.tensor([10_000.0, -2688.0, 300.0] + [1.0] * 13, dtype=F64)
    codes, scales = encode(row[None])
    assert scales.to(F64).item() == 448.0
    assert decode(codes, scales)[0, :4].tolist() == [2688.0, -2688.0, 224.0, 0.0]


finite = st.floats(min_value=-3000, max_value=3000, allow_nan=False, allow_subnormal=False)
small = st.floats(min_value=-0.05, max_value=0.05, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(finite, small), min_size=32, max_size=32))
def test_the_codec_equals_the_brute_force(values):
    codes, scales = encode(torch.tensor(values, dtype=F64).reshape(1, 32))
    decoded = decode(codes, scales)[0].tolist()
    unpacked = [(b >> shift) & 0xF for b in codes[0].tolist() for shift in (0, 4)]
    for group in range(2):
        scale, group_codes, group_values = brute_force_group(values[16 * group : 16 * group + 16])
        assert scales[0, group].to(F64).item() == scale
        assert unpacked[16 * group : 16 * group + 16] == group_codes
        assert decoded[16 * group : 16 * group + 16] == group_values


def spec(block_size=4, heads=1, head_size=16):
    return NVFP4AttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype="nvfp4"
    )


def nvfp4_layer(layer_spec, num_blocks=8):
    codes_part, scales_part = layer_spec.page_parts()
    views = (
        torch.full((num_blocks, *codes_part.shape), 0xFF, dtype=torch.uint8),
        torch.full((num_blocks, *scales_part.shape), math.nan, dtype=torch.float8_e4m3fn),
    )
    return CacheLayer(name="layer", spec=layer_spec, views=views, group_id=0, manager=None)


def test_the_dense_path_is_attention_over_the_brute_force_quantized_rows():
    layer_spec = spec(heads=2)
    kernel = reference_kernels(kvcore.load_registry())[NVFP4AttentionSpec]
    gen = torch.Generator().manual_seed(11)
    params = kernel.init_params(layer_spec, 8, gen)
    x = torch.randn(9, 8, generator=gen, dtype=F64)
    rows = torch.stack([kernel.token_row(layer_spec, params, xt) for xt in x])  # (9, 2, 32)
    flat = rows.reshape(-1, 16).tolist()
    quantized = torch.tensor([brute_force_group(g)[2] for g in flat], dtype=F64).reshape(9, 2, 32)
    assert not torch.equal(quantized, rows)  # NVFP4 is lossy: the check has teeth
    expected = []
    for t in range(9):
        query = (x[t] @ params["wq"]).reshape(2, 16)
        out = attend(query, quantized[: t + 1, :, :16], quantized[: t + 1, :, 16:])
        expected.append(out.reshape(-1) @ params["wo"])
    got = kernel.dense(layer_spec, params, x, None)
    assert torch.allclose(got, torch.stack(expected), rtol=0, atol=1e-12)


def test_the_paged_path_stores_codes_and_equals_the_dense_one_bit_for_bit():
    layer_spec = spec()
    kernel = reference_kernels(kvcore.load_registry())[NVFP4AttentionSpec]
    gen = torch.Generator().manual_seed(5)
    params = kernel.init_params(layer_spec, 8, gen)
    x = torch.randn(11, 8, generator=gen, dtype=F64)
    layer = nvfp4_layer(layer_spec)
    table = (6, 2, 7)
    outputs = []
    for start, stop in ((0, 6), (6, 7), (7, 11)):  # a prefill chunk, a decode, a chunk
        step = StepInput(request_id="r", start=start, x=x[start:stop], block_table=table)
        carry = kernel.begin(layer_spec, params, layer, step)
        outputs.append(kernel.finish(layer_spec, params, layer, step, carry))
    assert torch.equal(torch.cat(outputs), kernel.dense(layer_spec, params, x, None))
    # The page holds the codes and scales of the rows, block 6 positions 0-3 first.
    rows = torch.stack([kernel.token_row(layer_spec, params, xt) for xt in x])
    codes, scales = encode(rows)
    assert torch.equal(layer.views[0][6], codes[0:4])
    assert torch.equal(layer.views[1][2].view(torch.uint8), scales[4:8].view(torch.uint8))
    assert torch.equal(layer.views[0][7, :3], codes[8:11])
    assert layer.views[0][7, 3].eq(0xFF).all()  # position 11 was never written
    assert torch.equal(quantize(rows), decode(codes, scales))


@pytest.mark.parametrize("layout", ["layer_outer", "block_outer"])
def test_the_tiny_model_plans_nvfp4_beside_bf16_sliding_windows(layout):
    """2 heads of 16: NVFP4 36 bytes per token, bf16 2 × 32 × 2 = 128.

    At 4-token blocks the NVFP4 page is 144 bytes, padded to the bf16 page of
    512 in the layer-outer layout (512 / 144 is not whole).
    """
    plan = kvcore.plan(
        tiny_model_path("tiny-nvfp4"), block_size=4, memory="1MiB", layout=layout, pool="shared"
    )
    groups = plan.kv_cache_config.kv_cache_groups
    assert [g.kv_cache_spec.kind for g in groups] == ["sliding_window", "nvfp4_attention"]
    sliding, nvfp4 = (g.kv_cache_spec for g in groups)
    assert (sliding.dtype, sliding.page_size_bytes) == ("bfloat16", 512)
    assert nvfp4.real_page_size_bytes == 144
    assert nvfp4.page_size_bytes == (512 if layout == "layer_outer" else 144)


def test_the_executor_catches_a_dense_path_that_does_not_quantize(monkeypatch):
    """The check has teeth: the oracle computing with unquantized rows disagrees."""
    plan = tiny_plan("tiny-nvfp4", pressure=1.2)
    _, _, exact = run_engine(plan, num_requests=4)
    assert exact.ok
    monkeypatch.setattr(NVFP4AttentionKernel, "stored", lambda self, spec, rows: rows)
    _, _, broken = run_engine(plan, num_requests=4)
    assert broken.num_mismatches > 0
