"""The block pool: block ids, reference counts, the prefix cache map, events.

Blocks are plain integers ``0 .. num_blocks - 1``. Per-block state lives in
parallel sequences indexed by block id (reference count, cached hash, owning
group), not in one object per block: building a pool of a million blocks is a
handful of allocations, and the allocation path indexes lists instead of
reading object attributes. The hot state stays in lists (CPython indexes a
list several times faster than an ``array``); the group of a one-group pool,
which no hot path reads, is a ``bytearray``.

Block 0 is the *null block*: a placeholder in block tables (for positions a
windowed attention type no longer needs). It is never handed out, cached,
freed or evicted, and its reference count is not maintained.

Public methods check their arguments in O(1) or O(blocks given) and change
nothing when they refuse. While a transaction runs (:meth:`BlockPool.begin`),
every change also records how to reverse it, so that the engine-facing
manager can undo a whole operation a plugin manager failed half-way through
(:meth:`BlockPool.rollback`); outside one, nothing is recorded.

Which free block is handed out next is not decided here: the pool owns an
eviction policy (:mod:`kvcore.eviction`) and asks it, and only it, for
victims. The built-in policies (the LRU queue and the credit-queue policies)
run on the pool's own fast path: they offer fused operations (a freed table
released, an adopted hit revived, in one call each). Any other policy is
driven through the protocol by a
:class:`~kvcore._eviction.driver.PolicyDriver`, which also counts the free
blocks and makes the policy's changes undoable. Tests drive each built-in
policy through both paths and check they hand out the same blocks.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Hashable, Sequence
from itertools import compress
from typing import Any, Final

from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore._eviction.driver import PolicyDriver
from kvcore._eviction.policies import ValuePolicy
from kvcore._eviction.registry import DEFAULT_POLICY, build_policy, resolve_policy
from kvcore._free_queue import LRUFreeQueue, count_down
from kvcore._hashing import hashes_at_block_size
from kvcore._planning.memory import format_bytes
from kvcore._request import Request
from kvcore.errors import (
    DoubleFreeError,
    InvalidBlockError,
    InvalidConfigError,
    InvalidRequestError,
    PoolTooLargeError,
)
from kvcore.eviction import EvictionPolicy, EvictionPolicyFactory, GroupInfo, PoolInfo

__all__ = ["MAX_NUM_BLOCKS", "NULL_BLOCK", "BlockPool", "available_host_memory"]

#: Id of the null block.
NULL_BLOCK: Final = 0

_INT: Final = {int}

#: Most blocks a pool may have: block tables hold int32 block ids.
MAX_NUM_BLOCKS: Final = 2**31 - 1

# Host memory per block for the pool's bookkeeping: four list slots (reference
# count, hash, and the free queue's two links) of 8 bytes each, and the group
# (a byte with one group, a list slot with several: counted as 8).
_BYTES_PER_BLOCK: Final = 40
# Pools needing less than this are not checked against the host's memory.
_CHECK_HOST_MEMORY_ABOVE: Final = 2**28

Undo = tuple[Callable[..., None], tuple[Any, ...]]


def available_host_memory() -> int | None:
    """Bytes of host memory available to a new allocation, or ``None`` if unknown.

    ``MemAvailable`` of ``/proc/meminfo`` on Linux, else free physical pages.
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _check_pool_size(num_blocks: int) -> None:
    if num_blocks > MAX_NUM_BLOCKS:
        msg = (
            f"num_blocks={num_blocks} is more than a pool can address: block tables hold "
            f"int32 ids (at most {MAX_NUM_BLOCKS} blocks); plan with less memory or fewer "
            "blocks"
        )
        raise PoolTooLargeError(msg)
    needed = num_blocks * _BYTES_PER_BLOCK
    if needed <= _CHECK_HOST_MEMORY_ABOVE:
        return
    available = available_host_memory()
    if available is not None and needed > available:
        msg = (
            f"a pool of {num_blocks} blocks needs about {format_bytes(needed)} of host memory "
            f"for its bookkeeping ({_BYTES_PER_BLOCK} bytes a block), but only "
            f"{format_bytes(available)} is available; plan with less memory or fewer blocks"
        )
        raise PoolTooLargeError(msg)


def _without_leading_nulls(table: Sequence[int]) -> Sequence[int]:
    """``table`` from its first non-null block on, if it starts with a run of nulls.

    A windowed table starts with the nulls of the blocks it freed, often
    hundreds of them: a bisection finds where a table of nulls-then-blocks
    turns, and a C-level count checks that everything before is null (a
    table of another shape is returned whole: its nulls are never released).
    """
    start = bisect_left(table, True, key=bool)
    if table[:start].count(NULL_BLOCK) == start:
        return table[start:]
    return table


