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

and, after the batch's ``data_parallel_rank``, kvcore's extension field: a
map ``{"incarnation": str, "num_blocks": int}`` (each key optional), the
publishing engine's incarnation (a random id chosen when it starts, so a
restart is told from a replay whatever the clocks say) and its pool size
(the most entries a cluster index keeps for it). vLLM's ``EventBatch``
decodes the first three elements and ignores it; when kvcore decodes a
fourth element that is not a map (another producer's field), it is ignored.

Decoding accepts both: a vLLM 0.14 batch has no group, so its events are taken
as group 0. Block hashes are ``int`` (kvcore's ``"fast"`` hash, or vLLM's int
hashes) or ``bytes`` (SHA-256 digests).

This module imports msgspec, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore.cluster._errors import EventFormatError, require

if TYPE_CHECKING:
    import msgspec
else:
    msgspec = require("msgspec", "kvcore's KV event wire format")

__all__ = ["EventBatch", "decode_batch", "encode_batch", "merge_removals", "split_events"]

_STRUCT_OPTIONS: dict[str, Any] = {"array_like": True, "omit_defaults": True, "gc": False}


class _WireBatch(msgspec.Struct, **_STRUCT_OPTIONS):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None
    # kvcore's extension (see the module documentation).
    kvcore: dict[str, Any] | None = None


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
    kvcore: Any = None


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_DecodedBatch)


class EventBatch:
    """One engine step's KV events, as published: a timestamp and the events in order.

    Attributes:
        ts: When the batch was made, in seconds (the engine's clock).
        events: kvcore's events (:class:`~kvcore.events.BlockStored`, ...), oldest first.
        data_parallel_rank: The publishing engine's data-parallel rank, if set.
        incarnation: The publishing engine's incarnation, if it announces one
            (kvcore's :class:`~kvcore.cluster.EventPublisher` does).
        num_blocks: The publishing engine's pool size, if it announces it.
    """

    __slots__ = ("data_parallel_rank", "events", "incarnation", "num_blocks", "ts")

    def __init__(
        self,
        ts: float,
        events: Sequence[KVCacheEvent],
        data_parallel_rank: int | None = None,
        *,
        incarnation: str | None = None,
        num_blocks: int | None = None,
    ) -> None:
        self.ts = ts
        self.events = list(events)
        self.data_parallel_rank = data_parallel_rank
        self.incarnation = incarnation
        self.num_blocks = num_blocks

    def _key(self) -> tuple[Any, ...]:
        return (self.ts, self.events, self.data_parallel_rank, self.incarnation, self.num_blocks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EventBatch):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        extra = ""
        if self.incarnation is not None or self.num_blocks is not None:
            extra = f", incarnation={self.incarnation!r}, num_blocks={self.num_blocks!r}"
        return (
            f"EventBatch(ts={self.ts!r}, events={self.events!r}, "
            f"rank={self.data_parallel_rank}{extra})"
        )


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


def _parts(event: KVCacheEvent, max_hashes: int) -> list[KVCacheEvent]:
    """``event``, or its hashes cut into events of at most ``max_hashes`` (in order)."""
    if isinstance(event, AllBlocksCleared) or len(event.block_hashes) <= max_hashes:
        return [event]
    hashes = event.block_hashes
    cuts = range(0, len(hashes), max_hashes)
    if isinstance(event, BlockRemoved):
        return [attrs.evolve(event, block_hashes=hashes[i : i + max_hashes]) for i in cuts]
    # Token ids follow their blocks when there is one run of block_size per
    # hash; otherwise (blocks a window skipped) they stay with the first part.
    per_block = len(event.token_ids) == len(hashes) * event.block_size
    parts: list[KVCacheEvent] = []
    for i in cuts:
        if per_block:
            tokens = event.token_ids[i * event.block_size : (i + max_hashes) * event.block_size]
        else:
            tokens = event.token_ids if i == 0 else ()
        parts.append(
            attrs.evolve(
                event,
                block_hashes=hashes[i : i + max_hashes],
                parent_block_hash=event.parent_block_hash if i == 0 else hashes[i - 1],
                token_ids=tokens,
            )
        )
    return parts


def split_events(events: Sequence[KVCacheEvent], max_hashes: int) -> list[list[KVCacheEvent]]:
    """``events`` in order, cut into runs of at most ``max_hashes`` events and block hashes.

    A cluster index refuses a batch of more (see
    :class:`~kvcore.cluster.InvalidEventError`); a publisher sends each run
    as a batch of its own, in order, so the index applies the same changes.
    An event with more hashes is cut into several. Returns one run at least
    (empty for no events).
    """
    runs: list[list[KVCacheEvent]] = []
    run: list[KVCacheEvent] = []
    size = 0
    for event in events:
        for part in _parts(event, max_hashes):
            count = 0 if isinstance(part, AllBlocksCleared) else len(part.block_hashes)
            if run and (size + count > max_hashes or len(run) >= max_hashes):
                runs.append(run)
                run, size = [], 0
            run.append(part)
            size += count
    runs.append(run)
    return runs


def encode_batch(batch: EventBatch) -> bytes:
    """The msgpack payload of ``batch`` in vLLM's format, with kvcore's trailing fields.

    Raises:
        TypeError: an event is not a kvcore KV cache event.
    """
    origin: dict[str, Any] = {}
    if batch.incarnation is not None:
        origin["incarnation"] = batch.incarnation
    if batch.num_blocks is not None:
        origin["num_blocks"] = batch.num_blocks
    wire = _WireBatch(
        ts=batch.ts,
        events=[_to_wire(event) for event in batch.events],
        data_parallel_rank=batch.data_parallel_rank,
        kvcore=origin or None,
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

    Only the format is checked here; whether the events fit an engine (its
    groups, hash type, pool) is :meth:`~kvcore.cluster.ClusterIndex.submit`'s
    business.

    Raises:
        EventFormatError: the payload is not an event batch in either format
            (the message gives msgspec's reason).
    """
    try:
        wire = _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        msg = f"not a KV event batch in vLLM's format: {exc}"
        raise EventFormatError(msg) from None
    incarnation, num_blocks = _origin(wire.kvcore)
    return EventBatch(
        wire.ts,
        [_from_wire(e) for e in wire.events],
        wire.data_parallel_rank,
        incarnation=incarnation,
        num_blocks=num_blocks,
    )


def _origin(extension: Any) -> tuple[str | None, int | None]:
    """``(incarnation, num_blocks)`` from kvcore's extension field (another producer's: none)."""
    if not isinstance(extension, dict):
        return None, None
    incarnation = extension.get("incarnation")
    num_blocks = extension.get("num_blocks")
    if incarnation is not None and not isinstance(incarnation, str):
        msg = f"kvcore's extension field: incarnation must be a string, got {incarnation!r:.40}"
        raise EventFormatError(msg)
    if num_blocks is not None and type(num_blocks) is not int:
        msg = f"kvcore's extension field: num_blocks must be an integer, got {num_blocks!r:.40}"
        raise EventFormatError(msg)
    return incarnation, num_blocks
