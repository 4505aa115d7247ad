"""The eviction-policy protocol: which free block the pool hands out next.

A free block that still carries a prefix-cache hash can be revived by a cache
hit; taking it for a new allocation evicts it. So the order in which free
blocks are taken decides which cached prefixes survive. The
:class:`~kvcore.managers.BlockPool` owns one policy object and asks it, and only it,
for that order; nothing else reads or reorders the free blocks.

The pool keeps reference counts, the prefix-cache map and the count of free
blocks. The policy keeps the free set and chooses victims. The pool tells it:

* :meth:`~EvictionPolicy.cached`: blocks entered the prefix cache (group,
  position in the request's chain, the request's prompt length and hashes);
* :meth:`~EvictionPolicy.release`: blocks became free (their reference count
  reached 0), in the order the manager gave (first = least wanted);
* :meth:`~EvictionPolicy.revive`: a free block was hit and is in use again;
* :meth:`~EvictionPolicy.withdraw`: a free block leaves the pool's blocks for
  good, without a hit (only in a page class of a two-level pool, whose
  memory moves to another class a large page at a time);
* :meth:`~EvictionPolicy.hit`: a request adopted cached blocks (free or not);
* :meth:`~EvictionPolicy.forget`: blocks lost their hash without being taken
  (:meth:`~kvcore.managers.BlockPool.evict_blocks`, a prefix-cache reset);
* :meth:`~EvictionPolicy.take`: hand out ``n`` free blocks (the pool then
  drops the hashes of those that were cached).

Every call is on the allocation path: a policy keeps per-block state in flat
lists or arrays indexed by block id and does O(1) (amortized) work per block.
The pool passes no time: the order of the calls is the policy's clock.

Rollback: the engine-facing manager undoes an operation that fails half-way.
The pool undoes what it asked of a policy by compensating calls (a
``release`` for a ``take``, a ``revive`` or a ``withdraw``, a ``revive`` for a
``release``, a ``forget`` for a ``cached``), which restores the free set exactly but maybe
not the policy's order. A policy whose class sets ``exact_undo = True``
instead gets the pool's undo log in its ``undo_log`` attribute (``None``
outside a transaction) and appends ``(callable, arguments)`` entries that
restore its exact state when replayed newest first, as the built-in ``lru``
queue does.

Policies are chosen by name (``KVCacheManager(..., eviction="lru")``);
:func:`kvcore.available_eviction_policies` lists them. A third-party policy
is a factory ``(PoolInfo) -> EvictionPolicy``, passed directly or registered
by a plugin through the ``kvcore_eviction_policies`` hook
(:mod:`kvcore.hookspecs`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Protocol, runtime_checkable

import attrs

from kvcore.specs import KVCacheSpec

__all__ = [
    "EvictionPolicy",
    "EvictionPolicyFactory",
    "GroupInfo",
    "PoolInfo",
    "PoolView",
    "CLASS_POLICY_METHODS",
    "POLICY_METHODS",
]


class PoolView(Protocol):
    """What a policy may read from the pool (never change)."""

    def block_hash(self, block: int) -> Hashable | None:
        """The hash ``block`` is cached under, or ``None``."""
        ...

    def block_group(self, block: int) -> int:
        """The KV cache group ``block`` was last cached in (0 if never cached)."""
        ...

    def is_cached(self, block_hash: Hashable, group: int) -> bool:
        """Whether some block of ``group`` is cached under ``block_hash``."""
        ...

    def cached_block(self, block_hash: Hashable, group: int) -> int | None:
        """The block of ``group`` a lookup of ``block_hash`` finds, or ``None``.

        Hashes are chained and taken at token boundaries, so in two groups
        with the same block size the blocks under one hash cover the same
        tokens of the same prefix.
        """
        ...

    def cached_blocks(self, block_hash: Hashable, group: int) -> Sequence[int]:
        """Every block of ``group`` cached under ``block_hash``: the one a lookup finds first.

        Two requests that computed the same block at the same time both
        cache it; the later copies wait behind the first. Empty if none.
        """
        ...


#: A position large enough to show a spec's reading rule far from the start.
_PROBE = 1 << 30


@attrs.frozen(kw_only=True)
class GroupInfo:
    """One KV cache group, as a policy sees it.

    Attributes:
        kind: The attention kind of the group's spec (e.g. ``"full_attention"``),
            for display; policies decide from the fields below, not the name.
        block_size: Tokens per block.
        tokens_read: ``tokens_read(E)``: the earlier tokens a hit ending at
            token ``E`` reads in this group (the spec's
            :meth:`~kvcore.specs.KVCacheSpec.tokens_read`); the group's blocks
            covering them must be cached. ``None`` when the group reads the
            whole prefix ``[0, E)`` (full attention).
        prefix_cached: Whether the group's blocks are ever cached.
    """

    kind: str | None = None
    block_size: int = 1
    tokens_read: Callable[[int], tuple[range, ...]] | None = None
    prefix_cached: bool = True

    @property
    def reads_whole_prefix(self) -> bool:
        """Whether a hit reads every block before its end in this group."""
        return self.tokens_read is None

    @classmethod
    def of(cls, spec: KVCacheSpec, prefix_cached: bool = True) -> GroupInfo:
        """The info of a group of ``spec`` (its kind, block size and reading rule)."""
        reads_all = spec.tokens_read(_PROBE) == (range(_PROBE),)
        return cls(
            kind=spec.kind,
            block_size=spec.block_size,
            tokens_read=None if reads_all else spec.tokens_read,
            prefix_cached=prefix_cached,
        )


@attrs.frozen(kw_only=True)
class PoolInfo:
    """What the pool tells a policy when it builds it.

    Attributes:
        num_blocks: Block ids are ``0 .. num_blocks - 1``; block 0 is the null
            block and is never free. All others start free, never allocated
            (unless ``free_at_start`` is false).
        groups: One entry per KV cache group, by group id.
        alignment_tokens: Hit lengths are multiples of this many tokens.
        view: Read access to the pool's per-block state.
        free_at_start: ``False`` for the blocks of one page class of a
            two-level pool: no block is free at the start (the pool hands out
            a freshly carved large page's blocks itself), blocks become free
            only through ``release``, and free blocks leave the free set
            through ``take``, ``revive`` (a hit) or ``withdraw`` (their large
            page goes to another class). A policy must then start with an
            empty free set, and have ``withdraw``.
    """

    num_blocks: int
    groups: tuple[GroupInfo, ...] = (GroupInfo(),)
    alignment_tokens: int = 1
    view: PoolView | None = None
    free_at_start: bool = True


@runtime_checkable
class EvictionPolicy(Protocol):
    """The order in which free blocks are taken, maintained as the pool reports events.

    The pool guarantees: ``take(n)`` is called only with ``n`` <= the number
    of free blocks; ``release`` gets blocks that are not free; ``revive``
    gets a free block that carries a hash; ``withdraw`` gets a free block,
    with or without a hash, and only from a pool built with
    ``PoolInfo.free_at_start=False``; the null block (0) is never passed
    except inside ``hit``'s and ``cached``'s block lists, where it marks a
    position the group does not keep (skip it).
    """

    def take(self, n: int) -> list[int]:
        """Remove ``n`` blocks from the free set and return them, first taken first.

        The first allocation of a fresh pool must get blocks ``1 .. n`` in
        order if the policy wants to match the reference engine's block ids
        (every built-in policy does: never-allocated blocks go first, in id
        order, since they hold nothing).
        """
        ...

    def release(self, blocks: Sequence[int]) -> None:
        """``blocks`` became free, in the order the manager prefers them taken.

        Managers free a request's blocks last first (its tail before its head)
        and windowed types free blocks as the window slides.
        """
        ...

    def revive(self, block: int) -> None:
        """Free ``block`` was hit by a request and leaves the free set.

        The block may be one never handed out (an engine may touch a block
        nobody allocated): it must not be handed out until it is released.
        """
        ...

    def withdraw(self, block: int) -> None:
        """Free ``block`` leaves the free set for good, without a hit.

        Only for a page class of a two-level pool
        (``PoolInfo.free_at_start=False``): the large page holding the block
        goes to another class (or back to the common pool), and the block is
        not handed out again unless it is released. It may carry a hash; the
        pool drops it right after (no ``forget`` follows). Required only of
        a policy built with ``free_at_start=False`` (checked when the pool is
        built); a policy never used for a two-level pool may leave it out.
        """
        ...

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """``blocks[start:stop]`` (a request's table in ``group``) entered the cache.

        ``blocks[i]`` holds tokens ``[i × bs, (i + 1) × bs)`` of the request
        (``bs`` = the group's block size) and is cached under
        ``block_hashes[i]``; null blocks in the range are not cached. The
        request's prompt has ``num_prompt_tokens`` tokens; blocks past it
        hold generated tokens. ``block_hashes`` may be longer than ``stop``
        (the rest of the prompt, for look-ahead).
        """
        ...

    def hit(self, blocks: Sequence[int]) -> None:
        """A request adopted ``blocks`` from the cache (called after any revive)."""
        ...

    def forget(self, blocks: Sequence[int] | None) -> None:
        """``blocks`` lost their hash but stay where they are; ``None``: every block."""
        ...

    def __iter__(self) -> Iterator[int]:
        """The free blocks, next to be taken first (for inspection and tests; O(free))."""
        ...


#: Build a policy for a pool.
EvictionPolicyFactory = Callable[[PoolInfo], EvictionPolicy]

#: The methods a policy object must have (checked when a pool is built).
POLICY_METHODS = ("take", "release", "revive", "cached", "hit", "forget", "__iter__")
#: The methods a policy of a page class of a two-level pool must have besides
#: (``PoolInfo.free_at_start=False``; checked when the pool is built).
CLASS_POLICY_METHODS = ("withdraw",)
