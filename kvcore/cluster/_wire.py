"""KV events on the wire, in vLLM's format: msgspec structures encoded as msgpack arrays.

A batch is ``[ts, [event, ...], data_parallel_rank]`` (the rank omitted when it
is ``None``); each event is an array whose first element is its tag
(``"BlockStored"``, ``"BlockRemoved"``, ``"AllBlocksCleared"``) followed by its
fields in vLLM 0.14's order:

* ``BlockStored``: ``block_hashes, parent_block_hash, token_ids, block_size,
  lora_id, medium, lora_name``;
* ``BlockRemoved``: ``block_hashes, medium``;
* ``AllBlocksCleared``: no field.

kvcore appends optional fields after them, at the positions later vLLM
releases gave the same information, so a consumer of those releases reads
them and a vLLM 0.14 consumer (whose structures decode arrays positionally and
skip trailing elements) ignores them:

* ``BlockStored``: ``extra_keys`` (always ``None`` here), ``group_idx``,
  ``kv_cache_spec_kind`` (the group's attention kind, e.g.
  ``"sliding_window"``), ``kv_cache_spec_sliding_window`` (``None``: the
  window is a property of the kind's spec, which the index learns from the
  engine's layout, not from events);
* ``BlockRemoved``: ``group_idx``.

Decoding accepts both: a vLLM 0.14 batch has no group, so its events are taken
as group 0. Block hashes are ``int`` (kvcore's ``"fast"`` hash, or vLLM's int
hashes) or ``bytes`` (SHA-256 digests).

This module imports msgspec, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore.cluster._errors import EventFormatError, require

if TYPE_CHECKING:
    import msgspec
else:
    msgspec = require("msgspec", "kvcore's KV event wire format")

__all__ = ["EventBatch", "decode_batch", "encode_batch", "merge_removals"]

_STRUCT_OPTIONS: dict[str, Any] = {"array_like": True, "omit_defaults": True, "gc": False}


class _WireBatch(msgspec.Struct, **_STRUCT_OPTIONS):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _WireStored(msgspec.Struct, tag="BlockStored", **_STRUCT_OPTIONS):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    # kvcore's trailing extension (see the module documentation).
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class _WireRemoved(msgspec.Struct, tag="BlockRemoved", **_STRUCT_OPTIONS):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _WireCleared(msgspec.Struct, tag="AllBlocksCleared", **_STRUCT_OPTIONS):
    pass


class _DecodedBatch(msgspec.Struct, **_STRUCT_OPTIONS):
    ts: float
    events: list[_WireStored | _WireRemoved | _WireCleared]
    data_parallel_rank: int | None = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_DecodedBatch)


class EventBatch:
    """One engine step's KV events, as published: a timestamp and the events in order.

    Attributes:
        ts: When the batch was made, in seconds (the engine's clock).
        events: kvcore's events (:class:`~kvcore.events.BlockStored`, ...), oldest first.
        data_parallel_rank: The publishing engine's data-parallel rank, if set.
    """

    __slots__ = ("data_parallel_rank", "events", "ts")

    def __init__(
        self, ts: float, events: Sequence[KVCacheEvent], data_parallel_rank: int | None = None
    ) -> None:
        self.ts = ts
        self.events = list(events)
        self.data_parallel_rank = data_parallel_rank

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventBatch):
            return NotImplemented
        return (self.ts, self.events, self.data_parallel_rank) == (
            other.ts,
            other.events,
            other.data_parallel_rank,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventBatch(ts={self.ts!r}, events={self.events!r}, rank={self.data_parallel_rank})"


def _to_wire(event: KVCacheEvent) -> Any:
    if isinstance(event, BlockStored):
        return _WireStored(
            block_hashes=event.block_hashes,  # type: ignore[arg-type]
            parent_block_hash=event.parent_block_hash,  # type: ignore[arg-type]
            token_ids=event.token_ids,  # type: ignore[arg-type]
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=event.medium,
            lora_name=event.lora_name,
            group_idx=event.group_idx,
            kv_cache_spec_kind=event.kind,
        )
    if isinstance(event, BlockRemoved):
        return _WireRemoved(
            block_hashes=event.block_hashes,  # type: ignore[arg-type]
            medium=event.medium,
            group_idx=event.group_idx,
        )
    if isinstance(event, AllBlocksCleared):
        return _WireCleared()
    msg = f"not a kvcore KV cache event: {event!r}"
    raise TypeError(msg)


def merge_removals(events: Sequence[KVCacheEvent]) -> list[KVCacheEvent]:
    """Merge runs of consecutive ``BlockRemoved`` of one group into one event each.

    The pool queues one removal per evicted block; a publisher sends a run of
    them as one event with many hashes (the format allows it, and vLLM-format
    consumers apply the hashes in order), which is several times cheaper to
    encode and decode. Order and meaning are unchanged.
    """
    out: list[KVCacheEvent] = []
    run: list[Any] = []
    run_group, run_medium = 0, "GPU"
    for event in events:
        if isinstance(event, BlockRemoved):
            if run and (event.group_idx, event.medium) == (run_group, run_medium):
                run.extend(event.block_hashes)
                continue
            if run:
                out.append(BlockRemoved(block_hashes=run, group_idx=run_group, medium=run_medium))
            run = list(event.block_hashes)
            run_group, run_medium = event.group_idx, event.medium
            continue
        if run:
            out.append(BlockRemoved(block_hashes=run, group_idx=run_group, medium=run_medium))
            run = []
        out.append(event)
    if run:
        out.append(BlockRemoved(block_hashes=run, group_idx=run_group, medium=run_medium))
    return out


def encode_batch(batch: EventBatch) -> bytes:
    """The msgpack payload of ``batch`` in vLLM's format, with kvcore's trailing fields.

    Raises:
        TypeError: an event is not a kvcore KV cache event.
    """
    wire = _WireBatch(
        ts=batch.ts,
        events=[_to_wire(event) for event in batch.events],
        data_parallel_rank=batch.data_parallel_rank,
    )
    return _encoder.encode(wire)


def _from_wire(event: Any) -> KVCacheEvent:
    if type(event) is _WireStored:
        return BlockStored(
            block_hashes=event.block_hashes,
            parent_block_hash=event.parent_block_hash,
            token_ids=event.token_ids,
            block_size=event.block_size,
            lora_id=event.lora_id,
            lora_name=event.lora_name,
            group_idx=event.group_idx or 0,
            kind=event.kv_cache_spec_kind,
            medium=event.medium or "GPU",
        )
    if type(event) is _WireRemoved:
        return BlockRemoved(
            block_hashes=event.block_hashes,
            group_idx=event.group_idx or 0,
            medium=event.medium or "GPU",
        )
    return AllBlocksCleared()


def decode_batch(payload: bytes) -> EventBatch:
    """Decode a batch published by kvcore or by vLLM 0.14 (events of group 0).

    Raises:
        EventFormatError: the payload is not an event batch in either format
            (the message gives msgspec's reason).
    """
    try:
        wire = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        msg = f"not a KV event batch in vLLM's format: {exc}"
        raise EventFormatError(msg) from None
    return EventBatch(wire.ts, [_from_wire(e) for e in wire.events], wire.data_parallel_rank)
