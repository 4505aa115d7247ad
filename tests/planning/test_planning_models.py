"""Every shipped model planned for 80 GiB, shared pool: groups, blocks, pages, waste.

Four models are worked out by hand in the docstrings below; the table pins
the others, and each of its rows is derived again by arithmetic the tests
evaluate, from the model's shipped config and the same rules (the reference
grouping rule, 16-token blocks, 8192 batched tokens per step,
``max_model_len`` the model's own, fitted to memory when it does not fit).
These are the reference's plans, so the models whose layers' pages differ
(which ``pool="auto"`` plans in a two-level pool) are planned with
``pool="shared"``; the two-level plans are in ``test_planning_two_level``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from planning_helpers import GIB, registry

import kvcore

MEMORY = 80 * GIB  # 85,899,345,920 bytes


def plan(model: str, **options) -> kvcore.KVCachePlan:
    options.setdefault("memory", MEMORY)
    return kvcore.plan(model, registry=registry(), **options)


def shape(p: kvcore.KVCachePlan) -> list[tuple[str, int]]:
    return [(g.kind, g.num_layers) for g in p.groups]


def test_llama_3_8b_by_hand():
    """32 full-attention layers, 8 KV heads of 128, bfloat16.

    Bytes per token and layer: 8 × (128 + 128) × 2 = 4,096; page (16 tokens)
    65,536. One group of 32 layers: a block is 32 × 65,536 = 2,097,152 bytes
    (2 MiB), and 80 GiB / 2 MiB = 40,960 blocks exactly. A request of 8,192
    tokens holds 8,192 / 16 = 512 blocks, so 40,960 / 512 = 80 requests fit
    (655,360 tokens), and one needs (512 + 1 null) × 2 MiB = 1,075,838,976
    bytes. Nothing is padded.
    """
    p = plan("llama-3-8b")
    assert shape(p) == [("full_attention", 32)]
    assert (p.groups[0].block_size, p.groups[0].page_sizes) == (16, (65_536,))
    assert (p.bytes_per_block, p.num_blocks) == (2_097_152, 40_960)
    assert (p.max_model_len, p.blocks_per_request) == (8192, 512)
    assert p.memory_needed_bytes == 1_075_838_976
    assert (p.max_concurrency, p.token_capacity) == (80.0, 655_360)
    assert (p.wasted_bytes, p.padding_slots) == (0, 0)


def test_gpt_oss_20b_by_hand():
    """24 layers alternating sliding window (128 tokens) and full; 8 KV heads of 64, bf16.

    Bytes per token and layer: 8 × 128 × 2 = 2,048; page 32,768. Buckets of
    12 and 12 layers: 12 < 1.5 × 12, so the group size is 12 and there are 2
    groups; a block is 12 × 32,768 = 393,216 bytes and 85,899,345,920 /
    393,216 = 218,453.3 → 218,453 blocks. At 131,072 tokens a request holds
    131,072 / 16 = 8,192 full-attention blocks and, with 8,192 tokens per
    step, ceil(min(127 + 8,192, 131,072) / 16) + 1 = 520 + 1 = 521
    sliding-window blocks: 8,713 in all, so 218,453 / 8,713 = 25.07 requests.
    No padding.
    """
    p = plan("gpt-oss-20b")
    assert shape(p) == [("sliding_window", 12), ("full_attention", 12)]
    assert {g.page_sizes for g in p.groups} == {(32_768,)}
    assert (p.bytes_per_block, p.num_blocks) == (393_216, 218_453)
    assert [g.pages_per_request for g in p.groups] == [521, 8192]
    assert round(p.max_concurrency, 4) == 25.0721
    assert p.wasted_bytes == 0


def test_gemma_3_27b_by_hand():
    """62 layers, every 6th full (10), 52 sliding window (1024); 16 KV heads of 128, bf16.

    Bytes per token and layer: 16 × 256 × 2 = 8,192; page 131,072. Buckets:
    52 sliding (first seen) and 10 full; 52 ≥ 1.5 × 10, so the group size is
    10: the sliding bucket splits into ceil(52 / 10) = 6 strided groups of
    9, 9, 9, 9, 8, 8 layers (8 padding slots), the full bucket is one group.
    A block is 10 × 131,072 = 1,310,720 bytes; 80 GiB / 1,310,720 = 65,536
    blocks exactly. At 131,072 tokens: 8,192 full blocks, and per sliding
    group ceil(min(1,023 + 8,192, 131,072) / 16) + 1 = 576 + 1 = 577, so
    8,192 + 6 × 577 = 11,654 blocks per request and 65,536 / 11,654 = 5.62
    requests. Waste: 8 padding slots × 577 blocks × 131,072 bytes =
    605,028,352 bytes per request, of 11,654 × 1,310,720 = 15,275,130,880:
    3.96 %.
    """
    p = plan("gemma-3-27b")
    assert shape(p) == [("sliding_window", n) for n in (9, 9, 9, 9, 8, 8)] + [
        ("full_attention", 10)
    ]
    assert p.groups[0].layer_names[:3] == (
        "model.layers.0.self_attn",
        "model.layers.7.self_attn",
        "model.layers.14.self_attn",
    )
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (1_310_720, 65_536, 11_654)
    assert p.padding_slots == 8
    assert p.wasted_bytes_per_request == 605_028_352
    assert round(p.waste_fraction, 5) == 0.03961
    assert round(p.max_concurrency, 4) == 5.6235


def test_qwen3_next_80b_by_hand():
    """48 layers: every 4th full attention (12), 36 gated-delta-net states.

    Attention: 2 KV heads of 256, bf16: 2 × 512 × 2 = 2,048 bytes per token.
    State: convolution (3, 2 × 16 × 128 + 32 × 128 = 8,192) and recurrence
    (32, 128, 128): (24,576 + 524,288) × 2 = 1,097,728 bytes. The attention
    block grows to 16 × ceil(1,097,728 / (16 × 2,048)) = 16 × 34 = 544 tokens
    (page 544 × 2,048 = 1,114,112 bytes) and the state is padded by 16,384
    bytes to that page. Group size 12: 3 state groups and 1 full group; a
    block is 12 × 1,114,112 = 13,369,344 bytes → 6,425 blocks. At 262,144
    tokens: ceil(262,144 / 544) = 482 full blocks; a state group in align
    mode holds ceil(8,192 / 544) + 1 = 17: 533 in all. Waste: 3 groups × 17
    blocks × 12 layers × 16,384 bytes = 10,027,008 bytes per request.
    """
    p = plan("qwen3-next-80b", pool="shared")
    assert shape(p) == [("mamba", 12)] * 3 + [("full_attention", 12)]
    assert {g.block_size for g in p.groups} == {544}
    assert {g.page_sizes for g in p.groups} == {(1_114_112,)}
    assert p.groups[0].real_page_sizes == (1_097_728,)
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (13_369_344, 6425, 533)
    assert p.wasted_bytes_per_request == 10_027_008


def test_nvfp4_hybrid_8b_by_hand():
    """32 layers, every 4th NVFP4 full attention (8), 24 bf16 sliding window (1024); 8 × 128.

    bf16 page: 16 × 8 × 256 × 2 = 65,536 bytes. NVFP4: per token and head 128
    bytes of 4-bit values and 16 one-byte scales, 8 × 144 = 1,152 bytes per
    token, a page of 18,432; 65,536 is not a multiple of it, so it is padded
    by 47,104 bytes. Buckets of 24 and 8: group size 8, 3 sliding groups and
    1 NVFP4 group; a block is 8 × 65,536 = 524,288 bytes → 80 GiB / 512 KiB =
    163,840 blocks. At 131,072 tokens: 8,192 NVFP4 blocks and per sliding
    group ceil((1,023 + 8,192) / 16) + 1 = 577, 9,923 in all. Waste:
    8,192 × 8 × 47,104 = 3,087,007,744 bytes per request, of 9,923 ×
    524,288 = 5,202,509,824: 59.34 %.

    Block-outer: one sliding group of 24 layers (a block of 24 × 65,536 =
    1,572,864 bytes) and one NVFP4 group using 8 × 18,432 = 147,456 of each
    block: 54,613 blocks, 577 + 8,192 = 8,769 per request, and 8,192 ×
    1,425,408 = 11,676,942,336 of 8,769 × 1,572,864 = 13,792,444,416 bytes
    wasted: 84.66 %.
    """
    p = plan("nvfp4-hybrid-8b", pool="shared")
    assert shape(p) == [("sliding_window", 8)] * 3 + [("nvfp4_attention", 8)]
    assert [g.page_sizes for g in p.groups] == [(65_536,)] * 4
    assert p.groups[3].real_page_sizes == (18_432,)
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (524_288, 163_840, 9923)
    assert p.wasted_bytes_per_request == 3_087_007_744
    assert round(p.waste_fraction, 4) == 0.5934
    assert p.notes == ("pages padded to the common page size: 8 nvfp4_attention layers",)
    outer = plan("nvfp4-hybrid-8b", layout="block_outer", pool="shared")
    assert shape(outer) == [("sliding_window", 24), ("nvfp4_attention", 8)]
    assert (outer.bytes_per_block, outer.num_blocks, outer.blocks_per_request) == (
        1_572_864,
        54_613,
        8769,
    )
    assert outer.wasted_bytes_per_request == 11_676_942_336
    assert round(outer.waste_fraction, 4) == 0.8466


# model: (groups, block size, page, blocks at 80 GiB, max_model_len, wasted bytes per request)
TABLE = {
    "deepseek-v3": ([("mla", 61)], 16, 18_432, 76_398, 163_840, 0),
    "gemma-2-9b": ([("sliding_window", 21), ("full_attention", 21)], 16, 131_072, 31_207, 8192, 0),
    "gpt-oss-120b": (
        [("sliding_window", 18), ("full_attention", 18)],
        16,
        32_768,
        145_635,
        131_072,
        0,
    ),
    "jamba-v0.1": (
        [("mamba", 4)] * 7 + [("full_attention", 4)],
        80,
        327_680,
        65_536,
        262_144,
        47_710_208,
    ),
    "llama-4-scout": (
        [("chunked_local", 12)] * 3 + [("full_attention", 12)],
        16,
        65_536,
        109_226,
        1_698_448,
        0,
    ),
    "mistral-7b": ([("sliding_window", 32)], 16, 65_536, 40_960, 32_768, 0),
    "whisper-large-v3": (
        [("full_attention", 32), ("cross_attention", 32)],
        16,
        81_920,
        32_768,
        448,
        0,
    ),
}


# -- the table's rows worked out from the shipped configs -------------------------------
#
# Each function below reads the model's config json (the file the planner
# ships, read here with json alone) and derives its row with the reference
# rules: 16-token blocks (raised for a recurrent state), keys and values per
# token and layer, the grouping rule of the reference engine, 80 GiB floor-
# divided by a block of every layer of one group, and max_model_len the
# model's own when one such request and the null block fit.

MODELS = Path(kvcore.__file__).parent / "_planning" / "models"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2}
BLOCK = 16  # tokens per block
STEP = 8192  # batched tokens per step


def model_config(model: str) -> dict[str, Any]:
    return json.loads((MODELS / f"{model}.json").read_text())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def group_size(*bucket_sizes: int) -> int:
    """Layers per group (the reference rule): the largest bucket if under 1.5 x the smallest."""
    small, large = min(bucket_sizes), max(bucket_sizes)
    return large if large < 1.5 * small else small


def kv_bytes(heads: int, head_size: int, dtype: str) -> int:
    """Bytes of one token's keys and values in one layer."""
    return heads * 2 * head_size * DTYPE_BYTES[dtype]


