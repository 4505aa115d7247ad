"""Checking an engine's event batch against the fleet's layout, before anything changes.

The cluster index takes batches from other processes, over the network. A
batch is turned into block operations only once every event in it has been
checked; one bad event refuses the whole batch with an
:class:`~kvcore.cluster.InvalidEventError` that names the event and the
field. What is checked:

* the events are kvcore's event classes, at most ``4 x max_blocks`` of them;
* ``group_idx`` is a group of the layout; a ``BlockStored``'s ``block_size``
  and (when given) attention ``kind`` are that group's;
* block hashes are of the layout's hash algorithm: integers within 64 bits
  for ``"fast"`` (vLLM's unsigned 64-bit integer hashes too: both are kept
  as signed 64-bit two's complement, so ``2**64 - 1`` and ``-1`` are one
  hash), digests of its width for ``"sha256"`` (32 bytes) and
  ``"xxh3_128"`` (16 bytes);
* the batch carries at most ``4 x max_blocks`` hashes, stores and removals
  together (``max_blocks``: the engine's pool; one engine step cannot evict
  and store more), and at most 16,384 (:data:`MAX_BATCH_HASHES`): the Redis
  backend applies a batch in one script, which holds the server for one to
  two microseconds per hash and more than linearly past that size, so a
  batch holds it for tens of milliseconds at most (kvcore's publisher splits
  larger steps into several batches).

Whether the engine's entries stay within ``max_blocks`` once the batch is
applied depends on what the backend holds; the backend checks that.
"""

from __future__ import annotations

import math
import re
from collections.abc import Hashable, Sequence
from typing import Any, Final

from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcore.cluster._backend import CLEAR, REMOVE, STORE
from kvcore.cluster._errors import InvalidConfigError, InvalidEventError
from kvcore.cluster._hit_rule import FleetLayout

__all__ = [
    "BATCH_BLOCKS_PER_POOL_BLOCK",
    "MAX_BATCH_HASHES",
    "EventChecker",
    "Ops",
    "check_engine_id",
    "check_incarnation",
]

#: Block operations: ``(op, group, block_hashes)`` (see :class:`~kvcore.cluster.ReadyBatch`).
Ops = tuple[tuple[int, int, Sequence[Hashable]], ...]

#: A batch may carry this many hashes (stores and removals) per block of the engine's pool.
BATCH_BLOCKS_PER_POOL_BLOCK: Final = 4
#: And this many at most, whatever the pool.
MAX_BATCH_HASHES: Final = 16_384

_DIGEST_BYTES: Final = {"sha256": 32, "xxh3_128": 16}
_INT_MIN: Final = -(2**63)
_UINT_END: Final = 2**64
_INT_END: Final = 2**63
_ENGINE_ID = re.compile(r"[!-~]{1,200}")
_INCARNATION = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_engine_id(engine: object) -> str:
    """``engine`` if it is a usable engine id (1-200 printable ASCII characters, no space).

    Raises:
        InvalidConfigError: it is not.
    """
    if not isinstance(engine, str) or not _ENGINE_ID.fullmatch(engine):
        msg = (
            "engine must be a non-empty string id of at most 200 printable ASCII characters "
            f"without spaces, got {engine!r:.80}"
        )
        raise InvalidConfigError(msg)
    return engine


def check_incarnation(incarnation: object) -> str:
    """The incarnation as stored (``""`` for ``None``).

    Raises:
        InvalidEventError: not ``None`` nor 1-64 characters of ``A-Z a-z 0-9 _ . -``.
    """
    if incarnation is None:
        return ""
    if not isinstance(incarnation, str) or not _INCARNATION.fullmatch(incarnation):
        msg = (
            "incarnation must be 1-64 characters of A-Z, a-z, 0-9, '_', '.', '-', "
            f"got {incarnation!r:.80}"
        )
        raise InvalidEventError(msg)
    return incarnation


def _event_name(event: object) -> str:
    return type(event).__name__


