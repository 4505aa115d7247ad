"""The native block pool: :class:`~kvcore._block_pool.BlockPool` with its per-block loops in C.

:class:`NativeBlockPool` behaves exactly as the Python pool (the
specification, :mod:`kvcore._block_pool`) with the ``lru`` policy; the
differential tests drive both with the same traffic and compare them after
every step. What moves to C (:mod:`kvcore._native`, built from
``kvcore/_native.c``):

- the reference counts, a flat int32 array (``_ref`` is a writable
  memoryview of it, so the specification's inspection and checks read it
  unchanged);
- the free queue of a built-in policy. With ``lru`` it is a doubly linked
  list through the block ids in the core (the core *is* the pool's free
  queue: it provides the :class:`~kvcore._eviction.queue.FreeQueue`
  methods). With ``admit``, ``frequency`` or ``cost`` it is a
  ``kvcore._native.ValueQueue`` (``kvcore/_value_queue.c``, the compiled
  twin of :class:`~kvcore._eviction.policies.ValuePolicy`, built from the
  same :class:`~kvcore._eviction.policies.ValueRules`) beside a core made
  without a queue; the pool's batched calls go to the queue, which drives
  the core. A third party's policy keeps the free blocks in Python, as in
  the specification (a :class:`NativePolicyPool`);
- the count of free blocks;
- the batched loops: taking blocks (with the eviction of their hashes),
  releasing a table, touching a hit, counting evictable hits, matching a
  prefix and entering full blocks in the cache.

The prefix map has two forms. With ``digest_size`` (every hash a ``bytes``
of that width, as kvcore's ``"sha256"`` and ``"xxh3_128"`` hashers make) or
``int_hashes`` (every hash an int of 64 bits, as the ``"fast"`` hasher makes;
kept as 8-byte keys), both of which the KV cache manager passes, the map
moves to C as well: each block's digest in one byte array and an
open-addressing table of block ids, no Python object per cached block but
the block id's int, which the core keeps for ids below 2**20
(:mod:`kvcore._native_views` shows it to the specification's code as the
list and dicts it expects). Without either, block hashes are any hashable
and the map stays the Python pool's containers (the per-block hash list, the
per-group dicts, the group bytearray), driven from C. Either way the rare
steps stay Python, shared with the specification: a hash with duplicates
(``_uncache``), the events, the reset and the invariant checks.

Every change made inside a transaction records its undo in the pool's log,
the C steps included, so a rollback restores the exact state (queue order
too).
"""

from __future__ import annotations

import importlib
from collections.abc import Hashable, Sequence
from typing import Any, Final

from kvcore._block_pool import BlockPool, out_of_blocks
from kvcore._events import BlockRemoved
from kvcore._eviction.lru import lru_policy
from kvcore._eviction.policies import BUILTIN_OPTIONS, ValueRules
from kvcore._eviction.queue import FreeQueue
from kvcore._eviction.registry import DEFAULT_POLICY, QueueFactory, resolve_policy
from kvcore._native_views import NativeHashes, NativePrefixMap
from kvcore.errors import DoubleFreeError, InvalidConfigError
from kvcore.eviction import EvictionPolicyFactory, PoolInfo

__all__ = ["MAX_NATIVE_GROUPS", "NativeBlockPool", "NativePolicyPool", "native_gap"]

#: Groups a native pool serves (the group of each block is one byte).
MAX_NATIVE_GROUPS: Final = 256


def _compiled(policy: QueueFactory) -> bool:
    """Whether the native backend has a compiled free queue for ``policy`` (the built-ins)."""
    return policy.build is lru_policy or policy.build in BUILTIN_OPTIONS


def native_gap(eviction: str | EvictionPolicyFactory | QueueFactory, num_groups: int) -> str | None:
    """Why a shared pool with this policy and group count needs the Python backend, or ``None``.

    Every policy is served; only the group count can need Python.

    Raises:
        UnknownEvictionPolicyError: ``eviction`` names no built-in policy.
    """
    resolve_policy(eviction)
    if num_groups > MAX_NATIVE_GROUPS:
        return f"{num_groups} KV cache groups (the native backend serves up to 256)"
    return None


