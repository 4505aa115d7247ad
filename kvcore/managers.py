"""The manager base classes plugin authors subclass: one manager per KV cache group.

A manager keeps the block table of every request in its group and decides,
for its attention type, three things: which earlier blocks a request no longer
needs (:attr:`SingleTypeManager.frees_skipped_blocks`,
:meth:`SingleTypeManager.get_num_skipped_tokens`), which cached blocks form a
usable prefix-cache hit (:meth:`SingleTypeManager.find_longest_cache_hit`,
given one :class:`~kvcore.managers.HitQuery`), and how many blocks an allocation will take. The
base class implements the bookkeeping shared by every type; a plugin
overrides what differs. What a manager class must provide is checked when a
registry is built (:func:`kvcore.load_registry`).

The hit search reads the prefix cache only through
:class:`~kvcore.managers.CachedBlockLookup` (two methods), so it can run
against anything that implements them: the engine's :class:`~kvcore.managers.BlockPool`,
or a view of another engine's cached blocks.

Block ids are plain ``int``; block 0 is the null block (``NULL_BLOCK``),
which stands for a position whose KV is not kept.

Managers are called directly by the coordinator on every scheduler step, so
their methods are on the allocation path: keep them free of hook calls,
logging and per-call allocation of helper objects.

Every operation of the engine-facing manager either completes or changes
nothing: when a manager raises half-way, the pool undoes its own changes and
the changes recorded with :meth:`BlockPool.record <kvcore.managers.BlockPool.record>`.
The base-class methods record every change they make to ``req_to_blocks`` and
``num_cached_block``; a subclass that changes them itself records its
changes the same way.

The base class calls the pool's unchecked variants (``_touch``, ``_take``,
``_release``, ``_cache_full_blocks``) on its own tables and on hits the
engine-facing manager has already checked: past the boundary the hot path
trusts its data. A subclass calls the public, checking methods.

A running request's decode steps mostly change nothing: the engine-facing
manager skips the managers for them as long as the request stays within
every group's :meth:`SingleTypeManager.steady_until`. A subclass that
allocates, caches or frees by another rule than the base class overrides that
method to match (:func:`kvcore.testing.check_plugin` checks that it does).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Hashable, MutableMapping, Sequence
from typing import Any, ClassVar, Generic, NamedTuple, Protocol

from kvcore._block_pool import BlockPool, Transaction
from kvcore._blocks import NULL_BLOCK
from kvcore._hashing import BlockHashView
from kvcore._request import Request
from kvcore._utils import cdiv
from kvcore.errors import InvalidCacheHitError, RequestStateError
from kvcore.specs import SpecT

__all__ = [
    "NULL_BLOCK",
    "BlockPool",
    "Transaction",
    "BlockHashView",
    "CachedBlockLookup",
    "HitQuery",
    "SpecT",
    "SingleTypeManager",
    "PrefixManager",
]


_MISSING: Any = object()

# Token counts beyond any request: where a search for the next skip gives up,
# and what it answers then.
_FAR = 1 << 40
_NEVER = 1 << 62


# Undo steps for the table changes of the base class (see BlockPool.record).


def _undo_truncate(table: list[int], length: int) -> None:
    del table[length:]


def _undo_set(mapping: MutableMapping[str, Any], key: str, old: object) -> None:
    if old is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = old


def _undo_forget(
    manager: SingleTypeManager[Any], request_id: str, table: object, num_cached: object
) -> None:
    _undo_set(manager.req_to_blocks, request_id, table)
    _undo_set(manager.num_cached_block, request_id, num_cached)


def _undo_nulls(table: list[int], first: int, blocks: list[int]) -> None:
    table[first : first + len(blocks)] = blocks


def _without_leading_nulls(table: list[int]) -> list[int]:
    """``table`` from its first non-null block on (a windowed table starts with nulls).

    A bisection finds where a table of nulls-then-blocks turns, and a C-level
    count checks that everything before is null (a table of another shape is
    returned whole: its nulls are skipped by the release).
    """
    if table[0]:
        return table
    start = bisect_left(table, True, key=bool)
    if table[:start].count(NULL_BLOCK) == start:
        return table[start:]
    return table


class CachedBlockLookup(Protocol):
    """What a cache-hit search may ask of the prefix cache: the lookup protocol.

    :class:`~kvcore.managers.BlockPool` implements it; so can any object that knows
    which blocks are cached under which hash (a view of another engine's
    cache, a test double). A lookup never changes anything. A class that
    subclasses this protocol explicitly inherits :meth:`match_prefix` written
    in terms of :meth:`get_cached_block`.
    """

    def get_cached_block(
        self, block_hash: Hashable, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """One cached block id per group for ``block_hash``, or ``None`` if any group misses."""
        ...

    def match_prefix(
        self,
        block_hashes: Sequence[Hashable],
        start: int,
        stop: int,
        kv_cache_group_ids: Sequence[int],
    ) -> tuple[list[int], ...]:
        """Look ``block_hashes[start:stop]`` up left to right until the first miss.

        Returns:
            One list per group id, all of the same length, holding the blocks
            of the run of hits starting at ``start``.
        """
        per_group: tuple[list[int], ...] = tuple([] for _ in kv_cache_group_ids)
        for block_hash in block_hashes[start:stop]:
            found = self.get_cached_block(block_hash, kv_cache_group_ids)
            if found is None:
                break
            for blocks, block in zip(per_group, found, strict=True):
                blocks.append(block)
        return per_group


class HitQuery(NamedTuple, Generic[SpecT]):
    """One cache-hit search: everything :meth:`SingleTypeManager.find_longest_cache_hit` gets.

    An immutable value, so the contract can grow (a new field, with a
    default, at the end) without breaking a plugin: read the fields by name,
    never by position. A named tuple rather than an attrs class because the
    coordinator builds one per group and lookup: it costs a third as much.

    Attributes:
        block_hashes: The request's block hashes at the spec's block size
            (element ``i`` identifies the prefix up to the end of block ``i``).
        max_length: Longest hit allowed, in tokens.
        kv_cache_group_ids: Groups that share the spec; a hit needs a cached
            block in every one of them.
        cache: Where to look blocks up (the engine's pool or another view of
            cached blocks); see :class:`CachedBlockLookup`.
        spec: The groups' spec.
        use_eagle: EAGLE speculative decoding applies: the block after the hit
            must be cached too, and is dropped from the hit (types whose
            :attr:`~SingleTypeManager.eagle_drops_last_block` is ``False``
            ignore it).
        alignment_tokens: The hit length must be a multiple of this.
    """

    block_hashes: Sequence[Hashable]
    max_length: int
    kv_cache_group_ids: Sequence[int]
    cache: CachedBlockLookup
    spec: SpecT
    use_eagle: bool = False
    alignment_tokens: int = 1

    def no_hit(self) -> tuple[list[int], ...]:
        """The empty hit: one empty list per group."""
        return tuple([] for _ in self.kv_cache_group_ids)


class SingleTypeManager(Generic[SpecT]):
    """Block tables and allocation for one KV cache group of one attention type.

    Subclasses implement :meth:`find_longest_cache_hit` (unless
    :attr:`supports_prefix_caching` is ``False``), declare with
    :attr:`frees_skipped_blocks` whether requests drop blocks before they end
    (then override :meth:`get_num_skipped_tokens`, or
    :meth:`remove_skipped_blocks` for a pattern other than a prefix), and may
    override any allocation step whose behaviour differs. A registry refuses a
    class that breaks these rules, naming the class and the missing piece.

    Args:
        spec: The group's spec.
        block_pool: The pool shared by every group of the engine.
        kv_cache_group_id: Index of the group in the KV cache config.
        enable_caching: Whether prefix caching is on.

    Attributes:
        spec: The group's spec.
        block_size: ``spec.block_size``, tokens per block.
        block_pool: The shared :class:`~kvcore.managers.BlockPool`.
        kv_cache_group_id: Index of the group in the KV cache config.
        enable_caching: Whether prefix caching is on.
        null_block: The null block id (0).
        caches_blocks: Whether the group caches full blocks (prefix caching
            on and the type cacheable).
        cache_grid_tokens: :meth:`cache_blocks` is only ever asked to cache
            up to a multiple of this many tokens (set by the coordinator:
            blocks past the last multiple of the hit alignment can never be
            part of a hit; 1 when nothing is known). :meth:`steady_until`
            counts on it.
        req_to_blocks: Block table per request id (null blocks where the
            type dropped a block).
        num_cached_block: Per *running* request, how many leading blocks of its
            table are already in the prefix cache. A request present here has
            been allocated and gets no new cache hits.
        watches_requests: Whether the engine-facing manager shows this group
            each request before allocating for it
            (:meth:`before_allocation`). ``False`` by default, so that types
            deciding from counts alone pay nothing; a subclass sets it in
            ``__init__``, read once when the coordinator is built.
    """

    #: A hit of length L implies a hit at every aligned length below L (full
    #: attention): the hybrid coordinator then looks the group up once and
    #: only trims afterwards, and puts it first.
    downward_closed_hits: ClassVar[bool] = False
    #: Whether blocks of this type can ever be shared through the prefix
    #: cache. ``False`` (cross attention) makes lookups and caching errors.
    supports_prefix_caching: ClassVar[bool] = True
    #: Whether the group's blocks hold encoder tokens, as in cross attention.
    #: Allocation is then sized by ``num_encoder_tokens``, not decoder tokens.
    allocates_for_encoder: ClassVar[bool] = False
    #: :meth:`find_longest_cache_hit` drops the last matched block when
    #: ``use_eagle`` is set. A type whose finder never drops (its state is
    #: not produced by the draft model) sets this to ``False`` so the hybrid
    #: coordinator does not look one block further for it.
    eagle_drops_last_block: ClassVar[bool] = True
    #: Whether requests drop blocks before they end. The coordinator calls
    #: :meth:`remove_skipped_blocks` for groups of this type (and only for
    #: them) before every allocation. Set it when the type stops reading
    #: earlier tokens (a window, a chunk, a state); a class that overrides
    #: :meth:`get_num_skipped_tokens` or :meth:`remove_skipped_blocks`
    #: without setting it is refused by the registry.
    frees_skipped_blocks: ClassVar[bool] = False

    @classmethod
    def is_prefix_cacheable(cls, spec: SpecT) -> bool:
        """Whether groups of ``spec`` take part in prefix caching.

        Consulted once, when the coordinator is built: a group that is not
        cacheable is never looked up nor cached, and prefix caching cannot be
        enabled for a config containing it. The default is the class's
        :attr:`supports_prefix_caching`; a type whose cacheability depends on
        a spec field (e.g. a Mamba cache mode) overrides this.

        Args:
            spec: The group's spec.
        """
        return cls.supports_prefix_caching

    @classmethod
    def validate_config(
        cls,
        spec: SpecT,
        *,
        enable_caching: bool,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> None:
        """Reject a configuration this type cannot serve, before anything is built.

        Called once per group by the coordinator factory, before the block
        pool and the managers exist, so a refused configuration leaves nothing
        behind. The default accepts everything.

        Args:
            spec: The group's spec.
            enable_caching: Prefix caching is on.
            use_eagle: EAGLE speculative decoding is on.
            alignment_tokens: Hit lengths will be multiples of this many
                tokens (the least common multiple of the prefix-cached groups'
                block sizes; the group's block size for a single group).

        Raises:
            InvalidConfigError: naming the spec field or option to change.
        """

    def __init__(
        self,
        spec: SpecT,
        block_pool: BlockPool,
        *,
        kv_cache_group_id: int = 0,
        enable_caching: bool = True,
    ) -> None:
        self.spec = spec
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.kv_cache_group_id = kv_cache_group_id
        self.enable_caching = enable_caching
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.null_block = NULL_BLOCK
        #: Whether this group puts full blocks in the prefix cache.
        self.caches_blocks = enable_caching and self.is_prefix_cacheable(spec)
        self.cache_grid_tokens = 1
        self.watches_requests = False
        # Per number of leading blocks: the least computed-token count at
        # which get_num_skipped_tokens covers them (see _next_skip).
        self._skip_thresholds: dict[int, int] = {}

    # -- what differs per attention type ----------------------------------------------

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[SpecT]) -> tuple[list[int], ...]:
        """Find the longest usable prefix-cache hit of at most ``query.max_length`` tokens.

        A classmethod: called by the coordinator before a request is admitted,
        and by anything else holding a
        :class:`~kvcore.managers.CachedBlockLookup`. It must look
        blocks up only through ``query.cache`` and change nothing. A hit of
        ``L`` tokens is usable when every token the query at position ``L``
        reads (:meth:`~kvcore.specs.KVCacheSpec.tokens_read`) is in a cached
        block; :func:`kvcore.testing.check_plugin` compares the result with a
        brute-force search built from that rule.

        Args:
            query: The request's hashes, the length limit, the groups, the
                cache, the spec, EAGLE and the alignment.

        Returns:
            One list per group id, all of the same length ``n``, holding the
            blocks covering the first ``n × block_size`` tokens, with the null
            block where the type does not need the block. ``n × block_size``
            is a multiple of ``query.alignment_tokens`` and at most
            ``query.max_length``.
        """
        msg = f"{cls.__qualname__} must implement find_longest_cache_hit"
        raise NotImplementedError(msg)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens (from the request's first) the next token no longer reads.

        Blocks wholly inside this prefix are freed and replaced by the null
        block (when :attr:`frees_skipped_blocks` is set), and cache hits there
        are not adopted. The default, 0, keeps every block until the request
        ends. A type that keeps its first tokens but drops later ones (sinks
        plus a window) returns 0 here and overrides :meth:`remove_skipped_blocks`.

        The answer must depend on ``num_computed_tokens`` only (and never
        decrease as it grows): :meth:`steady_until` remembers, per block,
        the count at which it is first skipped.

        Args:
            num_computed_tokens: Tokens of the request whose KV is computed.
        """
        return 0

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks shared by every request holding blocks in this group.

        Used by cascade attention; 0 (the default) is always correct.
        """
        return 0

    # -- shared bookkeeping ---------------------------------------------------------
    # These methods run on every allocation and compare with ``if`` rather than
    # min()/max(): on CPython 3.11 a call of either builtin parses its arguments
    # (0.3 µs on the benchmark machine, ten times a comparison).

    def before_allocation(self, request: Request) -> None:
        """See the request an allocation is about to serve (groups with ``watches_requests`` set).

        Called inside the allocation's transaction, before
        :meth:`get_num_blocks_to_allocate` and every other step of an
        allocation that may change the request's tables (a decode step that
        the group's :meth:`steady_until` covers is not one). The request
        carries what counts cannot: its prompt length and block hashes. A
        manager that keeps state here records its undo with
        :meth:`BlockPool.record`, so a failed allocation leaves nothing
        behind. The default does nothing.
        """

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
    ) -> int:
        """Predict how many blocks the next allocation will take from the free queue.

        Must equal exactly what :meth:`allocate_new_computed_blocks` plus
        :meth:`allocate_new_blocks` will take; the manager uses it to refuse an
        allocation atomically. Cache-hit blocks that are currently free count:
        adopting them takes them out of the free queue.

        Args:
            request_id: The request.
            num_tokens: Tokens that need a slot after the allocation
                (including those that already have one).
            new_computed_blocks: Cache-hit blocks about to be adopted.
            total_computed_tokens: Computed tokens, local and external.
        """
        num_required = -(-num_tokens // self.block_size)
        if request_id in self.num_cached_block:
            # A running request gets no new hits. With speculative decoding
            # rejected draft tokens can leave it holding more than it needs.
            num_new = num_required - len(self.req_to_blocks[request_id])
            return num_new if num_new > 0 else 0
        table = self.req_to_blocks.get(request_id)
        num_held = len(table) if table is not None else 0
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_new = max(
            num_required - max(num_skipped_blocks, len(new_computed_blocks) + num_held), 0
        )
        # Hits that fall before the window are not adopted, so they take nothing.
        first_kept = max(0, num_skipped_blocks - num_held)
        kept = new_computed_blocks[first_kept:] if first_kept else new_computed_blocks
        return num_new + self.block_pool.count_evictable(kept)

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[int],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Adopt a new request's cache hit (and room for externally computed tokens).

        Hits before the attention window are replaced by null blocks; the rest
        are touched (so they cannot be evicted) and become the head of the
        table. External tokens (loaded by a KV connector) get fresh blocks.
        """
        if request_id in self.num_cached_block:
            if new_computed_blocks:
                msg = f"request {request_id!r} is running; it cannot adopt new cache hits"
                raise RequestStateError(msg)
            return
        table = self.req_to_blocks.get(request_id)
        if table:
            msg = f"request {request_id!r} already holds blocks; hits are adopted once"
            raise RequestStateError(msg)
        num_total_computed = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_tokens = self.get_num_skipped_tokens(num_total_computed)
        num_skipped_blocks = num_skipped_tokens // self.block_size
        if num_skipped_blocks > 0:
            new_computed_blocks = new_computed_blocks[num_skipped_blocks:]
            num_external_computed_tokens = min(
                num_total_computed - num_skipped_tokens, num_external_computed_tokens
            )
        if not self.enable_caching and any(new_computed_blocks):
            msg = "cache-hit blocks were given, but prefix caching is disabled"
            raise InvalidCacheHitError(msg)
        pool = self.block_pool
        if table is None:
            table = self.req_to_blocks[request_id] = []
            pool.record(_undo_set, self.req_to_blocks, request_id, _MISSING)
        pool.record(_undo_truncate, table, 0)
        pool.record(_undo_set, self.num_cached_block, request_id, _MISSING)
        if self.enable_caching:
            pool._touch(new_computed_blocks)
        if num_skipped_blocks:
            table.extend([NULL_BLOCK] * num_skipped_blocks)
        table.extend(new_computed_blocks)
        # Hits (and the nulls standing for skipped hits) are already cached.
        self.num_cached_block[request_id] = len(table)
        if num_external_computed_tokens > 0:
            num_external_blocks = cdiv(num_total_computed, self.block_size) - len(table)
            table.extend(pool._take(num_external_blocks))

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """Grow the request's table so it has slots for ``num_tokens`` tokens.

        Returns:
            The newly allocated blocks (empty if the table was big enough).
        """
        pool = self.block_pool
        table = self.req_to_blocks.get(request_id)
        if table is None:
            table = self.req_to_blocks[request_id] = []
            pool.record(_undo_set, self.req_to_blocks, request_id, _MISSING)
        num_new = -(-num_tokens // self.block_size) - len(table)
        if num_new <= 0:
            return []
        new_blocks = pool._take(num_new)
        pool.record(_undo_truncate, table, len(table))
        table.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Put the request's blocks that are full after ``num_tokens`` tokens in the cache."""
        request_id = request.request_id
        num_cached = self.num_cached_block.get(request_id, 0)
        num_full = num_tokens // self.block_size
        if num_cached >= num_full:
            return
        pool = self.block_pool
        pool._cache_full_blocks(
            request,
            self.req_to_blocks[request_id],
            num_cached,
            num_full,
            self.block_size,
            self.kv_cache_group_id,
        )
        pool.record(
            _undo_set,
            self.num_cached_block,
            request_id,
            self.num_cached_block.get(request_id, _MISSING),
        )
        self.num_cached_block[request_id] = num_full

    def free(self, request_id: str) -> None:
        """Release the request's blocks, last block first (it is evicted first).

        A request that holds no blocks (aborted before allocation) is ignored.
        """
        table = self.req_to_blocks.pop(request_id, _MISSING)
        num_cached = self.num_cached_block.pop(request_id, _MISSING)
        pool = self.block_pool
        pool.record(_undo_forget, self, request_id, table, num_cached)
        if table is not _MISSING and table:
            pool._release(_without_leading_nulls(table)[::-1])

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the blocks the request's next token no longer attends to.

        Called before every allocation of a request, for types that declare
        :attr:`frees_skipped_blocks`. The default frees the blocks wholly
        inside :meth:`get_num_skipped_tokens`. Freed positions become null
        blocks. Blocks are released last to first, and the walk stops at the
        first null (everything before it was freed by an earlier call).
        """
        num_skipped_tokens = self.get_num_skipped_tokens(total_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        table = self.req_to_blocks.get(request_id)
        if not table:
            return
        # The window can move past blocks that were never allocated (external
        # tokens): only existing blocks can be freed.
        num_skipped_blocks = num_skipped_tokens // self.block_size
        if num_skipped_blocks > len(table):
            num_skipped_blocks = len(table)
        if num_skipped_blocks <= 0 or not table[num_skipped_blocks - 1]:
            return
        first = num_skipped_blocks - 1
        while first and table[first - 1]:
            first -= 1
        removed = table[first:num_skipped_blocks]
        # Freed last to first, as the whole table is at the end.
        self.block_pool._release(removed[::-1])
        table[first:num_skipped_blocks] = [NULL_BLOCK] * len(removed)
        self.block_pool.record(_undo_nulls, table, first, removed)

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        """The most tokens a running request can need before this group changes anything.

        A decode step of a running request that adopts nothing, whose
        computed plus new plus lookahead tokens stay at or below this count,
        allocates, caches and frees nothing in this group: the engine-facing
        manager then does not call the group for it. Asked after every
        operation that may change the request's table (its answer may only
        depend on the table and ``num_computed_tokens``).

        The base answer follows the base class's rules: the slots the table
        holds; one token short of the first multiple of
        ``cache_grid_tokens`` at which another block is full (when the
        group caches); and, for a type that frees skipped blocks, the first
        computed-token count at which :meth:`get_num_skipped_tokens` covers
        the oldest block still held (a step that needs that many tokens has
        computed at most one fewer). A subclass that allocates, caches or
        frees by other rules overrides this (returning
        ``num_computed_tokens`` is always correct: every step then takes the
        full route).

        Args:
            request_id: A running request of this group.
            num_computed_tokens: Its computed tokens now.
        """
        table = self.req_to_blocks.get(request_id)
        if not table:
            return num_computed_tokens
        block_size = self.block_size
        limit = len(table) * block_size
        if self.caches_blocks:
            grid = self.cache_grid_tokens
            next_full = (self.num_cached_block.get(request_id, 0) + 1) * block_size
            last_before_full = -(-next_full // grid) * grid - 1
            if last_before_full < limit:
                limit = last_before_full
        if self.frees_skipped_blocks:
            next_skip = self._next_skip(table, num_computed_tokens)
            if next_skip < limit:
                limit = next_skip
        return limit

    def _next_skip(self, table: Sequence[int], num_computed_tokens: int) -> int:
        """The least computed-token count, no less than the current, freeing the oldest block."""
        first_held = bisect_left(table, True, key=bool)
        threshold = self._skip_thresholds.get(first_held)
        if threshold is None:
            threshold = self._skip_thresholds[first_held] = self._skip_threshold(
                (first_held + 1) * self.block_size
            )
        return threshold if threshold > num_computed_tokens else num_computed_tokens

    def _skip_threshold(self, target: int) -> int:
        """The least computed-token count at which ``target`` leading tokens are skipped.

        :meth:`get_num_skipped_tokens` never decreases, so the count is found
        by doubling, then bisection (a few dozen calls, made once per block
        position and remembered).
        """
        skipped = self.get_num_skipped_tokens
        if skipped(_FAR) < target:
            return _NEVER  # the type stops skipping before this block
        low = 0
        if skipped(low) >= target:
            return low
        step = 1
        while skipped(low + step) < target:
            low += step
            step *= 2
        high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            if skipped(middle) >= target:
                high = middle
            else:
                low = middle
        return high

    def new_step_starts(self) -> None:
        """A new scheduling step begins (the engine calls it once per step).

        Blocks cached during a step hold their KV or state only once that
        step has run. Attention reads them in time (every key and value of a
        step is written before any is read, layer by layer), so the default
        does nothing. A type whose layers read their stored state when the
        step starts (a recurrent state) overrides this, remembers what it
        cached during the step, and refuses a hit on it until the next step
        (:class:`~kvcore_plugins.mamba.MambaManager` does).
        """

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table in this group (empty if it holds none)."""
        return self.req_to_blocks.get(request_id, [])


class PrefixManager(SingleTypeManager[SpecT]):
    """Base for types whose cache hit is any cached prefix (full attention and kin).

    Every earlier token stays visible, so a hit is the longest run of cached
    blocks from the start of the prompt, found left to right; it is downward
    closed. Nothing is freed before the request ends.
    """

    downward_closed_hits: ClassVar[bool] = True

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[SpecT]) -> tuple[list[int], ...]:
        """Longest cached prefix, minus EAGLE's last block, cut to the alignment.

        The scan stops at the first miss: hashes are chained, so no later
        block can hit.
        """
        block_size = query.spec.block_size
        hits = query.cache.match_prefix(
            query.block_hashes, 0, query.max_length // block_size, query.kv_cache_group_ids
        )
        length = len(hits[0])
        if query.use_eagle and length:
            length -= 1
        alignment_tokens = query.alignment_tokens
        if block_size != alignment_tokens:
            while length and (length * block_size) % alignment_tokens:
                length -= 1
        if length != len(hits[0]):
            for blocks in hits:
                del blocks[length:]
        return hits

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        """Leading blocks of the request held by every request of the group."""
        num_requests = len(self.req_to_blocks)
        ref_count = self.block_pool.ref_count
        count = 0
        for block in self.req_to_blocks.get(running_request_id, ()):
            if ref_count(block) != num_requests:
                break
            count += 1
        return count