class BlockPool:
    """All KV cache blocks of one engine, shared by every KV cache group.

    Args:
        num_blocks: Blocks in the pool, the null block included (>= 1).
        enable_caching: Keep full blocks in the prefix cache.
        hash_block_size: Tokens per entry of ``Request.block_hashes``; groups
            whose block size is a multiple of it look hashes up per block.
            ``None``: every group's block size equals the hash size.
        num_groups: Number of KV cache groups that will share the pool.
        enable_kv_cache_events: Queue KV cache events for :meth:`take_events`.
        group_kinds: Attention kind of each group, stamped on
            ``BlockStored`` events (``None``: events carry no kind).
        eviction: The eviction policy: a built-in name (default ``"lru"``,
            the reference engine's order) or a factory
            ``(PoolInfo) -> EvictionPolicy``.
        group_info: What the policy is told about each group (default: the
            kinds, block size 1, whole-prefix reads).
        alignment_tokens: Hit lengths are multiples of this (told to the policy).

    Attributes:
        policy: The eviction policy (read-only; the pool alone calls it).

    Raises:
        InvalidConfigError: ``num_blocks`` is not an integer >= 1, or the
            policy did not hand out the null block first.
        PoolTooLargeError: more blocks than int32 block ids address, or than
            the host has memory to keep track of.
    """

    __slots__ = (
        "_cached",
        "_dups",
        "_events",
        "_free",
        "_group",
        "_group_kinds",
        "_hash",
        "_log",
        "_lru",
        "_num_dropped",
        "_num_stored",
        "_ref",
        "_reserved",
        "_told",
        "_undo",
        "enable_caching",
        "enable_kv_cache_events",
        "hash_block_size",
        "num_blocks",
        "policy",
    )

    null_block: Final = NULL_BLOCK

    def __init__(
        self,
        num_blocks: int,
        *,
        enable_caching: bool = True,
        hash_block_size: int | None = None,
        num_groups: int = 1,
        enable_kv_cache_events: bool = False,
        group_kinds: Sequence[str] | None = None,
        eviction: str | EvictionPolicyFactory = DEFAULT_POLICY,
        group_info: Sequence[GroupInfo] | None = None,
        alignment_tokens: int = 1,
    ) -> None:
        if type(num_blocks) is not int or num_blocks < 1:
            msg = (
                f"num_blocks must be an integer >= 1 (block 0 is the null block), "
                f"got {num_blocks!r}"
            )
            raise InvalidConfigError(msg)
        _check_pool_size(num_blocks)
        if group_kinds is not None and len(group_kinds) != num_groups:
            msg = f"group_kinds has {len(group_kinds)} entries for {num_groups} groups"
            raise InvalidConfigError(msg)
        if group_info is not None and len(group_info) != num_groups:
            msg = f"group_info has {len(group_info)} entries for {num_groups} groups"
            raise InvalidConfigError(msg)
        factory = resolve_policy(eviction)
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self._group_kinds = tuple(group_kinds) if group_kinds is not None else None
        if group_info is None:
            kinds = self._group_kinds or (None,) * num_groups
            group_info = [GroupInfo(kind=kind) for kind in kinds]
        # Per group: hash -> the first cached block with that hash. Identical
        # blocks are not de-duplicated (block tables are append-only), so later
        # blocks with an already-cached hash wait in _dups, oldest first.
        # Made before the policy, which may keep references to the maps.
        self._cached: list[dict[Hashable, int]] = [{} for _ in range(num_groups)]
        self._dups: list[dict[Hashable, list[int]]] = [{} for _ in range(num_groups)]
        info = PoolInfo(
            num_blocks=num_blocks,
            groups=tuple(group_info),
            alignment_tokens=alignment_tokens,
            view=self,
        )
        self.policy: EvictionPolicy = build_policy(factory, info)
        # The built-in policies are the pool's fast path: the LRU queue and
        # the credit-queue policies give it their fused free-queue interface
        # (release_table, revive_table, ...) themselves. Any other policy
        # (a subclass of a built-in one included, since the fused paths would
        # bypass its overrides) goes through the protocol, behind a driver.
        # Every policy but the LRU queue is told what is cached and forgotten.
        self._lru: LRUFreeQueue | ValuePolicy | None
        self._free: LRUFreeQueue | ValuePolicy | PolicyDriver
        if type(self.policy) is LRUFreeQueue or type(self.policy) is ValuePolicy:
            self._lru = self._free = self.policy
        else:
            self._lru = None
            self._free = PolicyDriver(self.policy, num_blocks)
        self._told = None if type(self.policy) is LRUFreeQueue else self.policy
        taken = self._free.pop_n(1)
        if taken != [NULL_BLOCK]:
            msg = (
                f"eviction policy {type(self.policy).__name__} handed out block {taken} first; "
                "the first block taken from a fresh pool must be the null block 0 "
                "(never-allocated blocks go first, in id order)"
            )
            raise InvalidConfigError(msg)
        # Hashes ever given to blocks, and those dropped other than by
        # eviction: the difference with what is cached now is num_evicted.
        self._num_stored = 0
        self._num_dropped = 0
        self._ref: list[int] = [0] * num_blocks
        self._hash: list[Hashable | None] = [None] * num_blocks
        # The group each block was last cached in. With one group it is
        # always 0 and no hot path reads it: one byte per block. With
        # several, evictions read it per block, and a list reads faster.
        self._group: bytearray | list[int] = (
            bytearray(num_blocks) if num_groups == 1 else [0] * num_blocks
        )
        self._events: list[KVCacheEvent] = []
        self._reserved: list[int] = []
        # The undo log of the running transaction (shared with the free
        # queue), or None; _undo is the list reused by every transaction.
        self._undo: list[Undo] = []
        self._log: list[Undo] | None = None

    # -- transactions -----------------------------------------------------------------

    def begin(self) -> bool:
        """Start recording how to undo every change (for :meth:`rollback`).

        The pool of a :class:`~kvcore.KVCacheManager` records all the time:
        the manager forgets the records at the start of each of its
        operations and rolls back the operation that raised. Leave its
        transactions to it.

        Returns:
            ``True`` for the caller that started the transaction, which must
            end it with :meth:`commit` or :meth:`rollback`; ``False`` if one
            was already running (the changes join it).
        """
        if self._log is not None:
            return False
        self._log = self._free._log = self._undo
        return True

    def commit(self) -> None:
        """Keep every change since :meth:`begin` and stop recording."""
        self._log = self._free._log = None
        self._undo.clear()

    def rollback(self) -> None:
        """Undo every change since :meth:`begin`, newest first, and stop recording.

        Reference counts, free-queue order, the cache map, pending events and
        any table change recorded with :meth:`record` are as before.
        """
        log = self._undo
        self._log = self._free._log = None
        for undo, arguments in reversed(log):
            undo(*arguments)
        log.clear()

    def record(self, undo: Callable[..., None], *arguments: Any) -> None:
        """Add ``undo(*arguments)`` to the running transaction (no-op outside one).

        For state kept next to the pool, such as block tables: the rollback
        calls it, newest first, among the pool's own undo steps.
        """
        if self._log is not None:
            self._log.append((undo, arguments))

    def _undo_event(self) -> None:
        self._events.pop()

    def _append_event(self, event: KVCacheEvent) -> None:
        self._events.append(event)
        if self._log is not None:
            self._log.append((self._undo_event, ()))

    # -- argument checks --------------------------------------------------------------

    def _refuse_block(self, block: object) -> InvalidBlockError:
        msg = f"block {block!r} is not a block of this pool (ids 0..{self.num_blocks - 1})"
        return InvalidBlockError(msg)

    def _refuse_group(self, group: object) -> InvalidBlockError:
        msg = (
            f"kv_cache_group_id {group!r} is not a group of this pool "
            f"(ids 0..{len(self._cached) - 1})"
        )
        return InvalidBlockError(msg)

    def _check_blocks(self, blocks: Sequence[int]) -> None:
        """Every entry is a block id of this pool (the null block included); O(len).

        Three C-level passes for the common case; a Python walk only to name
        the culprit.
        """
        if not blocks:
            return
        try:
            valid = (
                min(blocks) >= 0 and max(blocks) < self.num_blocks and {*map(type, blocks)} == _INT
            )
        except TypeError:
            valid = False
        if not valid:
            num_blocks = self.num_blocks
            for block in blocks:
                if block.__class__ is not int or not 0 <= block < num_blocks:
                    raise self._refuse_block(block)

    @staticmethod
    def _check_count(num_blocks: object) -> None:
        if num_blocks.__class__ is not int or num_blocks < 0:
            msg = f"num_blocks must be an integer >= 0, got {num_blocks!r}"
            raise InvalidBlockError(msg)

    # -- capacity -------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, including evictable cached ones)."""
        return self._free.num_free

    @property
    def num_evicted(self) -> int:
        """Cached blocks taken for new allocations so far (their contents lost); O(num_blocks)."""
        return self._num_stored - self._num_dropped - self.num_cached_blocks()

    def get_num_free_blocks(self) -> int:
        """Blocks that can be allocated now (free, including evictable cached ones)."""
        return self._free.num_free

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) not free, 0.0–1.0."""
        usable = self.num_blocks - 1
        if not usable:
            return 0.0
        return 1.0 - self._free.num_free / usable

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks set aside for good by :meth:`reserve_blocks`."""
        return len(self._reserved)

    # -- prefix cache lookups ---------------------------------------------------------

    def get_cached_block(
        self, block_hash: Hashable, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """Return one cached block per group for ``block_hash``, or ``None``.

        A hit requires every listed group to hold a block with this hash; with
        several identical blocks in a group, the one cached first is returned.
        """
        out = []
        for group_id in kv_cache_group_ids:
            block = self._cached[group_id].get(block_hash)
            if block is None:
                return None
            out.append(block)
        return out

    def match_prefix(
        self,
        block_hashes: Sequence[Hashable],
        start: int,
        stop: int,
        kv_cache_group_ids: Sequence[int],
    ) -> tuple[list[int], ...]:
        """Look up ``block_hashes[start:stop]`` left to right until the first miss.

        Returns one list per group id with the blocks of the run of hits that
        starts at ``start`` (all lists have the same length).
        """
        if len(kv_cache_group_ids) == 1:
            get = self._cached[kv_cache_group_ids[0]].get
            hits: list[int] = []
            append = hits.append
            for block in map(get, block_hashes[start:stop]):
                if block is None:
                    break
                append(block)
            return (hits,)
        maps = [self._cached[g] for g in kv_cache_group_ids]
        per_group: tuple[list[int], ...] = tuple([] for _ in maps)
        for block_hash in block_hashes[start:stop]:
            found = [m.get(block_hash) for m in maps]
            if None in found:
                break
            for blocks, block in zip(per_group, found, strict=True):
                blocks.append(block)  # type: ignore[arg-type]
        return per_group

    # -- caching ------------------------------------------------------------------

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """Enter blocks ``[num_cached_blocks, num_full_blocks)`` of a request in the cache.

        Each block gets the request's hash for its position (viewed at
        ``block_size``); null blocks are skipped. With events on, queues one
        :class:`BlockStored` for the whole range.

        Args:
            request: The request the blocks belong to; its ``block_hashes``
                must cover ``num_full_blocks`` blocks of ``block_size``.
            blocks: The request's block table in this group.
            num_cached_blocks: Blocks of the table already cached.
            num_full_blocks: Blocks of the table that are full after this call.
            block_size: Tokens per block in this group.
            kv_cache_group_id: The group the table belongs to.

        Raises:
            InvalidRequestError: the request's hashes do not cover
                ``num_full_blocks`` blocks.
            InvalidBlockError: a bad group id, block range, block id, or a
                block of the range that is already cached. Nothing changes.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if not 0 <= kv_cache_group_id < len(self._cached):
            raise self._refuse_group(kv_cache_group_id)
        if num_cached_blocks < 0 or num_full_blocks > len(blocks):
            msg = (
                f"blocks {num_cached_blocks}..{num_full_blocks - 1} are not all in the "
                f"{len(blocks)}-block table"
            )
            raise InvalidBlockError(msg)
        new = blocks[num_cached_blocks:num_full_blocks]
        self._check_blocks(new)
        # The null block never carries a hash: every entry must be None.
        block_hash_of = self._hash
        if list(map(block_hash_of.__getitem__, new)).count(None) != len(new):
            block = next(b for b in new if block_hash_of[b] is not None)
            msg = f"block {block} is already cached; a block is cached once, when it is full"
            raise InvalidBlockError(msg)
        self._cache_full_blocks(
            request, blocks, num_cached_blocks, num_full_blocks, block_size, kv_cache_group_id
        )

    def _cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """:meth:`cache_full_blocks` for the managers' own tables: no checks of the blocks."""
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = request.block_hashes
        if self.hash_block_size is not None and block_size != self.hash_block_size:
            hashes = hashes_at_block_size(hashes, self.hash_block_size, block_size)  # type: ignore[assignment]
        if len(hashes) < num_full_blocks:
            msg = (
                f"request {request.request_id!r} has hashes for {len(hashes)} blocks, "
                f"cannot cache {num_full_blocks}"
            )
            raise InvalidRequestError(msg)
        block_hash_of = self._hash
        group_of = self._group
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        self._num_stored += len(new_blocks) - new_blocks.count(0)
        if self._log is not None:
            # With one group every block's group stays 0: nothing to restore.
            old_groups = (
                list(map(group_of.__getitem__, new_blocks)) if len(self._cached) > 1 else None
            )
            self._log.append((self._undo_cache, (new_blocks, old_groups, kv_cache_group_id)))
        cached_first = self._cached[kv_cache_group_id].setdefault
        dups = self._dups[kv_cache_group_id]
        new_hashes = hashes[num_cached_blocks:num_full_blocks]
        # One pass, null blocks skipped; with one group every block's group
        # is already 0.
        if len(self._cached) == 1:
            for block, block_hash in zip(new_blocks, new_hashes, strict=True):
                if block:
                    block_hash_of[block] = block_hash
                    if cached_first(block_hash, block) != block:
                        dups.setdefault(block_hash, []).append(block)
        else:
            for block, block_hash in zip(new_blocks, new_hashes, strict=True):
                if block:
                    block_hash_of[block] = block_hash
                    group_of[block] = kv_cache_group_id
                    if cached_first(block_hash, block) != block:
                        dups.setdefault(block_hash, []).append(block)
        told = self._told
        if told is not None:
            # A protocol-driven policy learns what was cached (undone by ``forget``).
            told.cached(
                kv_cache_group_id,
                blocks,
                num_cached_blocks,
                num_full_blocks,
                hashes,
                request.num_prompt_tokens,
            )
            if self._log is not None:
                # A built-in policy skips null blocks itself; the protocol
                # never passes them to ``forget``.
                forgotten = new_blocks if told is self._lru else [b for b in new_blocks if b]
                self._log.append((told.forget, (forgotten,)))
        if self.enable_kv_cache_events:
            stored = list(compress(new_hashes, new_blocks))
            kinds = self._group_kinds
            self._append_event(
                BlockStored(
                    block_hashes=stored,
                    parent_block_hash=hashes[num_cached_blocks - 1] if num_cached_blocks else None,
                    token_ids=request._all_token_ids[
                        num_cached_blocks * block_size : num_full_blocks * block_size
                    ],
                    block_size=block_size,
                    lora_id=request.lora_id,
                    lora_name=request.lora_name,
                    group_idx=kv_cache_group_id,
                    kind=kinds[kv_cache_group_id] if kinds is not None else None,
                )
            )

    def _undo_cache(self, blocks: list[int], old_groups: list[int] | None, group: int) -> None:
        # Newest first: a block is the primary entry of its hash unless it
        # was added after one, and then it is the last of the duplicates.
        self._num_stored -= len(blocks) - blocks.count(0)
        block_hash_of = self._hash
        group_of = self._group
        cached = self._cached[group]
        dups = self._dups[group]
        for index in range(len(blocks) - 1, -1, -1):
            block = blocks[index]
            if not block:
                continue
            block_hash = block_hash_of[block]
            if cached.get(block_hash) == block:
                del cached[block_hash]
            else:
                waiting = dups[block_hash]
                waiting.pop()
                if not waiting:
                    del dups[block_hash]
            block_hash_of[block] = None
            if old_groups is not None:
                group_of[block] = old_groups[index]

    def _uncache(self, block: int) -> None:
        """Drop ``block``'s hash from the map; the caller knows it has one."""
        block_hash = self._hash[block]
        group = self._group[block]
        cached = self._cached[group]
        dups = self._dups[group]
        promoted = position = None
        if cached.get(block_hash) == block:
            waiting = dups.get(block_hash)
            if waiting:
                promoted = cached[block_hash] = waiting.pop(0)
                if not waiting:
                    del dups[block_hash]
            else:
                del cached[block_hash]
        else:
            waiting = dups[block_hash]
            position = waiting.index(block)
            del waiting[position]
            if not waiting:
                del dups[block_hash]
        self._hash[block] = None
        if self._log is not None:
            self._log.append((self._undo_uncache, (block, block_hash, promoted, position)))
        if self.enable_kv_cache_events:
            self._append_event(BlockRemoved(block_hashes=(block_hash,), group_idx=group))

    def _undo_uncache(
        self, block: int, block_hash: Hashable, promoted: int | None, position: int | None
    ) -> None:
        group = self._group[block]
        cached = self._cached[group]
        if position is None:
            cached[block_hash] = block
            if promoted is not None:
                self._dups[group].setdefault(block_hash, []).insert(0, promoted)
        else:
            self._dups[group].setdefault(block_hash, []).insert(position, block)
        self._hash[block] = block_hash

    # -- allocation -----------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the head of the free queue, ref count 1.

        A taken block that was still cached is evicted first (its hash leaves
        the map; with events on, a :class:`BlockRemoved` is queued).

        Raises:
            InvalidBlockError: ``num_blocks`` is not an integer >= 0.
            OutOfBlocksError: fewer than ``num_blocks`` blocks are free; nothing
                changes.
        """
        if num_blocks.__class__ is not int or num_blocks < 0:
            self._check_count(num_blocks)
        # The victims come from the policy (the LRU queue itself, or the
        # driver in front of any other policy); evicting them is the same.
        blocks = self._free.pop_n(num_blocks)
        ref = self._ref
        log = self._log
        if not self.enable_caching:
            if log is not None:
                log.append((self._undo_new, (blocks, None)))
            for block in blocks:
                ref[block] = 1
            return blocks
        block_hash_of = self._hash
        if self.enable_kv_cache_events:
            # An event per evicted block, in order: evict one by one.
            if log is not None:
                log.append((self._undo_new, (blocks, None)))
            uncache = self._uncache
            for block in blocks:
                if block_hash_of[block] is not None:
                    uncache(block)
                ref[block] = 1
            return blocks
        if any(self._dups):
            self._evict_mixed(blocks)
            return blocks
        # The common case: every cached block taken is the only one under its
        # hash, and nobody wants an event; the undo needs only the old hashes.
        if log is not None:
            old_hashes = list(map(block_hash_of.__getitem__, blocks))
            log.append((self._undo_new, (blocks, old_hashes)))
        cached = self._cached
        if len(cached) == 1:
            # One group: the map to evict from is known.
            only_map = cached[0]
            for block in blocks:
                block_hash = block_hash_of[block]
                if block_hash is not None:
                    del only_map[block_hash]
                    block_hash_of[block] = None
                ref[block] = 1
            return blocks
        group_of = self._group
        for block in blocks:
            block_hash = block_hash_of[block]
            if block_hash is not None:
                del cached[group_of[block]][block_hash]
                block_hash_of[block] = None
            ref[block] = 1
        return blocks

    def _evict_mixed(self, blocks: list[int]) -> None:
        """Give ``blocks`` (just taken from the queue) count 1, evicting the cached ones.

        Duplicates wait somewhere in the map: a block that is the only one
        under its hash leaves the map inline (one undo record for all of
        them, added last so that it is undone first); a block with
        duplicates goes through :meth:`_uncache`, which promotes the oldest.
        """
        ref = self._ref
        block_hash_of = self._hash
        group_of = self._group
        cached = self._cached
        dups = self._dups
        log = self._log
        if log is not None:
            log.append((self._undo_new, (blocks, None)))
        inline: list[int] = []
        inline_hashes: list[Hashable] = []
        for block in blocks:
            block_hash = block_hash_of[block]
            if block_hash is not None:
                group = group_of[block]
                if block_hash in dups[group] or cached[group].get(block_hash) != block:
                    self._uncache(block)
                else:
                    del cached[group][block_hash]
                    block_hash_of[block] = None
                    inline.append(block)
                    inline_hashes.append(block_hash)
            ref[block] = 1
        if log is not None and inline:
            # No later eviction of this call touches these hashes: a block
            # evicted inline was the last under its hash in its group.
            log.append((self._undo_new, (inline, inline_hashes, False)))

    def _undo_new(
        self,
        blocks: list[int],
        old_hashes: list[Hashable | None] | None,
        reset_counts: bool = True,
    ) -> None:
        if reset_counts:
            ref = self._ref
            for block in blocks:
                ref[block] = 0
        if old_hashes is None:
            return
        block_hash_of = self._hash
        group_of = self._group
        cached = self._cached
        for block, block_hash in zip(blocks, old_hashes, strict=True):
            if block_hash is not None:
                block_hash_of[block] = block_hash
                cached[group_of[block]][block_hash] = block

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks, reviving free ones from the queue.

        Null blocks in ``blocks`` are ignored. A free block that was never
        allocated is taken out of the queue too (it will not be handed out).

        Raises:
            InvalidBlockError: an entry is not a block id of this pool;
                nothing changes.
        """
        self._check_blocks(blocks)
        self._touch(list(blocks))

    def _touch(self, blocks: Sequence[int]) -> None:
        """:meth:`touch` for checked blocks (kept, not copied, for the undo)."""
        lru = self._lru
        if lru is None:
            self._touch_via_policy(blocks)
            return
        ref = self._ref
        if self._log is not None:
            self._log.append((self._undo_touch, (blocks,)))
        # The null block's count is not maintained: raised for the pass so
        # that it is never taken for a free block, then 0 again.
        ref[NULL_BLOCK] = len(blocks) + 2
        lru.revive_table(ref, blocks)
        ref[NULL_BLOCK] = 0

    def _touch_via_policy(self, blocks: Sequence[int]) -> None:
        """:meth:`_touch` with a protocol-driven policy: revivals, then the hit."""
        ref = self._ref
        if self._log is not None:
            self._log.append((self._undo_touch, (blocks,)))
        revived = []
        for block in blocks:
            if block:
                count = ref[block]
                if count == 0:
                    revived.append(block)
                ref[block] = count + 1
        if revived:
            self._free.remove_blocks(revived)
        self.policy.hit(blocks)

    def _undo_touch(self, blocks: Sequence[int]) -> None:
        ref = self._ref
        for block in blocks:
            if block:
                ref[block] -= 1

    def free_blocks(self, ordered_blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue.

        Blocks are queued in the given order, so pass the block to evict first
        first (managers pass a request's blocks last to first). Null blocks are
        ignored. On an error no reference count or queue position changes.

        Raises:
            InvalidBlockError: an entry is not a block id of this pool.
            DoubleFreeError: a block had no reference left.
        """
        self._check_blocks(ordered_blocks)
        self._free_blocks(list(ordered_blocks))

    def _free_blocks(self, ordered_blocks: Sequence[int]) -> None:
        """:meth:`free_blocks` for the managers' own tables (kept, not copied, for the undo).

        The same code serves every policy: ``self._free`` is the LRU queue or
        the driver that hands the released blocks to the policy.
        """
        ref = self._ref
        released = []
        for position, block in enumerate(ordered_blocks):
            if block:
                count = ref[block] - 1
                if count < 0:
                    for earlier in ordered_blocks[:position]:
                        if earlier:
                            ref[earlier] += 1
                    msg = (
                        f"block {block} was freed more often than it was allocated "
                        "(its reference count is already 0)"
                    )
                    raise DoubleFreeError(msg)
                ref[block] = count
                if count == 0:
                    released.append(block)
        if self._log is not None:
            self._log.append((self._undo_free, (ordered_blocks,)))
        if released:
            self._free.push(released)

    def _free_table(self, table: Sequence[int]) -> None:
        """Free a manager's own block table (token order), last block first, in one pass.

        What :meth:`_free_blocks` does with ``table[::-1]``, without the copy
        and in one pass: the free queue decrements each count and links the
        blocks reaching 0 at once; a double free is noticed off the released
        blocks' path (a count below 0) and undone. A table never holds a
        block twice (null blocks aside), and is not empty.

        Raises:
            DoubleFreeError: a block of the table has no reference left;
                nothing changes.
        """
        ref = self._ref
        if not table[0]:
            table = _without_leading_nulls(table)
        # The null block's count is not maintained: raised for the pass so
        # that no decrement brings it to 0, then 0 again.
        ref[NULL_BLOCK] = len(table) + 2
        lru = self._lru
        released = None
        if lru is not None:
            double_freed = lru.release_table(ref, table)
        else:
            double_freed, released = self._decrement_table(table)
        ref[NULL_BLOCK] = 0
        if double_freed is not None:
            msg = (
                f"block {double_freed} was freed more often than it was allocated "
                "(its reference count is already 0)"
            )
            raise DoubleFreeError(msg)
        if self._log is not None:
            self._log.append((self._undo_free, (table,)))
        if released:
            # Told after the counts' undo is recorded: a policy that raises
            # leaves nothing the rollback cannot restore.
            self._free.push(released)

    def _decrement_table(self, table: Sequence[int]) -> tuple[int | None, list[int]]:
        """Drop one count per block of ``table``, last first, for a protocol-driven policy.

        Returns ``(None, released)``: the blocks that reached 0, in the order
        the policy is to be told (as :meth:`_free_blocks` would collect them
        from ``table[::-1]``); or ``(block, [])`` for a block whose count was
        already 0, with every count restored.
        """
        released: list[int] = []
        double_freed = count_down(self._ref, reversed(table), released, table)
        if double_freed is not None:
            return double_freed, []
        return None, released

    def _undo_free(self, blocks: Sequence[int]) -> None:
        ref = self._ref
        for block in blocks:
            if block:
                ref[block] += 1

    def reserve_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks out of circulation for the pool's lifetime.

        For state every request shares and nobody frees (e.g. attention-sink
        keys and values). Reserved blocks are never cached, freed or evicted.

        Raises:
            InvalidBlockError: ``num_blocks`` is not an integer >= 0.
            OutOfBlocksError: not enough free blocks.
        """
        blocks = self.get_new_blocks(num_blocks)
        self._reserved.extend(blocks)
        if self._log is not None:
            self._log.append((self._undo_reserve, (len(blocks),)))
        return blocks

    def _undo_reserve(self, count: int) -> None:
        del self._reserved[len(self._reserved) - count :]

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Remove the given blocks from the prefix cache (even if in use).

        For cached contents known to be invalid (e.g. a failed KV load). The
        blocks themselves are not freed. Uncached blocks are ignored.

        Raises:
            InvalidBlockError: an id is not a block of this pool; nothing
                changes.
        """
        blocks = list(block_ids)
        self._check_blocks(blocks)
        forgotten = []
        for block in blocks:
            if self._hash[block] is not None:
                self._uncache(block)
                forgotten.append(block)
        if forgotten:
            self._num_dropped += len(forgotten)
            self.record(self._undo_dropped, len(forgotten))
            if self._told is not None:
                # Not undone: a policy cannot be told a block regained its hash.
                self.policy.forget(forgotten)

    def _undo_dropped(self, count: int) -> None:
        self._num_dropped -= count

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, if no request holds a block.

        Returns:
            ``True`` if the cache was cleared (an :class:`AllBlocksCleared`
            event is queued), ``False`` if some block is still in use; then
            nothing changes.
        """
        in_use = self.num_blocks - 1 - len(self._reserved) - self._free.num_free
        if in_use:
            return False
        for cached in self._cached:
            cached.clear()
        for dups in self._dups:
            dups.clear()
        self._num_dropped += self.num_cached_blocks()
        self._hash = [None] * self.num_blocks
        if self._told is not None:
            self.policy.forget(None)
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """Return the queued events, oldest first, and clear the queue."""
        events = self._events
        self._events = []
        return events

    def peek_events(self) -> tuple[KVCacheEvent, ...]:
        """The queued events, oldest first, left in the queue (a snapshot)."""
        return tuple(self._events)

    # -- inspection -------------------------------------------------------------------

    def count_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free (cached, waiting in the free queue).

        Adopting such a cache hit takes the block out of the free queue, so an
        allocation must count it against the free capacity. Null blocks are
        not counted.
        """
        # The null block's count is never maintained and stays 0, so every null
        # in `blocks` shows up among the zeros: subtract them.
        return list(map(self._ref.__getitem__, blocks)).count(0) - blocks.count(NULL_BLOCK)

    def ref_count(self, block: int) -> int:
        """Requests holding ``block`` (0 for a free block; not kept for the null block).

        Raises:
            InvalidBlockError: ``block`` is not a block id of this pool.
        """
        if block.__class__ is not int or not 0 <= block < self.num_blocks:
            raise self._refuse_block(block)
        return self._ref[block]

    def block_hash(self, block: int) -> Hashable | None:
        """The hash ``block`` is cached under, or ``None``.

        Raises:
            InvalidBlockError: ``block`` is not a block id of this pool.
        """
        if block.__class__ is not int or not 0 <= block < self.num_blocks:
            raise self._refuse_block(block)
        return self._hash[block]

    def block_group(self, block: int) -> int:
        """The KV cache group ``block`` was last cached in (0 if it never was).

        Raises:
            InvalidBlockError: ``block`` is not a block id of this pool.
        """
        if block.__class__ is not int or not 0 <= block < self.num_blocks:
            raise self._refuse_block(block)
        return self._group[block]

    def _group_map(self, group: int) -> dict[Hashable, int]:
        """The prefix-cache map of ``group``.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        if group.__class__ is not int or not 0 <= group < len(self._cached):
            raise self._refuse_group(group)
        return self._cached[group]

    def is_cached(self, block_hash: Hashable, group: int) -> bool:
        """Whether some block of ``group`` is cached under ``block_hash``.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        return block_hash in self._group_map(group)

    def cached_block(self, block_hash: Hashable, group: int) -> int | None:
        """The block of ``group`` a lookup of ``block_hash`` finds, or ``None``.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        return self._group_map(group).get(block_hash)

    def cached_blocks(self, block_hash: Hashable, group: int) -> list[int]:
        """Every block of ``group`` cached under ``block_hash``, the one a lookup finds first.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        first = self._group_map(group).get(block_hash)
        if first is None:
            return []
        return [first, *self._dups[group].get(block_hash, ())]

    def free_block_ids(self) -> list[int]:
        """The free blocks in the policy's order: the next block to be allocated first."""
        return list(self._free)

    def num_cached_blocks(self) -> int:
        """Blocks currently in the prefix cache (in use or evictable)."""
        return sum(1 for block_hash in self._hash if block_hash is not None)

    def check_invariants(self) -> None:
        """Verify the pool's internal consistency; O(num_blocks), for tests.

        Raises:
            AssertionError: naming the first violated invariant.
        """
        free: list[int] = []
        free_set: set[int] = set()
        for block in self._free:
            # A linked queue's cycle would make the walk endless: stop at the
            # first repeat.
            if block in free_set:
                msg = f"the free queue lists block {block} twice"
                raise AssertionError(msg)
            free.append(block)
            free_set.add(block)
        if len(free) != self._free.num_free:
            msg = f"free count {self._free.num_free} but {len(free)} blocks in the free queue"
            raise AssertionError(msg)
        if NULL_BLOCK in free_set:
            msg = "the null block is in the free queue"
            raise AssertionError(msg)
        if self._hash[NULL_BLOCK] is not None:
            msg = "the null block is cached"
            raise AssertionError(msg)
        reserved = set(self._reserved)
        for block in range(1, self.num_blocks):
            in_queue = block in free_set
            if (self._ref[block] == 0) != in_queue:
                msg = f"block {block}: ref count {self._ref[block]} but in_queue={in_queue}"
                raise AssertionError(msg)
            if block in reserved and (in_queue or self._hash[block] is not None):
                msg = f"reserved block {block} is free or cached"
                raise AssertionError(msg)
        seen = 0
        for group, cached in enumerate(self._cached):
            entries = [(h, b) for h, b in cached.items()]
            entries += [(h, b) for h, bs in self._dups[group].items() for b in bs]
            for block_hash, block in entries:
                if self._hash[block] != block_hash or self._group[block] != group:
                    msg = f"map entry {block_hash!r} (group {group}) -> block {block} mismatch"
                    raise AssertionError(msg)
            seen += len(entries)
        if seen != self.num_cached_blocks():
            msg = f"{self.num_cached_blocks()} blocks carry a hash but the map has {seen}"
            raise AssertionError(msg)
