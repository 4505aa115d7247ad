"""The block pool: block ids, reference counts, the prefix cache map, events.

Blocks are plain integers ``0 .. num_blocks - 1``. Per-block state lives in
parallel sequences indexed by block id (reference count, cached hash, the
group it was cached in), not in one object per block: building a pool of a
million blocks is a handful of allocations, and the allocation path indexes
lists instead of reading object attributes.

Block 0 is the *null block* (:data:`~kvcore._blocks.NULL_BLOCK`): a
placeholder in block tables (for positions a windowed attention type no
longer needs). It is never handed out, cached, freed or evicted, and its
reference count is not maintained.

Which free block is handed out next is not decided here: the pool owns a free
queue (:mod:`kvcore._eviction.queue`), built from the eviction policy it is
given, and asks it, and only it, for victims. The pool counts the free blocks
itself, so capacity never depends on a policy.

Public methods check their arguments in O(1) or O(blocks given) and either
complete or change nothing. The methods with a leading underscore are the
same operations for kvcore's own managers, on tables and hits already
checked. Every change made inside :meth:`BlockPool.transaction` records how
to reverse it, so that the engine-facing manager can undo a whole operation
that a plugin manager failed half-way through.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator, Sequence
from itertools import chain, compress
from operator import itemgetter, length_hint
from types import TracebackType
from typing import Any, ClassVar, Final, Protocol

from kvcore._blocks import MAX_NUM_BLOCKS, NULL_BLOCK, UndoLog
from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore._eviction.queue import FreeQueue
from kvcore._eviction.registry import DEFAULT_POLICY, QueueFactory, resolve_policy
from kvcore._hashing import hashes_at_block_size
from kvcore._request import Request
from kvcore._utils import format_bytes
from kvcore.errors import (
    DoubleFreeError,
    InvalidBlockError,
    InvalidConfigError,
    InvalidRequestError,
    OutOfBlocksError,
    PoolTooLargeError,
)
from kvcore.eviction import EvictionPolicyFactory, GroupInfo, PoolInfo

__all__ = [
    "MAX_NUM_BLOCKS",
    "NULL_BLOCK",
    "BlockPool",
    "Transaction",
    "available_host_memory",
    "out_of_blocks",
]

_INT: Final = {int}

# Host memory per block for the pool's bookkeeping: four list slots (reference
# count, hash, and the free queue's entries) of 8 bytes each, and the group.
_BYTES_PER_BLOCK: Final = 40
# Pools needing less than this are not checked against the host's memory.
_CHECK_HOST_MEMORY_ABOVE: Final = 2**28


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


def _check_pool_size(num_blocks: object) -> None:
    if type(num_blocks) is not int or num_blocks < 1:
        msg = f"num_blocks must be an integer >= 1 (block 0 is the null block), got {num_blocks!r}"
        raise InvalidConfigError(msg)
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


def out_of_blocks(num_blocks: int, num_free: int) -> OutOfBlocksError:
    """The error of a pool asked for ``num_blocks`` blocks with only ``num_free`` free."""
    return OutOfBlocksError(f"cannot take {num_blocks} blocks: only {num_free} are free")


class _Journaled(Protocol):
    """A pool whose changes a :class:`Transaction` keeps or undoes."""

    def _begin(self) -> bool: ...
    def _commit(self) -> None: ...
    def _rollback(self) -> None: ...


class Transaction:
    """A ``with`` block whose pool changes are kept on success and undone on error.

    Made once per pool (``pool`` is the block pool whose changes it keeps or
    undoes) and handed out by :meth:`BlockPool.transaction` for every block,
    so entering one allocates nothing. Entered again while it runs, or while
    another transaction of the same pool runs, it joins that one: the
    outermost block decides.
    """

    __slots__ = ("_depth", "_owner", "_pool")

    def __init__(self, pool: object) -> None:
        # Typed loosely for the docs, which know no private protocol: both
        # kinds of block pool qualify.
        self._pool: _Journaled = pool  # type: ignore[assignment]
        self._depth = 0
        self._owner = False

    def __enter__(self) -> Transaction:
        if not self._depth:
            self._owner = self._pool._begin()
        self._depth += 1
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._depth -= 1
        if self._depth or not self._owner:
            return
        self._owner = False
        if exc_type is None:
            self._pool._commit()
        else:
            self._pool._rollback()


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
        digest_size: Every hash this pool will cache is a ``bytes`` of this
            many bytes (1..64; what a hasher of a fixed digest makes), or
            ``None`` (default): any hashable. The native pool then keeps its
            prefix map as digests in flat arrays and refuses other hashes;
            this pool records it and accepts any hashable.
        int_hashes: Every hash this pool will cache is an ``int`` in the
            signed 64-bit range (what the ``"fast"`` hasher makes). The
            native pool then keeps its prefix map in flat arrays too, each
            hash as 8 bytes; this pool records it. Not with ``digest_size``.

    Raises:
        InvalidConfigError: ``num_blocks`` is not an integer >= 1, the
            policy did not hand out the null block first, ``digest_size``
            is neither ``None`` nor an int in 1..64, or both ``digest_size``
            and ``int_hashes`` are given.
        PoolTooLargeError: more blocks than int32 block ids address, or than
            the host has memory to keep track of.
        UnknownEvictionPolicyError: no policy has the name ``eviction``.
    """

    __slots__ = (
        "_cached",
        "_dups",
        "_events",
        "_group",
        "_group_kinds",
        "_hash",
        "_journal",
        "_num_dropped",
        "_num_free",
        "_num_stored",
        "_queue",
        "_ref",
        "_reserved",
        "_transaction",
        "_undo_steps",
        "digest_size",
        "enable_caching",
        "enable_kv_cache_events",
        "hash_block_size",
        "int_hashes",
        "num_blocks",
    )

    null_block: Final = NULL_BLOCK
    #: Which backend serves this pool, ``"python"`` (this class) or ``"native"``.
    backend: ClassVar[str] = "python"
    # Whether every block starts free (a page class of a two-level pool starts
    # with none: its blocks exist only where memory is carved for it).
    _FREE_AT_START: bool = True

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
        digest_size: int | None = None,
        int_hashes: bool = False,
    ) -> None:
        _check_pool_size(num_blocks)
        if digest_size is not None and (type(digest_size) is not int or not 1 <= digest_size <= 64):
            msg = f"digest_size must be None or an int in 1..64 (bytes), got {digest_size!r}"
            raise InvalidConfigError(msg)
        if int_hashes is not False and (int_hashes is not True or digest_size is not None):
            msg = (
                f"int_hashes must be True or False, and not given with digest_size; got "
                f"int_hashes={int_hashes!r}, digest_size={digest_size!r}"
            )
            raise InvalidConfigError(msg)
        self.digest_size = digest_size
        self.int_hashes = int_hashes
        for name, value in (("group_kinds", group_kinds), ("group_info", group_info)):
            if value is not None and len(value) != num_groups:
                msg = f"{name} has {len(value)} entries for {num_groups} groups"
                raise InvalidConfigError(msg)
        factory = resolve_policy(eviction)
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.hash_block_size = hash_block_size
        self.enable_kv_cache_events = enable_kv_cache_events
        self._group_kinds = tuple(group_kinds) if group_kinds is not None else None
        if group_info is None:
            group_info = [
                GroupInfo(kind=kind) for kind in self._group_kinds or (None,) * num_groups
            ]
        # Per group: hash -> the first cached block with that hash. Identical
        # blocks are not de-duplicated (block tables are append-only), so later
        # blocks with an already-cached hash wait in _dups, oldest first.
        self._cached: list[dict[Hashable, int]] = [{} for _ in range(num_groups)]
        self._dups: list[dict[Hashable, list[int]]] = [{} for _ in range(num_groups)]
        self._ref: list[int] = [0] * num_blocks
        self._hash: list[Hashable | None] = [None] * num_blocks
        # The group each block was last cached in: a byte a block where it fits.
        self._group: bytearray | list[int] = (
            bytearray(num_blocks) if num_groups <= 256 else [0] * num_blocks
        )
        self._events: list[KVCacheEvent] = []
        self._reserved: list[int] = []
        # Hashes ever given to blocks, and those dropped other than by
        # eviction: the difference with what is cached now is num_evicted.
        self._num_stored = 0
        self._num_dropped = 0
        # The undo log of the running transaction, or None; _undo_steps is
        # the list every transaction reuses.
        self._undo_steps: UndoLog = []
        self._transaction = Transaction(self)
        self._journal: UndoLog | None = None
        info = PoolInfo(
            num_blocks=num_blocks,
            groups=tuple(group_info),
            alignment_tokens=alignment_tokens,
            view=self,
            free_at_start=self._FREE_AT_START,
        )
        self._queue: FreeQueue = self._new_queue(factory, info)
        self._num_free = 0
        if self._FREE_AT_START:
            self._num_free = num_blocks
            self._take_null_block(factory.name)

    def _new_queue(self, factory: QueueFactory, info: PoolInfo) -> FreeQueue:
        """The free queue the policy's factory makes (the per-block state is set up by now)."""
        return factory(info)

    def _take_null_block(self, policy: str) -> None:
        taken = self._take(1)
        if taken != [NULL_BLOCK]:
            msg = (
                f"eviction policy {policy} handed out block {taken} first; the first block "
                "taken from a fresh pool must be the null block 0 (never-allocated blocks "
                "go first, in id order)"
            )
            raise InvalidConfigError(msg)
        self._ref[NULL_BLOCK] = 0

    # -- transactions -----------------------------------------------------------------

    def transaction(self) -> Transaction:
        """A ``with`` block whose changes all stay, or none (on an exception).

        Reference counts, free-queue contents, the cache map, pending events
        and every change recorded with :meth:`record` are restored when the
        block raises; the exception goes on. Inside a running transaction it
        joins that one.
        """
        return self._transaction

    def record(self, undo: Callable[..., None], *arguments: Any) -> None:
        """Add ``undo(*arguments)`` to the running transaction (no-op outside one).

        For state kept next to the pool, such as block tables: a rollback
        calls it, newest first, among the pool's own undo steps.
        """
        if self._journal is not None:
            self._journal.append((undo, arguments))

    def _begin(self) -> bool:
        """Start recording; ``False`` if a transaction already runs (the changes join it)."""
        if self._journal is not None:
            return False
        self._journal = self._queue.journal = self._undo_steps
        return True

    def _commit(self) -> None:
        self._journal = self._queue.journal = None
        self._undo_steps.clear()

    def _rollback(self) -> None:
        steps = self._undo_steps
        self._journal = self._queue.journal = None
        for undo, arguments in reversed(steps):
            undo(*arguments)
        steps.clear()

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
            for block in blocks:
                if block.__class__ is not int or not 0 <= block < self.num_blocks:
                    raise self._refuse_block(block)

    def _check_block(self, block: object) -> int:
        if type(block) is int and 0 <= block < self.num_blocks:
            return block
        raise self._refuse_block(block)

    def _check_group(self, group: object) -> int:
        if type(group) is int and 0 <= group < len(self._cached):
            return group
        raise self._refuse_group(group)

    # -- capacity ---------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (free, including evictable cached ones)."""
        return self._num_free

    def get_num_free_blocks(self) -> int:
        """Blocks that can be allocated now (free, including evictable cached ones)."""
        return self._num_free

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) not free, 0.0–1.0."""
        usable = self.num_blocks - 1
        return 1.0 - self._num_free / usable if usable else 0.0

    @property
    def num_in_use(self) -> int:
        """Blocks held by requests or reserved (the null block not counted)."""
        return self.num_blocks - 1 - self._num_free

    def make_room(self, demand: Sequence[int], keep: Sequence[Sequence[int]]) -> bool:
        """Whether an allocation taking ``demand[g]`` blocks in each group ``g`` fits now.

        One shared pool: the blocks summed over groups against the free
        blocks. ``keep`` (the hits it adopts, per group) is for a pool that
        moves memory between groups' pages; here it is not needed. Changes
        nothing.
        """
        return sum(demand) <= self._num_free

    def pool_of(self, group: int) -> BlockPool:
        """The pool holding group ``group``'s blocks: this one, shared by every group."""
        return self

    @property
    def num_evicted(self) -> int:
        """Cached blocks taken for new allocations so far (their contents lost); O(num_blocks)."""
        return self._num_stored - self._num_dropped - self.num_cached_blocks()

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks set aside for good by :meth:`reserve_blocks`."""
        return len(self._reserved)

    # -- taking blocks ----------------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks from the head of the free queue, ref count 1.

        A taken block that was still cached is evicted first (its hash leaves
        the map; with events on, a :class:`~kvcore.events.BlockRemoved` is queued).

        Raises:
            InvalidBlockError: ``num_blocks`` is not an integer >= 0.
            OutOfBlocksError: fewer than ``num_blocks`` blocks are free; nothing
                changes.
        """
        if num_blocks.__class__ is not int or num_blocks < 0:
            msg = f"num_blocks must be an integer >= 0, got {num_blocks!r}"
            raise InvalidBlockError(msg)
        with self.transaction():
            return self._take(num_blocks)

    def _take(self, num_blocks: int) -> list[int]:
        """:meth:`get_new_blocks` for kvcore's managers (``num_blocks`` checked)."""
        if num_blocks > self._num_free:
            raise out_of_blocks(num_blocks, self._num_free)
        if not num_blocks:
            return []
        blocks = self._take_queued(num_blocks)
        if self.enable_caching:
            self._evict(blocks)
        return blocks

    def _take_queued(self, num_blocks: int) -> list[int]:
        """The queue's first ``num_blocks`` blocks, now held once (hashes still on them)."""
        blocks = self._queue.take(num_blocks)
        self._num_free -= num_blocks
        if self._journal is not None:
            self._journal.append((self._undo_take, (blocks,)))
        ref = self._ref
        for block in blocks:
            ref[block] = 1
        return blocks

    def _undo_take(self, blocks: list[int]) -> None:
        ref = self._ref
        for block in blocks:
            ref[block] = 0
        self._num_free += len(blocks)

    def _groups_of(self, blocks: Sequence[int]) -> Sequence[int]:
        """The group each of ``blocks`` was last cached in, in order (a C-level gather).

        A pool of one group never records a group: every block's is 0.
        """
        if len(self._cached) == 1 or not blocks:
            return [0] * len(blocks)
        if len(blocks) == 1:
            return (self._group[blocks[0]],)
        # itemgetter reads each item in C; map over a bytearray's __getitem__
        # would build an argument tuple per block.
        return itemgetter(*blocks)(self._group)  # type: ignore[no-any-return]

    def _evict(self, blocks: Sequence[int]) -> None:
        """Drop the hashes of just-taken ``blocks`` from the map (their KV is overwritten).

        A block that is the only one under its hash leaves the map here; one
        with duplicates (other blocks waiting under its hash) goes through
        :meth:`_uncache`, which hands the hash to the oldest of them.
        """
        hash_of = self._hash
        old_hashes = list(map(hash_of.__getitem__, blocks))
        if old_hashes.count(None) == len(old_hashes):
            return
        if any(self._dups):
            self._evict_among_copies(blocks)
            return
        # No hash has copies: every hashed block is the entry of its map.
        maps = self._cached
        try:
            if len(maps) == 1:
                # One group (the common engine): one map, and no group to read per block.
                cached = maps[0]
                for block, block_hash in zip(blocks, old_hashes, strict=True):
                    if block_hash is not None:
                        del cached[block_hash]
                        hash_of[block] = None
            else:
                groups = self._groups_of(blocks)
                for block, block_hash, group in zip(blocks, old_hashes, groups, strict=True):
                    if block_hash is not None:
                        del maps[group][block_hash]
                        hash_of[block] = None
            if self.enable_kv_cache_events:
                # The group a block was cached in stays recorded after eviction.
                for block_hash, group in zip(old_hashes, self._groups_of(blocks), strict=True):
                    if block_hash is not None:
                        event = BlockRemoved(block_hashes=(block_hash,), group_idx=group)
                        self._append_event(event)
        finally:
            # Also after an error part-way (restoring a hash not yet dropped
            # changes nothing).
            if self._journal is not None:
                self._journal.append((self._undo_evict, (blocks, old_hashes)))

    def _evict_among_copies(self, blocks: Sequence[int]) -> None:
        """:meth:`_evict` while some hash has copies: each block is checked for them."""
        hash_of = self._hash
        group_of = self._group
        maps = self._cached
        dups = self._dups
        evicted: list[int] = []
        evicted_hashes: list[Hashable] = []
        try:
            for block in blocks:
                block_hash = hash_of[block]
                if block_hash is None:
                    continue
                group = group_of[block]
                if block_hash in dups[group] or maps[group].get(block_hash) != block:
                    self._uncache(block)
                    continue
                del maps[group][block_hash]
                hash_of[block] = None
                evicted.append(block)
                evicted_hashes.append(block_hash)
                if self.enable_kv_cache_events:
                    self._append_event(BlockRemoved(block_hashes=(block_hash,), group_idx=group))
        finally:
            # No later step of this call touches these hashes (each was the
            # last under its hash in its group), so they are restored first;
            # journaled also when a step fails part-way.
            if evicted and self._journal is not None:
                self._journal.append((self._undo_evict, (evicted, evicted_hashes)))

    def _undo_evict(self, blocks: Sequence[int], block_hashes: Sequence[Hashable | None]) -> None:
        hash_of = self._hash
        group_of = self._group
        maps = self._cached
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            if block_hash is not None:
                hash_of[block] = block_hash
                maps[group_of[block]][block_hash] = block

    def reserve_blocks(self, num_blocks: int) -> list[int]:
        """Take ``num_blocks`` blocks out of circulation for the pool's lifetime.

        For state every request shares and nobody frees (e.g. attention-sink
        keys and values). Reserved blocks are never cached, freed or evicted.

        Raises:
            InvalidBlockError: ``num_blocks`` is not an integer >= 0.
            OutOfBlocksError: not enough free blocks.
        """
        with self.transaction():
            blocks = self.get_new_blocks(num_blocks)
            self._reserved.extend(blocks)
            self.record(self._undo_reserve, len(blocks))
        return blocks

    def _undo_reserve(self, count: int) -> None:
        del self._reserved[len(self._reserved) - count :]

    # -- giving blocks back -----------------------------------------------------------

    def free_blocks(self, ordered_blocks: Sequence[int]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue.

        Blocks are queued in the given order, so pass the block to evict first
        first (managers pass a request's blocks last to first). Null blocks are
        ignored.

        Raises:
            InvalidBlockError: an entry is not a block id of this pool;
                nothing changes.
            DoubleFreeError: a block had no reference left; nothing changes.
        """
        blocks = list(ordered_blocks)
        self._check_blocks(blocks)
        with self.transaction():
            self._release(blocks)

    def _release(self, blocks: Sequence[int]) -> None:
        """:meth:`free_blocks` for kvcore's managers (``blocks`` is kept for the undo)."""
        self._release_listing(blocks)

    def _release_listing(self, blocks: Sequence[int]) -> list[int]:
        """:meth:`_release`, returning the blocks that became free, in queue order."""
        ref = self._ref
        remaining = iter(blocks)
        # The common case first: blocks only this caller holds (count 1) go
        # to 0 with one test each; the first other one (shared, null, a
        # second free) hands the rest to the general walk.
        for block in remaining:
            if ref[block] != 1:
                released = list(blocks[: len(blocks) - 1 - length_hint(remaining)])
                self._release_rest(blocks, block, remaining, released)
                break
            ref[block] = 0
        else:
            # Callers pass a list of their own; it is read, never changed, later.
            released = blocks if isinstance(blocks, list) else list(blocks)
        if self._journal is not None:
            self._journal.append((self._unrelease, (blocks, len(released))))
        if released:
            self._num_free += len(released)
            self._queue.release(released)
        return released

    def _release_rest(
        self, blocks: Sequence[int], first: int, remaining: Iterator[int], released: list[int]
    ) -> None:
        """Drop a count on ``first`` and ``remaining``, appending the blocks reaching 0."""
        ref = self._ref
        append = released.append
        for block in chain((first,), remaining):
            if block:
                count = ref[block] - 1
                ref[block] = count
                if not count:
                    append(block)
                elif count < 0:
                    # The entries walked so far, this one included, are undone.
                    walked = len(blocks) - length_hint(remaining)
                    self._unrelease(blocks[:walked], 0)
                    msg = (
                        f"block {block} was freed more often than it was allocated "
                        "(its reference count is already 0)"
                    )
                    raise DoubleFreeError(msg)

    def _unrelease(self, blocks: Sequence[int], num_released: int) -> None:
        ref = self._ref
        for block in blocks:
            if block:
                ref[block] += 1
        self._num_free -= num_released

    # -- adopting cached blocks -------------------------------------------------------

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks, reviving free ones from the queue.

        Null blocks in ``blocks`` are ignored. A free block that was never
        allocated is taken out of the queue too (it will not be handed out).

        Raises:
            InvalidBlockError: an entry is not a block id of this pool;
                nothing changes.
        """
        blocks = list(blocks)
        self._check_blocks(blocks)
        with self.transaction():
            self._touch(blocks)

    def _touch(self, blocks: Sequence[int]) -> list[int]:
        """:meth:`touch` for checked hits (``blocks`` is kept, not copied, for the undo).

        Returns the blocks taken out of the free queue (they were free).
        """
        ref = self._ref
        revived: list[int] = []
        if self._journal is not None:
            # ``revived`` is filled below, before the undo can run.
            self._journal.append((self._untouch, (blocks, revived)))
        for block in blocks:
            if block:
                count = ref[block]
                if not count:
                    revived.append(block)
                ref[block] = count + 1
        if revived:
            self._num_free -= len(revived)
            self._queue.revive(revived)
        self._queue.hit(blocks)
        return revived

    def _untouch(self, blocks: Sequence[int], revived: list[int]) -> None:
        ref = self._ref
        for block in blocks:
            if block:
                ref[block] -= 1
        self._num_free += len(revived)

    def count_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free (cached, waiting in the free queue).

        Adopting such a cache hit takes the block out of the free queue, so an
        allocation must count it against the free capacity. Null blocks are
        not counted.
        """
        # The null block's count is never maintained and stays 0, so every null
        # in `blocks` shows up among the zeros: subtract them.
        return list(map(self._ref.__getitem__, blocks)).count(0) - blocks.count(NULL_BLOCK)

    # -- the prefix cache -------------------------------------------------------------

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
            hits: list[int] = []
            append = hits.append
            for block in map(self._cached[kv_cache_group_ids[0]].get, block_hashes[start:stop]):
                if block is None:
                    break
                append(block)
            return (hits,)
        maps = [self._cached[g] for g in kv_cache_group_ids]
        return match_in_maps(maps, block_hashes[start:stop])

    def holds_cached(
        self, blocks: Sequence[int], block_hashes: Sequence[Hashable], group: int
    ) -> bool:
        """Whether each of ``blocks`` is a block of this pool cached in ``group`` under its hash.

        ``block_hashes[i]`` is the hash ``blocks[i]`` must be cached under.
        C-level passes, O(len(blocks)); ``False`` for anything that is not a
        block id (the null block included: it is never cached).
        """
        if len(blocks) != len(block_hashes):
            return False
        if block_hashes.__class__ is not list:
            block_hashes = list(block_hashes)
        try:
            return (
                {*map(type, blocks)} <= _INT
                and (not blocks or min(blocks) > 0)
                and list(map(self._hash.__getitem__, blocks)) == block_hashes
                and self._groups_of(blocks).count(group) == len(blocks)
            )
        except (TypeError, IndexError):
            return False

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
        :class:`~kvcore.events.BlockStored` for the whole range.

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
        self._check_group(kv_cache_group_id)
        if num_cached_blocks < 0 or num_full_blocks > len(blocks):
            msg = (
                f"blocks {num_cached_blocks}..{num_full_blocks - 1} are not all in the "
                f"{len(blocks)}-block table"
            )
            raise InvalidBlockError(msg)
        new = blocks[num_cached_blocks:num_full_blocks]
        self._check_blocks(new)
        # The null block never carries a hash: every entry must be None.
        if list(map(self._hash.__getitem__, new)).count(None) != len(new):
            block = next(b for b in new if self._hash[b] is not None)
            msg = f"block {block} is already cached; a block is cached once, when it is full"
            raise InvalidBlockError(msg)
        with self.transaction():
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
        """:meth:`cache_full_blocks` for kvcore's managers: no checks of the blocks."""
        if num_cached_blocks >= num_full_blocks:
            return
        hashes = self._hashes_of(request, block_size, num_full_blocks)
        new_blocks = blocks[num_cached_blocks:num_full_blocks]
        new_hashes = hashes[num_cached_blocks:num_full_blocks]
        several_groups = len(self._cached) > 1
        if self._journal is not None:
            old_groups = list(self._groups_of(new_blocks)) if several_groups else None
            self._journal.append((self._uncache_new, (new_blocks, old_groups, kv_cache_group_id)))
        stored = self._enter(new_blocks, new_hashes, kv_cache_group_id, several_groups)
        self._num_stored += stored
        if self._journal is not None:
            self._journal.append((self._unstore, (stored,)))
        self._queue.cached(
            kv_cache_group_id,
            blocks,
            num_cached_blocks,
            num_full_blocks,
            hashes,
            request.num_prompt_tokens,
        )
        if self.enable_kv_cache_events:
            self._append_stored_event(
                request, hashes, new_blocks, num_cached_blocks, block_size, kv_cache_group_id
            )

    def _enter(
        self,
        blocks: Sequence[int],
        block_hashes: Sequence[Hashable],
        group: int,
        several_groups: bool,
    ) -> int:
        """Cache each non-null block of ``blocks`` under its hash in ``group`` (not undone here).

        A hash already cached in the group keeps its block; the new one waits
        among the duplicates. ``several_groups``: record the group per block.
        Returns how many blocks were cached (the non-null ones).
        """
        hash_of = self._hash
        cache_first = self._cached[group].setdefault
        dups = self._dups[group]
        stored = 0
        for block, block_hash in zip(blocks, block_hashes, strict=True):
            if block:
                hash_of[block] = block_hash
                stored += 1
                if cache_first(block_hash, block) != block:
                    dups.setdefault(block_hash, []).append(block)
        if several_groups:
            group_of = self._group
            for block in blocks:
                if block:
                    group_of[block] = group
        return stored

    def _hashes_of(self, request: Request, block_size: int, num_blocks: int) -> Sequence[Hashable]:
        """The request's hashes viewed at ``block_size``; they must cover ``num_blocks`` blocks."""
        hashes: Sequence[Hashable] = request.block_hashes
        if self.hash_block_size is not None and block_size != self.hash_block_size:
            hashes = hashes_at_block_size(hashes, self.hash_block_size, block_size)
        if len(hashes) < num_blocks:
            msg = (
                f"request {request.request_id!r} has hashes for {len(hashes)} blocks, "
                f"cannot cache {num_blocks}"
            )
            raise InvalidRequestError(msg)
        return hashes

    def _append_stored_event(
        self,
        request: Request,
        hashes: Sequence[Hashable],
        new_blocks: Sequence[int],
        start: int,
        block_size: int,
        group: int,
    ) -> None:
        stop = start + len(new_blocks)
        kinds = self._group_kinds
        self._append_event(
            BlockStored(
                block_hashes=list(compress(hashes[start:stop], new_blocks)),
                parent_block_hash=hashes[start - 1] if start else None,
                token_ids=request.all_token_ids[start * block_size : stop * block_size],
                block_size=block_size,
                lora_id=request.lora_id,
                lora_name=request.lora_name,
                group_idx=group,
                kind=kinds[group] if kinds is not None else None,
            )
        )

    def _unstore(self, count: int) -> None:
        self._num_stored -= count

    def _uncache_new(self, blocks: list[int], old_groups: list[int] | None, group: int) -> None:
        """Undo of :meth:`_cache_full_blocks`, newest block first."""
        # A block is the primary entry of its hash unless it was added after
        # one, and then it is the last of the duplicates.
        cached = self._cached[group]
        dups = self._dups[group]
        for index in range(len(blocks) - 1, -1, -1):
            block = blocks[index]
            block_hash = self._hash[block] if block else None
            # None: the null block, or one that _enter refused before caching it.
            if block_hash is None:
                continue
            if cached.get(block_hash) == block:
                del cached[block_hash]
            else:
                waiting = dups[block_hash]
                waiting.pop()
                if not waiting:
                    del dups[block_hash]
            self._hash[block] = None
            if old_groups is not None:
                self._group[block] = old_groups[index]

    def _uncache(self, block: int) -> None:
        """Drop ``block``'s hash from the map (it has one); its oldest duplicate takes over."""
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
        if self._journal is not None:
            self._journal.append((self._undo_uncache, (block, block_hash, promoted, position)))
        if self.enable_kv_cache_events:
            self._append_event(BlockRemoved(block_hashes=(block_hash,), group_idx=group))

    def _undo_uncache(
        self, block: int, block_hash: Hashable, promoted: int | None, position: int | None
    ) -> None:
        group = self._group[block]
        if position is None:
            self._cached[group][block_hash] = block
            if promoted is not None:
                self._dups[group].setdefault(block_hash, []).insert(0, promoted)
        else:
            self._dups[group].setdefault(block_hash, []).insert(position, block)
        self._hash[block] = block_hash

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
        with self.transaction():
            # An id given twice is dropped once.
            forgotten = [block for block in dict.fromkeys(blocks) if self._hash[block] is not None]
            for block in forgotten:
                self._uncache(block)
            if forgotten:
                self._num_dropped += len(forgotten)
                self.record(self._undo_dropped, len(forgotten))
                # Not undone: a policy cannot be told a block regained its hash.
                self._queue.forget(forgotten)

    def _undo_dropped(self, count: int) -> None:
        self._num_dropped -= count

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, if no request holds a block.

        Returns:
            ``True`` if the cache was cleared (an :class:`~kvcore.events.AllBlocksCleared`
            event is queued), ``False`` if some block is still in use; then
            nothing changes.
        """
        if self.num_in_use != len(self._reserved):
            return False
        self._clear_cache()
        if self.enable_kv_cache_events:
            self._events.append(AllBlocksCleared())
        return True

    def _clear_cache(self) -> None:
        """Forget every hash (no block in use; not undone: the reset is outside transactions)."""
        for cached in self._cached:
            cached.clear()
        for dups in self._dups:
            dups.clear()
        self._num_dropped += self.num_cached_blocks()
        self._hash = [None] * self.num_blocks
        self._queue.forget(None)

    # -- events -----------------------------------------------------------------------

    def _append_event(self, event: KVCacheEvent) -> None:
        if self._journal is not None:
            self._journal.append((self._truncate_events, (len(self._events),)))
        self._events.append(event)

    def _truncate_events(self, length: int) -> None:
        del self._events[length:]

    def take_events(self) -> list[KVCacheEvent]:
        """Return the queued events, oldest first, and clear the queue."""
        events = self._events[:]
        self._events.clear()
        return events

    def peek_events(self) -> tuple[KVCacheEvent, ...]:
        """The queued events, oldest first, left in the queue (a snapshot)."""
        return tuple(self._events)

    # -- inspection -------------------------------------------------------------------

    def ref_count(self, block: int) -> int:
        """Requests holding ``block`` (0 for a free block; not kept for the null block).

        Raises:
            InvalidBlockError: ``block`` is not a block id of this pool.
        """
        return self._ref[self._check_block(block)]

    def block_hash(self, block: int) -> Hashable | None:
        """The hash ``block`` is cached under, or ``None``.

        Raises:
            InvalidBlockError: ``block`` is not a block id of this pool.
        """
        return self._hash[self._check_block(block)]

    def block_group(self, block: int) -> int:
        """The KV cache group ``block`` was last cached in (0 if it never was).

        Raises:
            InvalidBlockError: ``block`` is not a block id of this pool.
        """
        return self._group[self._check_block(block)]

    def is_cached(self, block_hash: Hashable, group: int) -> bool:
        """Whether some block of ``group`` is cached under ``block_hash``.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        return block_hash in self._cached[self._check_group(group)]

    def cached_block(self, block_hash: Hashable, group: int) -> int | None:
        """The block of ``group`` a lookup of ``block_hash`` finds, or ``None``.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        return self._cached[self._check_group(group)].get(block_hash)

    def cached_blocks(self, block_hash: Hashable, group: int) -> list[int]:
        """Every block of ``group`` cached under ``block_hash``, the one a lookup finds first.

        Raises:
            InvalidBlockError: ``group`` is not a group id of this pool.
        """
        first = self._cached[self._check_group(group)].get(block_hash)
        if first is None:
            return []
        return [first, *self._dups[group].get(block_hash, ())]

    def free_block_ids(self) -> list[int]:
        """The free blocks in the policy's order: the next block to be allocated first."""
        return list(self._queue)

    def num_cached_blocks(self) -> int:
        """Blocks currently in the prefix cache (in use or evictable)."""
        return len(self._hash) - self._hash.count(None)

    def check_invariants(self) -> None:
        """Verify the pool's internal consistency; O(num_blocks), for tests.

        Raises:
            AssertionError: naming the first violated invariant.
        """
        free = self._check_free_queue()
        reserved = set(self._reserved)
        for block in range(1, self.num_blocks):
            in_queue = block in free
            if (self._ref[block] == 0) != in_queue:
                msg = f"block {block}: ref count {self._ref[block]} but in_queue={in_queue}"
                raise AssertionError(msg)
            if block in reserved and (in_queue or self._hash[block] is not None):
                msg = f"reserved block {block} is free or cached"
                raise AssertionError(msg)
        self._check_map()

    def _check_free_queue(self) -> set[int]:
        """The free blocks, each once, as many as counted; never the null block."""
        free: set[int] = set()
        for block in self._queue:
            # A linked queue's cycle would make the walk endless: stop at the
            # first repeat.
            if block in free:
                msg = f"the free queue lists block {block} twice"
                raise AssertionError(msg)
            free.add(block)
        if len(free) != self._num_free:
            msg = f"free count {self._num_free} but {len(free)} blocks in the free queue"
            raise AssertionError(msg)
        if NULL_BLOCK in free:
            msg = "the null block is in the free queue"
            raise AssertionError(msg)
        if self._hash[NULL_BLOCK] is not None:
            msg = "the null block is cached"
            raise AssertionError(msg)
        return free

    def _check_map(self) -> None:
        """Every map entry points at a block carrying that hash in that group, and vice versa."""
        seen = 0
        for group, cached in enumerate(self._cached):
            entries = list(cached.items())
            entries += [(h, b) for h, bs in self._dups[group].items() for b in bs]
            for block_hash, block in entries:
                if self._hash[block] != block_hash or self._group[block] != group:
                    msg = f"map entry {block_hash!r} (group {group}) -> block {block} mismatch"
                    raise AssertionError(msg)
            seen += len(entries)
        if seen != self.num_cached_blocks():
            msg = f"{self.num_cached_blocks()} blocks carry a hash but the map has {seen}"
            raise AssertionError(msg)


def match_in_maps(
    maps: Sequence[dict[Hashable, int]], block_hashes: Sequence[Hashable]
) -> tuple[list[int], ...]:
    """The run of hashes from the first that every one of ``maps`` holds, per map.

    One list per map, all of the same length: the blocks each map holds
    under the hashes before the first one that some map misses.
    """
    per_map: tuple[list[int], ...] = tuple([] for _ in maps)
    for block_hash in block_hashes:
        found = [cached.get(block_hash) for cached in maps]
        if None in found:
            break
        for blocks, block in zip(per_map, found, strict=True):
            blocks.append(block)  # type: ignore[arg-type]
    return per_map