class NativeBlockPool(BlockPool):
    """A :class:`~kvcore._block_pool.BlockPool` whose counts, queue and loops are compiled.

    The arguments and behaviour are those of the Python pool, with at most
    :data:`MAX_NATIVE_GROUPS` groups. The free queue is compiled too for the
    built-in policies: ``lru`` in the core itself, ``admit``, ``frequency``
    and ``cost`` in a :class:`kvcore._native.ValueQueue` beside it (which
    then drives the core). With a third party's policy,
    ``NativeBlockPool(...)`` makes a :class:`NativePolicyPool`.

    Raises:
        InvalidConfigError: more groups (see :func:`native_gap`); or as the
            Python pool.
    """

    __slots__ = ("_core",)

    backend = "native"

    def __new__(cls, *args: Any, **kwargs: Any) -> NativeBlockPool:
        """A :class:`NativePolicyPool` for a third party's policy, else this class."""
        policy = resolve_policy(kwargs.get("eviction", DEFAULT_POLICY))
        if cls is NativeBlockPool and not _compiled(policy):
            cls = NativePolicyPool
        return super().__new__(cls)

    def _new_queue(self, factory: QueueFactory, info: PoolInfo) -> FreeQueue:
        if factory.build is lru_policy:
            self._new_core(info.num_blocks, queue=True)
            return self._core  # type: ignore[no-any-return]
        self._new_core(info.num_blocks, queue=False)
        native = importlib.import_module("kvcore._native")
        parts = ValueRules(info, **BUILTIN_OPTIONS[factory.build]).compiled_parts()
        # The queue drives the core (counts, transactions) and finds joiners'
        # anchors in its prefix map.
        return native.ValueQueue(info.num_blocks, core=self._core, **parts)  # type: ignore[no-any-return]

    def _new_core(self, num_blocks: int, *, queue: bool) -> None:
        native = importlib.import_module("kvcore._native")
        gap = native_gap(DEFAULT_POLICY, len(self._cached))
        if gap is not None:
            msg = f"the native block pool cannot serve {gap}; use backend='python' or 'auto'"
            raise InvalidConfigError(msg)
        self._core = native.Core(num_blocks, DoubleFreeError, queue=queue)
        if self.int_hashes:
            self._bind_digests(8, int_keys=True)
        elif self.digest_size is None:
            self._bind()
        else:
            self._bind_digests(self.digest_size)
        self._ref = memoryview(self._core)  # type: ignore[assignment]

    @property
    def _keyed(self) -> bool:
        """Whether the prefix map is the core's compiled table (fixed-width or int hashes)."""
        return self.digest_size is not None or self.int_hashes

    def _bind(self) -> None:
        self._core.bind(self._hash, self._cached, self._dups, self._group)

    def _bind_digests(self, digest_size: int, *, int_keys: bool = False) -> None:
        if not isinstance(self._group, bytearray):
            msg = "the native block pool serves at most 256 groups"
            raise InvalidConfigError(msg)
        self._core.bind_digests(digest_size, self._dups, self._group, int_keys)
        self._hash = NativeHashes(self._core)  # type: ignore[assignment]
        # The specification's code uses only what the view shares with a dict.
        maps: list[Any] = [NativePrefixMap(self._core, group) for group in range(len(self._dups))]
        self._cached = maps

    # The specification's _num_free, kept by the core (its undo steps restore it).
    @property
    def _num_free(self) -> int:
        return self._core.num_free  # type: ignore[no-any-return]

    @_num_free.setter
    def _num_free(self, value: int) -> None:
        self._core.num_free = value

    def get_num_free_blocks(self) -> int:
        """Blocks that can be allocated now (free, including evictable cached ones)."""
        return self._core.num_free  # type: ignore[no-any-return]

    def _take(self, num_blocks: int) -> list[int]:
        if num_blocks > self._core.num_free:
            raise out_of_blocks(num_blocks, self._core.num_free)
        if not num_blocks:
            return []
        removed = self._removed if self.enable_kv_cache_events else None
        # The compiled queue (the core itself with lru) takes, and drives the core.
        return self._queue.take_blocks(  # type: ignore[attr-defined,no-any-return]
            num_blocks, self.enable_caching, self._uncache, removed
        )

    def _removed(self, block_hash: Hashable, group: int) -> None:
        self._append_event(BlockRemoved(block_hashes=(block_hash,), group_idx=group))

    def _release(self, blocks: Sequence[int]) -> None:
        # The compiled queue builds no list of the freed blocks: nobody reads it.
        self._queue.release_blocks(blocks)  # type: ignore[attr-defined]

    def _touch(self, blocks: Sequence[int]) -> list[int]:
        # Hits are counted by the queue that needs them (lru ignores them).
        return self._queue.touch_blocks(blocks)  # type: ignore[attr-defined,no-any-return]

    def count_evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free (cached, in the free queue); nulls not counted."""
        return self._core.count_evictable(blocks)  # type: ignore[no-any-return]

    def holds_cached(
        self, blocks: Sequence[int], block_hashes: Sequence[Hashable], group: int
    ) -> bool:
        """See :meth:`BlockPool.holds_cached <kvcore._block_pool.BlockPool.holds_cached>`."""
        return self._core.holds_cached(blocks, block_hashes, group)  # type: ignore[no-any-return]

    def match_prefix(
        self,
        block_hashes: Sequence[Hashable],
        start: int,
        stop: int,
        kv_cache_group_ids: Sequence[int],
    ) -> tuple[list[int], ...]:
        """Look up ``block_hashes[start:stop]`` left to right until the first miss (per group)."""
        return self._core.match_prefix(  # type: ignore[no-any-return]
            block_hashes, start, stop, kv_cache_group_ids
        )

    def _enter(
        self,
        blocks: Sequence[int],
        block_hashes: Sequence[Hashable],
        group: int,
        several_groups: bool,
    ) -> int:
        return self._core.enter(blocks, block_hashes, group, several_groups)  # type: ignore[no-any-return]

    def _clear_cache(self) -> None:
        if not self._keyed:
            # The specification makes a new hash list: the core must drive that one.
            super()._clear_cache()
            self._bind()
            return
        self._num_dropped += self.num_cached_blocks()
        self._core.clear_map()
        for dups in self._dups:
            dups.clear()
        self._queue.forget(None)

    def num_cached_blocks(self) -> int:
        """Blocks currently in the prefix cache (in use or evictable)."""
        if not self._keyed:
            return super().num_cached_blocks()
        return self._core.num_hashed  # type: ignore[no-any-return]

    @property
    def nbytes(self) -> int:
        """Bytes of the compiled arrays: counts, queue links and (with digests) the prefix map."""
        return self._core.nbytes  # type: ignore[no-any-return]


class NativePolicyPool(NativeBlockPool):
    """A native pool whose third-party eviction policy keeps the free blocks in Python.

    The counts, the prefix map and the loops over them are compiled, as in
    :class:`NativeBlockPool`; the policy (through the same free-queue
    interface as on the Python pool) is asked for the blocks to take and
    told which became free or took a hit, as the specification does.
    Transactions journal both the core's steps and the policy's.
    """

    __slots__ = ()

    def _new_queue(self, factory: QueueFactory, info: PoolInfo) -> FreeQueue:
        self._new_core(info.num_blocks, queue=False)
        return factory(info)

    def _begin(self) -> bool:
        if not super()._begin():
            return False
        self._core.journal = self._undo_steps
        return True

    def _commit(self) -> None:
        self._core.journal = None
        super()._commit()

    def _rollback(self) -> None:
        self._core.journal = None
        super()._rollback()

    def _take(self, num_blocks: int) -> list[int]:
        if num_blocks > self._core.num_free:
            raise out_of_blocks(num_blocks, self._core.num_free)
        if not num_blocks:
            return []
        blocks = self._queue.take(num_blocks)
        removed = self._removed if self.enable_kv_cache_events else None
        self._core.claim_blocks(blocks, self.enable_caching, self._uncache, removed)
        return blocks

    def _release(self, blocks: Sequence[int]) -> None:
        released: list[int] = self._core.drop_blocks(blocks)
        if released:
            self._queue.release(released)

    def _touch(self, blocks: Sequence[int]) -> list[int]:
        revived: list[int] = self._core.adopt_blocks(blocks)
        if revived:
            self._queue.revive(revived)
        self._queue.hit(blocks)
        return revived