class EventChecker:
    """Validates batches for one layout and turns them into block operations.

    Args:
        layout: The fleet's layout (its groups, block sizes, kinds, hashing).
    """

    def __init__(self, layout: FleetLayout) -> None:
        groups = layout.config.kv_cache_groups
        self.num_groups = len(groups)
        self.block_sizes = tuple(group.kv_cache_spec.block_size for group in groups)
        self.kinds = tuple(group.kv_cache_spec.kind for group in groups)
        self.hash_algorithm = layout.hash_algorithm
        self.digest_bytes = _DIGEST_BYTES.get(layout.hash_algorithm)

    def check_ts(self, ts: object) -> float:
        """The batch time as a float.

        Raises:
            InvalidEventError: not a finite number.
        """
        if type(ts) not in (int, float) or not math.isfinite(ts):  # type: ignore[arg-type]
            msg = f"the batch's ts must be a finite number of seconds, got {ts!r:.40}"
            raise InvalidEventError(msg)
        return float(ts)  # type: ignore[arg-type]

    def ops(self, events: Sequence[Any], max_blocks: int) -> Ops:
        """The batch's block operations, in event order.

        Raises:
            InvalidEventError: an event does not fit (the message names it
                and the field); nothing is returned for any event.
        """
        limit = min(BATCH_BLOCKS_PER_POOL_BLOCK * max_blocks, MAX_BATCH_HASHES)
        if not isinstance(events, list | tuple):
            msg = f"events must be a list of KV cache events, got {type(events).__name__}"
            raise InvalidEventError(msg)
        if len(events) > limit:
            self._too_many(f"{len(events)} events", limit, max_blocks)
        ops: list[tuple[int, int, Sequence[Hashable]]] = []
        total = 0
        for i, event in enumerate(events):
            op, group = self._shape(i, event)
            if op == CLEAR:
                ops.append((CLEAR, 0, ()))
                continue
            # Counted before the event's hashes are looked at: a huge event costs nothing.
            total += len(event.block_hashes)
            if total > limit:
                self._too_many(f"{total} block hashes or more", limit, max_blocks)
            ops.append((op, group, self._hashes(i, event)))
        return tuple(ops)

    def _shape(self, i: int, event: object) -> tuple[int, int]:
        """``(op, group)`` of event ``i``, with its group, block size and kind checked."""
        if type(event) is AllBlocksCleared:
            return CLEAR, 0
        if type(event) is BlockStored:
            op = STORE
        elif type(event) is BlockRemoved:
            op = REMOVE
        else:
            msg = (
                f"event {i} is not a KV cache event (BlockStored, BlockRemoved, "
                f"AllBlocksCleared): {event!r:.80}"
            )
            raise InvalidEventError(msg)
        group = event.group_idx
        if type(group) is not int or not 0 <= group < self.num_groups:
            msg = (
                f"event {i} ({_event_name(event)}): group_idx {group!r:.40} is not a KV cache "
                f"group of the fleet's layout ({self.num_groups} groups: 0..{self.num_groups - 1})"
            )
            raise InvalidEventError(msg)
        if type(event) is BlockStored:
            self._check_stored(i, event, group)
        return op, group

    def _check_stored(self, i: int, event: BlockStored, group: int) -> None:
        if event.block_size != self.block_sizes[group]:
            msg = (
                f"event {i} (BlockStored): block_size {event.block_size!r:.40} is not group "
                f"{group}'s block size ({self.block_sizes[group]})"
            )
            raise InvalidEventError(msg)
        if event.kind is not None and event.kind != self.kinds[group]:
            msg = (
                f"event {i} (BlockStored): kind {event.kind!r:.40} is not group {group}'s "
                f"attention kind ({self.kinds[group]!r})"
            )
            raise InvalidEventError(msg)

    @staticmethod
    def _too_many(what: str, limit: int, max_blocks: int) -> None:
        msg = (
            f"the batch carries {what}, more than {limit} ({BATCH_BLOCKS_PER_POOL_BLOCK} per "
            f"block of the engine's pool of {max_blocks} blocks, and {MAX_BATCH_HASHES:,} at "
            "most); split larger steps into several batches, as kvcore's EventPublisher does"
        )
        raise InvalidEventError(msg)

    def _hashes(self, i: int, event: BlockStored | BlockRemoved) -> Sequence[Hashable]:
        """Event ``i``'s hashes, checked, integers as signed 64-bit."""
        hashes = self._canonical(event.block_hashes)
        if hashes is None:
            self._bad_hash(i, event)
        return hashes  # type: ignore[return-value]

    def request_hashes(self, hashes: Sequence[Hashable]) -> Sequence[Hashable]:
        """A request's block hashes, checked as events' are, integers as signed 64-bit.

        Raises:
            InvalidEventError: they are not hashes of the layout's algorithm.
        """
        checked = self._canonical(hashes)
        if checked is None:
            msg = (
                f"block_hashes must be {self._wanted()} (the layout hashes with "
                f"{self.hash_algorithm!r}), as kvcore.hashing.BlockHasher computes them"
            )
            raise InvalidEventError(msg)
        return checked

    def _wanted(self) -> str:
        if self.digest_bytes is None:
            return "integers within 64 bits"
        return f"{self.digest_bytes}-byte digests"

    def _canonical(self, hashes: Sequence[Hashable]) -> Sequence[Hashable] | None:
        """``hashes`` if they are of the layout's type (integers made signed), else ``None``."""
        if not len(hashes):
            return hashes
        types = set(map(type, hashes))
        if self.digest_bytes is not None:
            if types != {bytes} or set(map(len, hashes)) != {self.digest_bytes}:  # type: ignore[arg-type]
                return None
            return hashes
        if types != {int}:
            return None
        low, high = min(hashes), max(hashes)  # type: ignore[type-var]
        if low < _INT_MIN or high >= _UINT_END:  # type: ignore[operator]
            return None
        if high >= _INT_END:  # type: ignore[operator]
            return tuple(h - _UINT_END if h >= _INT_END else h for h in hashes)  # type: ignore[operator]
        return hashes

    def _bad_hash(self, i: int, event: BlockStored | BlockRemoved) -> None:
        if self.digest_bytes is None:
            bad = next(
                (
                    h
                    for h in event.block_hashes
                    if type(h) is not int or not _INT_MIN <= h < _UINT_END
                ),
                None,
            )
        else:
            bad = next(
                (
                    h
                    for h in event.block_hashes
                    if type(h) is not bytes or len(h) != self.digest_bytes
                ),
                None,
            )
        msg = (
            f"event {i} ({_event_name(event)}): block hashes must be {self._wanted()} (the layout "
            f"hashes with {self.hash_algorithm!r}), got {bad!r:.60}"
        )
        raise InvalidEventError(msg)