def window_blocks(window: int, length: int) -> int:
    """Blocks a sliding-window layer holds: window - 1 + one step (capped), + 1 partial."""
    return cdiv(min(window - 1 + STEP, length), BLOCK) + 1


def derive_deepseek_v3() -> tuple[object, ...]:
    """61 MLA layers, a 512 + 64 latent row, bf16: page 16 x 576 x 2 = 18,432.

    Block 61 x 18,432 = 1,124,352 bytes: 76,398 blocks; 163,840 tokens need
    10,240.
    """
    c = model_config("deepseek-v3")
    # MLA: one latent row per token, kv_lora_rank + the rope part of the key.
    page = BLOCK * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * DTYPE_BYTES[c["torch_dtype"]]
    layers = c["num_hidden_layers"]  # the MTP layer has no cache here
    blocks = MEMORY // (layers * page)
    length = c["max_position_embeddings"]
    assert cdiv(length, BLOCK) + 1 <= blocks  # fits: the model's own length
    return [("mla", layers)], BLOCK, page, blocks, length, 0


def derive_gemma_2_9b() -> tuple[object, ...]:
    """42 layers, half sliding (4,096); 8 KV heads of 256, bf16: page 131,072.

    Buckets 21 and 21: groups of 21, a block of 2,752,512 bytes, 31,207
    blocks; 8,192 tokens need 512 full and 513 sliding blocks.
    """
    c = model_config("gemma-2-9b")
    page = BLOCK * kv_bytes(c["num_key_value_heads"], c["head_dim"], c["torch_dtype"])
    half = c["num_hidden_layers"] // 2  # sliding and full layers alternate
    size = group_size(half, half)
    blocks = MEMORY // (size * page)
    length = c["max_position_embeddings"]
    per_request = cdiv(length, BLOCK) + window_blocks(c["sliding_window"], length)
    assert per_request + 1 <= blocks
    return [("sliding_window", half), ("full_attention", half)], BLOCK, page, blocks, length, 0


