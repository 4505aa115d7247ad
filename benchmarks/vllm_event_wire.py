"""Check kvcore's KV event wire format against vLLM 0.14's own msgspec classes.

Run it where vLLM imports (see the README's benchmarks section), with this
checkout first on the path::

    PYTHONPATH=. /tmp/vllm-venv/bin/python benchmarks/vllm_event_wire.py

It checks, both ways:

1. a batch built with vLLM's classes (int and bytes hashes, a LoRA adapter, a
   removal, a clear, a data-parallel rank) and encoded by vLLM's encoder
   decodes with kvcore into the same events (group 0, no kind);
2. the same batch encoded by kvcore (with its group and kind fields) decodes
   with vLLM's decoder into exactly vLLM's objects (the extension ignored),
   and re-encodes to kvcore's bytes minus the trailing fields;
3. ``--write`` also records vLLM's bytes as the suite's fixture
   (``tests/cluster/data/vllm-0.14-batch.msgpack``), which the tests decode
   without vLLM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

import kvcore
from kvcore.cluster._wire import EventBatch, decode_batch, encode_batch

FIXTURE = (
    Path(__file__).resolve().parents[1] / "tests" / "cluster" / "data" / "vllm-0.14-batch.msgpack"
)
DIGEST = bytes(range(32))


def vllm_batch() -> KVEventBatch:
    return KVEventBatch(
        ts=1700000000.25,
        events=[
            BlockStored(
                block_hashes=[11, 12],
                parent_block_hash=None,
                token_ids=[1, 2, 3, 4],
                block_size=2,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            ),
            BlockStored(
                block_hashes=[DIGEST],
                parent_block_hash=12,
                token_ids=[5, 6],
                block_size=2,
                lora_id=7,
                medium="GPU",
                lora_name="adapter",
            ),
            BlockRemoved(block_hashes=[11, 12], medium="GPU"),
            AllBlocksCleared(),
        ],
        data_parallel_rank=3,
    )


def kvcore_events(group: int, kind: str | None) -> list:
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


def main() -> int:
    vllm_bytes = msgspec.msgpack.encode(vllm_batch())
    # 1. vLLM -> kvcore
    decoded = decode_batch(vllm_bytes)
    assert decoded == EventBatch(1700000000.25, kvcore_events(0, None), 3), decoded
    # 2. kvcore (with the extension: trailing event fields, and the batch's
    # incarnation and pool after its rank) -> vLLM
    ours = encode_batch(
        EventBatch(
            1700000000.25,
            kvcore_events(1, "sliding_window"),
            3,
            incarnation="0123456789abcdef",
            num_blocks=4096,
        )
    )
    theirs = msgspec.msgpack.Decoder(KVEventBatch).decode(ours)
    assert theirs == vllm_batch(), theirs
    assert msgspec.msgpack.encode(theirs) == vllm_bytes
    assert decode_batch(ours).incarnation == "0123456789abcdef"
    # A rank of None is written as nil before the extension; vLLM reads None.
    no_rank = encode_batch(EventBatch(1.0, [], incarnation="x", num_blocks=8))
    assert msgspec.msgpack.Decoder(KVEventBatch).decode(no_rank) == KVEventBatch(ts=1.0, events=[])
    # kvcore without a group or kind still writes its trailing fields; vLLM
    # reads the same objects.
    plain = encode_batch(EventBatch(1700000000.25, kvcore_events(0, None), 3))
    assert msgspec.msgpack.Decoder(KVEventBatch).decode(plain) == vllm_batch()
    # 3. The kvcore payload's events are vLLM's arrays plus trailing fields.
    raw_ours = msgspec.msgpack.decode(ours)
    raw_theirs = msgspec.msgpack.decode(vllm_bytes)
    for mine, reference in zip(raw_ours[1], raw_theirs[1], strict=True):
        assert mine[: len(reference)] == reference, (mine, reference)
    if "--write" in sys.argv:
        FIXTURE.write_bytes(vllm_bytes)
        print(f"wrote {FIXTURE} ({len(vllm_bytes)} bytes)")
    import vllm

    print(f"KV event wire format: round trip with vLLM {vllm.__version__}'s classes OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
