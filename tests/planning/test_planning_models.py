"""Every shipped model planned for 80 GiB: groups, block and page sizes, blocks, waste.

Four models are worked out by hand in the docstrings below; the table pins
the others from the same rules (the reference rule, 16-token blocks, 8192
batched tokens per step, ``max_model_len`` the model's own, fitted to memory
when it does not fit).
"""

from __future__ import annotations

import json

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
    p = plan("qwen3-next-80b")
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
    p = plan("nvfp4-hybrid-8b")
    assert shape(p) == [("sliding_window", 8)] * 3 + [("nvfp4_attention", 8)]
    assert [g.page_sizes for g in p.groups] == [(65_536,)] * 4
    assert p.groups[3].real_page_sizes == (18_432,)
    assert (p.bytes_per_block, p.num_blocks, p.blocks_per_request) == (524_288, 163_840, 9923)
    assert p.wasted_bytes_per_request == 3_087_007_744
    assert round(p.waste_fraction, 4) == 0.5934
    assert p.notes == ("pages padded to the common page size: 8 nvfp4_attention layers",)
    outer = plan("nvfp4-hybrid-8b", layout="block_outer")
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


@pytest.mark.parametrize("model", sorted(TABLE))
def test_shipped_model_table(model):
    groups, block, page, blocks, length, waste = TABLE[model]
    p = plan(model)
    assert shape(p) == groups
    assert {g.block_size for g in p.groups} == {block}
    assert {g.page_sizes for g in p.groups} == {(page,)}
    assert p.num_blocks == blocks
    assert p.max_model_len == length
    assert p.wasted_bytes_per_request == waste


def test_every_shipped_model_is_pinned():
    hand = {"llama-3-8b", "gpt-oss-20b", "gemma-3-27b", "qwen3-next-80b", "nvfp4-hybrid-8b"}
    assert set(kvcore.list_models()) == hand | set(TABLE)


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
    with pytest.raises(kvcore.InsufficientMemoryError):
        plan("llama-4-scout", max_model_len=p.max_model_len + 16)


def test_jamba_aligns_attention_blocks_to_the_mamba_state():
    """Mamba-1 state: (3, 8,192) + (8,192, 16) bf16 = 311,296 bytes; attention 4,096 B/token.

    Block = 16 × ceil(311,296 / 65,536) = 80 tokens, page 327,680: states
    padded by 16,384 bytes, 4 per block in each of 7 state groups.
    """
    p = plan("jamba-v0.1")
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


@pytest.mark.parametrize("model", ["gpt-oss-20b", "gemma-3-27b", "llama-3-8b", "jamba-v0.1"])
def test_planned_config_drives_the_manager(model):
    p = plan(model, memory="4GiB", max_model_len=2048)
    manager = kvcore.KVCacheManager(
        p.kv_cache_config, p.max_model_len, registry=registry(), enable_caching=True
    )
    request = kvcore.Request(request_id="r", prompt_token_ids=list(range(1000)))
    blocks = manager.allocate_slots(request, 1000)
    assert blocks is not None
    assert len(blocks.get_block_ids()) == len(p.groups)


def test_plan_json_and_summary(capsys):
    p = kvcore.print_plan("whisper-large-v3", memory="8GiB", registry=registry())
    out = capsys.readouterr().out
    assert out.startswith(
        "whisper-large-v3: 64 cache layers (32 full_attention, 32 cross_attention)"
    )
    assert "max concurrency: " in out
    data = json.loads(json.dumps(p.to_dict()))
    assert data["num_blocks"] == p.num_blocks == 8 * GIB // 2_621_440
    assert data["groups"][1]["kind"] == "cross_attention"
    assert data["kv_cache_config"]["kv_cache_tensors"][0]["layer_stride"] == 81_920 * p.num_blocks