def derive_gpt_oss_120b() -> tuple[object, ...]:
    """36 layers, 18 sliding (128) and 18 full; 8 KV heads of 64, bf16: page 32,768.

    Groups of 18, a block of 589,824 bytes: 145,635 blocks; 131,072 tokens
    need 8,192 full and 521 sliding blocks.
    """
    c = model_config("gpt-oss-120b")
    page = BLOCK * kv_bytes(c["num_key_value_heads"], c["head_dim"], c["torch_dtype"])
    sliding = c["layer_types"].count("sliding_attention")
    full = c["layer_types"].count("full_attention")
    size = group_size(sliding, full)
    blocks = MEMORY // (size * page)
    length = c["max_position_embeddings"]
    per_request = cdiv(length, BLOCK) + window_blocks(c["sliding_window"], length)
    assert per_request + 1 <= blocks
    groups = [("sliding_window", sliding), ("full_attention", full)]
    return groups, BLOCK, page, blocks, length, 0


def derive_jamba_v0_1() -> tuple[object, ...]:
    """4 attention layers (every 8th from 4) and 28 Mamba-1 layers; bf16.

    Attention 8 x 2 x 128 x 2 = 4,096 bytes per token; state (3 x 8,192 +
    8,192 x 16) x 2 = 311,296 bytes, so blocks of 16 x ceil(4.75) = 80
    tokens, page 327,680, each state padded by 16,384. Groups of 4 (28 >=
    1.5 x 4): 7 state groups, a block of 1,310,720 bytes, 65,536 blocks.
    262,144 tokens need 3,277 full blocks and 7 x (ceil(8,192 / 80) + 1) =
    7 x 104 state blocks; waste 7 x 104 x 4 x 16,384 = 47,710,208 bytes.
    """
    c = model_config("jamba-v0.1")
    layers = range(c["num_hidden_layers"])
    attention = sum(1 for i in layers if i % c["attn_layer_period"] == c["attn_layer_offset"])
    mamba = len(layers) - attention
    dtype = DTYPE_BYTES[c["torch_dtype"]]
    per_token = kv_bytes(
        c["num_key_value_heads"], c["hidden_size"] // c["num_attention_heads"], c["torch_dtype"]
    )
    # Mamba-1 state: convolution (d_conv - 1, d_inner) and SSM (d_inner, d_state).
    inner = c["mamba_expand"] * c["hidden_size"]
    state = ((c["mamba_d_conv"] - 1) * inner + inner * c["mamba_d_state"]) * dtype
    block = BLOCK * cdiv(state, BLOCK * per_token)  # the attention page holds a state
    page = block * per_token
    size = group_size(mamba, attention)
    blocks = MEMORY // (size * page)
    length = c["max_position_embeddings"]
    # A state group holds the blocks one step spans plus the previous state.
    state_blocks = min(cdiv(STEP, block) + 1, cdiv(length, block))
    num_state_groups = mamba // size
    assert cdiv(length, block) + num_state_groups * state_blocks + 1 <= blocks
    waste = num_state_groups * state_blocks * size * (page - state)
    groups = [("mamba", size)] * num_state_groups + [("full_attention", attention)]
    return groups, block, page, blocks, length, waste


