"""The in-process backend of the cluster index: plain dictionaries, one process."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Final

from kvcore.cluster._backend import (
    CLEAR,
    RETIRED_KEPT,
    STORE,
    ApplyResult,
    ReadyBatch,
    Snapshot,
    sequence_decision,
)
from kvcore.cluster._errors import InvalidConfigError

__all__ = ["EmbeddedBackend"]

# Groups an embedded backend told no group count accepts.
_MAX_GROUPS: Final = 1024

# One undo record: (the engine's counts of a group, that group's masks, hash, count before).
_Undo = tuple[dict[Hashable, int], dict[Hashable, int], Hashable, int]


class _Entries:
    """One engine's share: its bit, its cached-block counts per group, its sequence state."""

    __slots__ = ("counts", "incarnation", "retired", "seq", "slot", "total")

    def __init__(self, slot: int, num_groups: int) -> None:
        self.slot = slot
        self.counts: list[dict[Hashable, int]] = [{} for _ in range(num_groups)]
        self.total = 0
        self.seq: int | None = None
        self.incarnation = ""
        self.retired: tuple[str, ...] = ()


class EmbeddedBackend:
    """Keeps the cluster index in this process's memory (the default backend).

    Per group, a dict maps a block hash to a bit mask of the engines holding it
    (bit ``slot``), so one lookup answers for every engine; per engine and
    group, a dict counts the engine's cached blocks with that hash (an engine
    can cache two blocks with equal contents), so a removal only clears the
    engine's bit when its last copy goes. Memory is bounded by what the
    engines cache, and each engine by its ``max_blocks``.

    A batch is applied whole or not at all (an over-capacity batch is undone),
    with the same sequence and incarnation rules as the Redis backend, so two
    indexes sharing one backend apply each batch once.

    Liveness is the index's business (see :class:`~kvcore.cluster.ClusterIndex`);
    the backend forgets an engine when told.

    Args:
        num_groups: KV cache groups of the fleet's layout (``None``: up to
            1024, as batches use them).
    """

    name = "embedded"

    def __init__(self, num_groups: int | None = None) -> None:
        if num_groups is not None and (type(num_groups) is not int or num_groups < 1):
            msg = f"num_groups must be a positive integer, got {num_groups!r}"
            raise InvalidConfigError(msg)
        self.num_groups = num_groups
        self._entries: dict[str, _Entries] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._masks: list[dict[Hashable, int]] = [{} for _ in range(num_groups or 1)]

    def apply(self, batches: Sequence[ReadyBatch]) -> list[str]:
        """Apply batches in order, each whole or not at all (see ``Backend.apply``)."""
        return [self._apply_one(batch) for batch in batches]

    def _groups_ok(self, batch: ReadyBatch) -> bool:
        limit = self.num_groups or _MAX_GROUPS
        for op, group, _ in batch.ops:
            if op != CLEAR and (type(group) is not int or not 0 <= group < limit):
                return False
        needed = max((g + 1 for op, g, _ in batch.ops if op != CLEAR), default=0)
        while len(self._masks) < needed:
            self._masks.append({})
        return True

    def _apply_one(self, batch: ReadyBatch) -> str:
        if not self._groups_ok(batch):
            return ApplyResult.INVALID
        entry = self._entries.get(batch.engine)
        if entry is None:
            status, reset = sequence_decision(batch, None, "", ())
        else:
            status, reset = sequence_decision(batch, entry.seq, entry.incarnation, entry.retired)
        if status is not None:
            return status
        ops = batch.ops
        clears = [i for i, (op, _, _) in enumerate(ops) if op == CLEAR]
        if clears:
            reset = True
            ops = ops[clears[-1] + 1 :]
        if entry is None:
            entry = self._new_entry(batch.engine)
        saved = self._take_entries(entry) if reset else None
        total_before = entry.total
        undo = self._run(entry, ops, batch.max_blocks)
        if batch.max_blocks is not None and entry.total > batch.max_blocks:
            self._undo(entry, undo, saved)
            entry.total = total_before if saved is None else saved[1]
            if entry.seq is None:
                self._drop(batch.engine)
            return ApplyResult.OVER_CAPACITY
        if batch.incarnation != entry.incarnation and entry.seq is not None:
            entry.retired = (*entry.retired, entry.incarnation)[-RETIRED_KEPT:]
        entry.incarnation = batch.incarnation
        entry.seq = batch.seq
        return ApplyResult.APPLIED

    def _new_entry(self, engine: str) -> _Entries:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:
            slot = self._next_slot
            self._next_slot += 1
        entry = self._entries[engine] = _Entries(slot, len(self._masks))
        return entry

    def _run(
        self,
        entry: _Entries,
        ops: Sequence[tuple[int, int, Sequence[Hashable]]],
        max_blocks: int | None,
    ) -> list[_Undo] | None:
        """Apply ``ops`` to the engine's counts and the masks; the undo log if one may be needed."""
        counts = entry.counts
        while len(counts) < len(self._masks):
            counts.append({})
        stores = sum(len(hashes) for op, _, hashes in ops if op == STORE)
        undo: list[_Undo] | None = None
        if max_blocks is not None and entry.total + stores > max_blocks:
            undo = []
        bit = 1 << entry.slot
        total = entry.total
        for op, group, block_hashes in ops:
            held, mask = counts[group], self._masks[group]
            if op == STORE:
                for block_hash in block_hashes:
                    count = held.get(block_hash, 0)
                    held[block_hash] = count + 1
                    if not count:
                        mask[block_hash] = mask.get(block_hash, 0) | bit
                    if undo is not None:
                        undo.append((held, mask, block_hash, count))
                total += len(block_hashes)
                continue
            for block_hash in block_hashes:
                count = held.get(block_hash, 0)
                if not count:
                    continue
                total -= 1
                if undo is not None:
                    undo.append((held, mask, block_hash, count))
                if count > 1:
                    held[block_hash] = count - 1
                    continue
                del held[block_hash]
                left = mask[block_hash] & ~bit
                if left:
                    mask[block_hash] = left
                else:
                    del mask[block_hash]
        entry.total = total
        return undo

    def _undo(
        self,
        entry: _Entries,
        undo: list[_Undo] | None,
        saved: tuple[list[dict[Hashable, int]], int] | None,
    ) -> None:
        """Put back what :meth:`_run` changed, then the entries a reset took away."""
        assert undo is not None
        bit = 1 << entry.slot
        for held, mask, block_hash, count in reversed(undo):
            if count:
                held[block_hash] = count
                mask[block_hash] = mask.get(block_hash, 0) | bit
                continue
            del held[block_hash]
            left = mask[block_hash] & ~bit
            if left:
                mask[block_hash] = left
            else:
                del mask[block_hash]
        if saved is not None:
            entry.counts = saved[0]
            for group, held in enumerate(entry.counts):
                mask = self._masks[group]
                for block_hash in held:
                    mask[block_hash] = mask.get(block_hash, 0) | bit

    def _take_entries(self, entry: _Entries) -> tuple[list[dict[Hashable, int]], int]:
        """Remove the engine's entries (bits and counts); return them for an undo."""
        bit = 1 << entry.slot
        for group, held in enumerate(entry.counts):
            mask = self._masks[group]
            for block_hash in held:
                left = mask[block_hash] & ~bit
                if left:
                    mask[block_hash] = left
                else:
                    del mask[block_hash]
        saved = (entry.counts, entry.total)
        entry.counts = [{} for _ in self._masks]
        entry.total = 0
        return saved

    def _drop(self, engine: str) -> None:
        entry = self._entries.pop(engine)
        self._take_entries(entry)
        self._free_slots.append(entry.slot)

    def forget(self, engine: str) -> None:
        """Drop every entry of ``engine`` and its sequence state (it is gone)."""
        if engine in self._entries:
            self._drop(engine)

    def heartbeat(self, engines: Sequence[str]) -> None:
        """Nothing to refresh: the index keeps liveness for this backend."""

    def engines(self) -> list[str]:
        """Engines with entries or a sequence number."""
        return sorted(self._entries)

    def snapshot(
        self, engines: Sequence[str], group_hashes: Sequence[Sequence[Hashable]]
    ) -> Snapshot:
        """Membership straight from the live dicts (no copy: the caller scores at once)."""
        masks = self._masks
        num_groups = len(masks)
        entries = self._entries
        slots = [entries[engine].slot if engine in entries else -1 for engine in engines]

        def holds(position: int, group: int, block_hash: Hashable) -> bool:
            slot = slots[position]
            if slot < 0 or group >= num_groups:
                return False
            return bool(masks[group].get(block_hash, 0) >> slot & 1)

        return Snapshot(holds)

    def cached_blocks(self, engine: str) -> int:
        """Block entries the index holds for ``engine`` (copies counted), all groups."""
        entry = self._entries.get(engine)
        return 0 if entry is None else entry.total

    def last_seq(self, engine: str) -> int | None:
        """The last sequence number applied for ``engine``."""
        entry = self._entries.get(engine)
        return None if entry is None else entry.seq

    def close(self) -> None:
        """Nothing to release."""
