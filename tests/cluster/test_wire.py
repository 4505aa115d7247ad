"""KV events on the wire: vLLM 0.14's msgspec format, kvcore's trailing fields."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import kvcore
from kvcore.cluster import EventBatch, EventFormatError, decode_batch, encode_batch
from kvcore.cluster._wire import merge_removals

# Recorded once with vLLM 0.14's own classes (benchmarks/vllm_event_wire.py --write).
VLLM_BATCH = Path(__file__).parent / "data" / "vllm-0.14-batch.msgpack"
DIGEST = bytes(range(32))


def events(group: int = 0, kind: str | None = None) -> list:
    return [
        kvcore.events.BlockStored(
            block_hashes=[11, 12],
            parent_block_hash=None,
            token_ids=[1, 2, 3, 4],
            block_size=2,
            group_idx=group,
            kind=kind,
        ),
        kvcore.events.BlockStored(
            block_hashes=[DIGEST],
            parent_block_hash=12,
            token_ids=[5, 6],
            block_size=2,
            lora_id=7,
            lora_name="adapter",
            group_idx=group,
            kind=kind,
        ),
        kvcore.events.BlockRemoved(block_hashes=[11, 12], group_idx=group),
        kvcore.events.AllBlocksCleared(),
    ]


def test_a_vllm_batch_decodes_into_kvcore_events_of_group_0():
    batch = decode_batch(VLLM_BATCH.read_bytes())
    assert batch == EventBatch(1700000000.25, events(), 3)


def test_kvcore_events_are_vllm_arrays_plus_trailing_fields():
    # By hand from vLLM 0.14's field order: BlockStored is [tag, block_hashes,
    # parent_block_hash, token_ids, block_size, lora_id, medium, lora_name],
    # then kvcore's extra_keys, group_idx, kv_cache_spec_kind, sliding window.
    ours = msgspec.msgpack.decode(encode_batch(EventBatch(1700000000.25, events(1, "mamba"), 3)))
    recorded = msgspec.msgpack.decode(VLLM_BATCH.read_bytes())
    assert ours[0] == recorded[0] == 1700000000.25
    assert ours[2] == recorded[2] == 3
    stored, _, removed, cleared = ours[1]
    vllm_fields = ["BlockStored", [11, 12], None, [1, 2, 3, 4], 2, None, "GPU", None]
    assert stored == [*vllm_fields, None, 1, "mamba", None]
    assert removed == ["BlockRemoved", [11, 12], "GPU", 1]
    assert cleared == ["AllBlocksCleared"]
    for mine, theirs in zip(ours[1], recorded[1], strict=True):
        assert mine[: len(theirs)] == theirs


def test_round_trip_keeps_group_and_kind():
    batch = EventBatch(2.5, events(2, "sliding_window"))
    assert decode_batch(encode_batch(batch)) == batch


def test_garbage_is_refused_with_a_reason():
    with pytest.raises(EventFormatError, match="not a KV event batch in vLLM's format"):
        decode_batch(b"\x93\x01\x02")
    with pytest.raises(EventFormatError):
        decode_batch(msgspec.msgpack.encode([1.0, [["BlockEvicted", [1]]]]))


def test_runs_of_removals_merge_in_order():
    r = kvcore.events.BlockRemoved
    stored = events()[0]
    merged = merge_removals(
        [
            r(block_hashes=[1]),
            r(block_hashes=[2]),
            r(block_hashes=[3], group_idx=1),
            stored,
            r(block_hashes=[4]),
            r(block_hashes=[5]),
        ]
    )
    assert merged == [
        r(block_hashes=[1, 2]),
        r(block_hashes=[3], group_idx=1),
        stored,
        r(block_hashes=[4, 5]),
    ]