def derive_llama_4_scout() -> tuple[object, ...]:
    """48 layers, 12 global and 36 chunked (8,192); 8 KV heads of 128, bf16: page 65,536.

    Groups of 12: 3 chunked groups, a block of 786,432 bytes, 109,226 blocks.
    10,485,760 tokens would need 655,360 full blocks; the chunked groups hold
    ceil(16,384 / 16) = 1,024 each, leaving 109,226 - 1 - 3,072 = 106,153
    full blocks: 1,698,448 tokens.
    """
    c = model_config("llama-4-scout")
    t = c["text_config"]
    full = t["num_hidden_layers"] // 4  # every 4th layer is global, the rest chunked
    chunked = t["num_hidden_layers"] - full
    page = BLOCK * kv_bytes(t["num_key_value_heads"], t["head_dim"], c["torch_dtype"])
    size = group_size(chunked, full)
    blocks = MEMORY // (size * page)
    # A chunked group holds one chunk plus one step; the full group the rest.
    chunk_blocks = cdiv(t["attention_chunk_size"] + STEP, BLOCK)
    num_chunked_groups = chunked // size
    left = blocks - 1 - num_chunked_groups * chunk_blocks
    assert cdiv(t["max_position_embeddings"], BLOCK) > left  # 10M tokens do not fit
    groups = [("chunked_local", size)] * num_chunked_groups + [("full_attention", full)]
    return groups, BLOCK, page, blocks, left * BLOCK, 0


