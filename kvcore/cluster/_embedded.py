"""The in-process backend of the cluster index: plain dictionaries, one process."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from kvcore.cluster._backend import REMOVE, STORE, ReadyBatch, Snapshot

__all__ = ["EmbeddedBackend"]


class EmbeddedBackend:
    """Keeps the cluster index in this process's memory (the default backend).

    Per group, a dict maps a block hash to a bit mask of the engines holding it
    (bit ``slot``), so one lookup answers for every engine; per engine and
    group, a dict counts the engine's cached blocks with that hash (an engine
    can cache two blocks with equal contents), so a removal only clears the
    engine's bit when its last copy goes. Memory is bounded by what the
    engines cache: every entry mirrors a block some engine holds.

    Liveness is the index's business (see :class:`~kvcore.cluster.ClusterIndex`);
    the backend forgets an engine when told.
    """

    name = "embedded"

    def __init__(self) -> None:
        self._slots: dict[str, int] = {}
        self._free_slots: list[int] = []
        self._masks: list[dict[Hashable, int]] = []
        self._counts: dict[str, list[dict[Hashable, int]]] = {}
        self._seq: dict[str, int] = {}

    def _ensure_groups(self, num_groups: int) -> None:
        while len(self._masks) < num_groups:
            self._masks.append({})

    def _slot(self, engine: str) -> int:
        slot = self._slots.get(engine)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._slots)
            self._slots[engine] = slot
            self._counts[engine] = []
        return slot

    def apply(self, batches: Sequence[ReadyBatch]) -> list[bool]:
        """Apply batches in order; a batch whose sequence number was applied already is skipped."""
        return [self._apply_one(batch) for batch in batches]

    def _apply_one(self, batch: ReadyBatch) -> bool:
        engine = batch.engine
        last = self._seq.get(engine)
        if last is not None and not batch.reset and batch.seq <= last:
            return False
        slot = self._slot(engine)
        if batch.reset:
            self._clear(engine, slot)
        counts = self._counts[engine]
        bit = 1 << slot
        masks = self._masks
        for op, group, block_hashes in batch.ops:
            if op == STORE:
                while len(counts) <= group:
                    counts.append({})
                self._ensure_groups(group + 1)
                held = counts[group]
                mask = masks[group]
                for block_hash in block_hashes:
                    count = held.get(block_hash, 0)
                    held[block_hash] = count + 1
                    if not count:
                        mask[block_hash] = mask.get(block_hash, 0) | bit
            elif op == REMOVE:
                if group >= len(counts):
                    continue
                held = counts[group]
                mask = masks[group]
                for block_hash in block_hashes:
                    count = held.get(block_hash, 0)
                    if count > 1:
                        held[block_hash] = count - 1
                    elif count == 1:
                        del held[block_hash]
                        left = mask[block_hash] & ~bit
                        if left:
                            mask[block_hash] = left
                        else:
                            del mask[block_hash]
            else:
                self._clear(engine, slot)
        self._seq[engine] = batch.seq
        return True

    def _clear(self, engine: str, slot: int) -> None:
        counts = self._counts.get(engine)
        if not counts:
            return
        bit = 1 << slot
        for group, held in enumerate(counts):
            mask = self._masks[group]
            for block_hash in held:
                left = mask[block_hash] & ~bit
                if left:
                    mask[block_hash] = left
                else:
                    del mask[block_hash]
        self._counts[engine] = []

    def forget(self, engine: str) -> None:
        """Drop every entry of ``engine`` and its sequence number (it is gone)."""
        slot = self._slots.get(engine)
        if slot is None:
            return
        self._clear(engine, slot)
        del self._slots[engine]
        del self._counts[engine]
        self._seq.pop(engine, None)
        self._free_slots.append(slot)

    def heartbeat(self, engines: Sequence[str]) -> None:
        """Nothing to refresh: the index keeps liveness for this backend."""

    def engines(self) -> list[str]:
        """Engines with entries or a sequence number."""
        return sorted(set(self._slots) | set(self._seq))

    def snapshot(
        self, engines: Sequence[str], group_hashes: Sequence[Sequence[Hashable]]
    ) -> Snapshot:
        """Membership straight from the live dicts (no copy: the caller scores at once)."""
        masks = self._masks
        num_groups = len(masks)
        slots = [self._slots.get(engine, -1) for engine in engines]

        def holds(position: int, group: int, block_hash: Hashable) -> bool:
            slot = slots[position]
            if slot < 0 or group >= num_groups:
                return False
            return bool(masks[group].get(block_hash, 0) >> slot & 1)

        return Snapshot(holds)

    def cached_blocks(self, engine: str) -> int:
        """Block entries the index holds for ``engine`` (copies counted), all groups."""
        return sum(sum(held.values()) for held in self._counts.get(engine, ()))

    def last_seq(self, engine: str) -> int | None:
        """The last sequence number applied for ``engine``."""
        return self._seq.get(engine)

    def close(self) -> None:
        """Nothing to release."""
