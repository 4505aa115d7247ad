"""KV events on the wire: vLLM 0.14's msgspec format, kvcore's trailing fields."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

import kvcore
from kvcore.cluster import EventBatch, EventFormatError, decode_batch, encode_batch
from kvcore.cluster._wire import merge_removals, split_events

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


def test_a_step_too_big_for_one_batch_is_cut_in_order():
    r, s = kvcore.events.BlockRemoved, kvcore.events.BlockStored
    step = [
        r(block_hashes=[7, 8, 9]),
        kvcore.events.AllBlocksCleared(),
        s(block_hashes=range(5), parent_block_hash=None, token_ids=range(10), block_size=2),
    ]
    # At most 2 hashes (and 2 events) a run; a cut store keeps its chain:
    # each part's parent is the last hash before it, its tokens its blocks'.
    assert split_events(step, 2) == [
        [r(block_hashes=[7, 8])],
        [r(block_hashes=[9]), kvcore.events.AllBlocksCleared()],
        [s(block_hashes=[0, 1], parent_block_hash=None, token_ids=[0, 1, 2, 3], block_size=2)],
        [s(block_hashes=[2, 3], parent_block_hash=1, token_ids=[4, 5, 6, 7], block_size=2)],
        [s(block_hashes=[4], parent_block_hash=3, token_ids=[8, 9], block_size=2)],
    ]
    assert split_events([], 2) == [[]]
    assert split_events(step, 100) == [step]


class Vllm014Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM 0.14's ``EventBatch``, field for field (vllm/distributed/kv_events.py)."""

    ts: float
    events: list
    data_parallel_rank: int | None = None


def test_kvcores_extension_field_is_skipped_by_vllm_and_read_by_kvcore():
    batch = EventBatch(1.0, events(1, "mamba"), 3, incarnation="abc", num_blocks=64)
    payload = encode_batch(batch)
    assert msgspec.msgpack.decode(payload)[3] == {"incarnation": "abc", "num_blocks": 64}
    theirs = msgspec.msgpack.Decoder(Vllm014Batch).decode(payload)
    assert (theirs.ts, theirs.data_parallel_rank, len(theirs.events)) == (1.0, 3, 4)
    assert decode_batch(payload) == batch
    # Without a rank, nil takes its place; another producer's fourth element is ignored.
    assert msgspec.msgpack.decode(encode_batch(EventBatch(1.0, [], incarnation="x")))[2:] == [
        None,
        {"incarnation": "x"},
    ]
    assert decode_batch(msgspec.msgpack.encode([1.0, [], None, 7])) == EventBatch(1.0, [])
    with pytest.raises(EventFormatError, match="num_blocks must be an integer"):
        decode_batch(msgspec.msgpack.encode([1.0, [], None, {"num_blocks": "many"}]))