def derive_mistral_7b() -> tuple[object, ...]:
    """32 sliding layers (4,096); 8 KV heads of 4,096 / 32 = 128, bf16: page 65,536.

    One group, a block of 2,097,152 bytes: 40,960 blocks; 32,768 tokens need
    ceil(12,287 / 16) + 1 = 769.
    """
    c = model_config("mistral-7b")
    head_size = c["hidden_size"] // c["num_attention_heads"]
    page = BLOCK * kv_bytes(c["num_key_value_heads"], head_size, c["torch_dtype"])
    layers = c["num_hidden_layers"]
    blocks = MEMORY // (layers * page)
    length = c["max_position_embeddings"]
    assert window_blocks(c["sliding_window"], length) + 1 <= blocks
    return [("sliding_window", layers)], BLOCK, page, blocks, length, 0


def derive_whisper_large_v3() -> tuple[object, ...]:
    """32 decoder layers, self- and cross-attention; 20 heads of 64, fp16: page 81,920.

    Groups of 32, a block of 2,621,440 bytes: 32,768 blocks; 448 tokens need
    28 blocks and 1,500 encoder positions 94.
    """
    c = model_config("whisper-large-v3")
    # Decoder layers only: each has self-attention and cross-attention caches.
    heads = c["decoder_attention_heads"]
    page = BLOCK * kv_bytes(heads, c["d_model"] // heads, c["torch_dtype"])
    layers = c["decoder_layers"]
    size = group_size(layers, layers)
    blocks = MEMORY // (size * page)
    length = c["max_target_positions"]
    encoder_blocks = cdiv(c["max_source_positions"], BLOCK)
    assert cdiv(length, BLOCK) + encoder_blocks + 1 <= blocks
    groups = [("full_attention", layers), ("cross_attention", layers)]
    return groups, BLOCK, page, blocks, length, 0


DERIVATIONS = {
    "deepseek-v3": derive_deepseek_v3,
    "gemma-2-9b": derive_gemma_2_9b,
    "gpt-oss-120b": derive_gpt_oss_120b,
    "jamba-v0.1": derive_jamba_v0_1,
    "llama-4-scout": derive_llama_4_scout,
    "mistral-7b": derive_mistral_7b,
    "whisper-large-v3": derive_whisper_large_v3,
}


@pytest.mark.parametrize("model", sorted(TABLE))
def test_table_row_follows_from_the_shipped_config(model):
    assert DERIVATIONS[model]() == TABLE[model]


@pytest.mark.parametrize("model", sorted(TABLE))
def test_shipped_model_table(model):
    groups, block, page, blocks, length, waste = TABLE[model]
    p = plan(model, pool="shared")
    assert shape(p) == groups
    assert {g.block_size for g in p.groups} == {block}
    assert {g.page_sizes for g in p.groups} == {(page,)}
    assert p.num_blocks == blocks
    assert p.max_model_len == length
    assert p.wasted_bytes_per_request == waste


def test_every_shipped_model_is_pinned():
    hand = {"llama-3-8b", "gpt-oss-20b", "gemma-3-27b", "qwen3-next-80b", "nvfp4-hybrid-8b"}
    assert set(kvcore.planning.list_models()) == hand | set(TABLE)


def test_llama_4_scout_is_fitted_to_the_memory():
    """10M tokens do not fit: 109,226 blocks minus the null block leave 109,225.

    Three chunked groups hold ceil((8,192 + 8,192) / 16) = 1,024 blocks each,
    so the full group gets 109,225 - 3,072 = 106,153 blocks: 1,698,448 tokens.
    """
    p = plan("llama-4-scout")
    assert p.notes == (
        "max_model_len lowered from the model's 10485760 to 1698448 tokens, the longest "
        "request that fits",
    )
    assert p.model_max_len == 10_485_760
    assert p.max_model_len == 106_153 * 16
    with pytest.raises(kvcore.errors.InsufficientMemoryError):
        plan("llama-4-scout", max_model_len=p.max_model_len + 16)


def test_jamba_aligns_attention_blocks_to_the_mamba_state():
    """Mamba-1 state: (3, 8,192) + (8,192, 16) bf16 = 311,296 bytes; attention 4,096 B/token.

    Block = 16 × ceil(311,296 / 65,536) = 80 tokens, page 327,680: states
    padded by 16,384 bytes, 4 per block in each of 7 state groups.
    """
    p = plan("jamba-v0.1", pool="shared")
    assert p.groups[0].real_page_sizes == (311_296,)
    assert p.groups[0].padded_page_bytes_per_block == 4 * 16_384
    assert p.notes == (
        "attention block size raised from 16 to 80 tokens so that a page holds a 311296-byte "
        "recurrent state",
        "pages padded to the common page size: 28 mamba layers",
    )
    assert "note: pages padded to the common page size: 28 mamba layers" in p.summary()


def test_gcd_rule_reported_next_to_the_reference():
    p = plan("gemma-3-27b", group_size_rule="gcd")
    assert p.reference is not None
    assert p.reference.padding_slots == 8
    assert p.padding_slots == 3
    assert [g.num_layers for g in p.groups] == [5] * 8 + [4] * 3 + [5, 5]
    assert p.wasted_bytes_per_request < p.reference.wasted_bytes_per_request
    assert p.max_concurrency > p.reference.max_concurrency
    summary = p.summary()
    assert "  reference: 7 groups, 8 padding slots, 65536 blocks, max concurrency 5.62" in summary
    assert "  gcd:       13 groups, 3 padding slots, 131072 blocks, max concurrency 5.77" in summary
    data = p.to_dict()
    assert data["reference"]["padding_slots"] == 8


@pytest.mark.parametrize("pool", ["shared", "auto"])
@pytest.mark.parametrize(
    "model", ["gpt-oss-20b", "gemma-3-27b", "llama-3-8b", "jamba-v0.1", "qwen3-next-80b"]
)
def test_planned_config_drives_the_manager(model, pool):
    p = plan(model, memory="4GiB", max_model_len=2048, pool=pool)
    manager = kvcore.KVCacheManager(
        p.kv_cache_config, p.max_model_len, registry=registry(), enable_caching=True
    )
    request = kvcore.Request(request_id="r", prompt_token_ids=list(range(1000)))
    blocks = manager.allocate_slots(request, 1000)
    assert blocks is not None
    assert len(blocks.get_block_ids()) == len(p.groups)


def test_plan_json_and_summary(capsys):
    p = kvcore.planning.print_plan("whisper-large-v3", memory="8GiB", registry=registry())
    out = capsys.readouterr().out
    assert out.startswith(
        "whisper-large-v3: 64 cache layers (32 full_attention, 32 cross_attention)"
    )
    assert "max concurrency: " in out
    data = json.loads(json.dumps(p.to_dict()))
    assert data["num_blocks"] == p.num_blocks == 8 * GIB // 2_621_440
    assert data["groups"][1]["kind"] == "cross_attention"
    assert data["kv_cache_config"]["kv_cache_tensors"][0]["layer_stride"] == 81_920 * p.num_blocks
