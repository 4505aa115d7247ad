"""The engine-facing KV cache manager.

An engine asks three things per request and step: how much of this prompt is
already cached (:meth:`KVCacheManager.get_computed_blocks`), give me slots for
N more tokens or say no without changing anything
(:meth:`KVCacheManager.allocate_slots`), and this request is done
(:meth:`KVCacheManager.free`). The answers are block tables, one per KV cache
group. Method names and meanings follow the reference engine's scheduler
interface, so an engine written against it can switch.

The boundary is guarded: every public method checks its arguments (O(1), or
O(blocks it adopts)) and either completes or changes nothing. The changes
of one call run in a transaction of the block pool: if a plugin manager
raises half-way, the pool and every block table are restored exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvcore._boundary import check_cache_hit, checked_count
from kvcore._config import KVCacheConfig
from kvcore._coordinator import KVCacheCoordinator, NoPrefixCacheCoordinator, make_coordinator
from kvcore._events import KVCacheEvent
from kvcore._eviction.registry import DEFAULT_POLICY, resolve_policy
from kvcore._hashing import BlockHasher
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore.errors import (
    InvalidConfigError,
    InvalidRequestError,
    RequestStateError,
    RequestTooLongError,
)
from kvcore.eviction import EvictionPolicyFactory
from kvcore.managers import SingleTypeManager

__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats"]

_INT = {int}

# A limit no token count reaches (the decode fast path's "never").
_NO_LIMIT = 2**62


def _has_fast_decode(coordinator: KVCacheCoordinator) -> bool:
    """Whether every group follows the base class in what the decode fast path skips.

    The fast path of ``allocate_slots`` answers "nothing to do" without
    calling the managers: valid only for managers whose allocation count,
    allocation, caching and (for types that free skipped blocks) removal of
    skipped blocks are the base class's, or whose class declares that its
    overrides act as the base class's in a decode step
    (:attr:`~kvcore.managers.SingleTypeManager.decode_follows_base`, with
    ``decode_room_tokens`` more room). Any other plugin overriding one of
    them takes the full path on every call.
    """
    base = SingleTypeManager
    for manager in coordinator.managers:
        cls = type(manager)
        if cls.decode_follows_base:
            continue
        if (
            cls.get_num_blocks_to_allocate is not base.get_num_blocks_to_allocate
            or cls.allocate_new_blocks is not base.allocate_new_blocks
        ):
            return False
    if any(
        type(m).cache_blocks is not base.cache_blocks and not type(m).decode_follows_base
        for m in coordinator._cacheable
    ):
        return False
    return all(
        type(m).remove_skipped_blocks is base.remove_skipped_blocks for m in coordinator._windowed
    )


class KVCacheBlocks:
    """Blocks per KV cache group, as handed to the scheduler.

    ``blocks[g]`` is the list of block ids of group ``g``, in token order.
    """

    __slots__ = ("blocks",)

    def __init__(self, blocks: tuple[Sequence[int], ...]) -> None:
        self.blocks = blocks

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        """Block ids per group (new lists); ``None`` if all are empty and ``allow_none``."""
        if allow_none and not any(self.blocks):
            return None
        return tuple(list(group) for group in self.blocks)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(
            tuple([*a, *b] for a, b in zip(self.blocks, other.blocks, strict=True))
        )

    def __len__(self) -> int:
        """Number of groups."""
        return len(self.blocks)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return [list(g) for g in self.blocks] == [list(g) for g in other.blocks]

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"KVCacheBlocks({[list(g) for g in self.blocks]})"

    def new_empty(self) -> KVCacheBlocks:
        """An instance with the same number of groups and no blocks."""
        return KVCacheBlocks(tuple(() for _ in self.blocks))


@attrs.define
class PrefixCacheStats:
    """Prefix-cache lookups since the last :meth:`KVCacheManager.make_prefix_cache_stats`.

    A lookup is counted in one of two sets, as the reference engine does:
    that of requests never preempted (``requests``, ``queries``, ``hits``,
    which :attr:`hit_rate` reads), or that of requests resumed after a
    preemption (``preempted_*``), whose lookups find their own blocks again
    and would otherwise inflate the hit rate.

    Attributes:
        requests: Lookups of requests never preempted.
        queries: Tokens those lookups covered.
        hits: Tokens those lookups found in the cache.
        preempted_requests: Lookups of requests resumed after a preemption.
        preempted_queries: Tokens those lookups covered.
        preempted_hits: Tokens those lookups found.
        reset: ``reset_prefix_cache`` succeeded in the interval.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    reset: bool = False

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` over requests never preempted (0.0 with no queries)."""
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Allocates the KV cache of a model's requests, with prefix caching.

    Args:
        kv_cache_config: Groups and block count (from planning, or built by
            hand).
        max_model_len: Longest request, prompt plus output, in tokens.
        registry: Spec → manager map; default :func:`kvcore.load_registry()`
            (every installed plugin, or the selection in ``KVCORE_PLUGINS`` /
            ``KVCORE_DISABLE_PLUGINS``).
        enable_caching: Prefix caching on.
        use_eagle: EAGLE speculative decoding: the last block of every cache
            hit is recomputed (the draft model needs its hidden states).
        hash_algorithm: ``"sha256"`` (reproducible, collision resistant),
            ``"xxh3_128"`` (reproducible across processes and about twice as
            fast, not collision resistant against crafted prompts; needs
            ``pip install 'kvcore[xxhash]'``) or ``"fast"`` (for simulation).
        enable_kv_cache_events: Queue events for :meth:`take_events`.
        log_stats: Gather lookup statistics in :attr:`prefix_cache_stats`.
            ``False`` leaves it ``None`` (as the reference engine's
            ``log_stats=False``) and :meth:`make_prefix_cache_stats` returns
            ``None``.
        eviction: Which cached blocks to give up first when the pool runs
            out of never-used blocks: a policy name (``"lru"``, the default
            and the reference engine's order; see
            :func:`kvcore.available_eviction_policies`, which includes those
            the registry's plugins add) or a factory
            ``(kvcore.eviction.PoolInfo) -> EvictionPolicy``.

    Raises:
        UnknownSpecError: a group's spec is served by no loaded plugin.
        InvalidConfigError: the config cannot be served as asked (a bad
            ``max_model_len`` included).
        PoolTooLargeError: the config has more blocks than a pool can hold.
        UnknownEvictionPolicyError: no policy has the name ``eviction``.
    """

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        *,
        registry: Registry | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        hash_algorithm: str = "sha256",
        enable_kv_cache_events: bool = False,
        log_stats: bool = True,
        eviction: str | EvictionPolicyFactory = DEFAULT_POLICY,
    ) -> None:
        if type(max_model_len) is not int or max_model_len <= 0:
            msg = f"max_model_len must be a positive integer, got {max_model_len!r}"
            raise InvalidConfigError(msg)
        if registry is None:
            registry = load_registry()
        policy_factory = resolve_policy(eviction, registry.eviction_policies)
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.registry = registry
        self.coordinator = make_coordinator(
            kv_cache_config,
            registry,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            enable_kv_cache_events=enable_kv_cache_events,
            eviction=policy_factory,
        )
        self.block_pool = self.coordinator.block_pool
        self._has_windowed_groups = self.coordinator.has_windowed_groups
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.hash_block_size = self.coordinator.hash_block_size
        self._hasher = BlockHasher(self.hash_block_size, hash_algorithm)
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups))
        )
        self.log_stats = log_stats
        #: Lookup statistics since the last :meth:`make_prefix_cache_stats`
        #: (``None`` with ``log_stats=False``).
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None
        # Requests holding blocks, by id: a second Request object with a live
        # id is refused (it would share the first one's block tables).
        self._requests: dict[str, Request] = {}
        self._decoder_groups = tuple(
            m for m in self.coordinator.managers if not m.allocates_for_encoder
        )
        self._free_queue = self.block_pool._free
        self._managers = self.coordinator.managers
        self._undo = self.block_pool._undo
        self._no_hits = self.empty_kv_cache_blocks.blocks
        # The decode fast path (see allocate_slots and _note_decode_limits).
        coordinator = self.coordinator
        self._fast_decode = _has_fast_decode(coordinator)
        self._fast_windowed = tuple(
            (m.req_to_blocks, m.block_size, m.get_num_skipped_tokens) for m in coordinator._windowed
        )
        self._fast_cacheable = (
            coordinator._cacheable
            if enable_caching and not isinstance(coordinator, NoPrefixCacheCoordinator)
            else ()
        )
        # Hashing has nothing to do while the tokens fill no new hash unit.
        self._hash_unit = self.hash_block_size if enable_caching else _NO_LIMIT

    # -- queries ----------------------------------------------------------------------

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0.0–1.0)."""
        return self.block_pool.get_usage()

    @property
    def num_free_blocks(self) -> int:
        """Blocks available to allocations (including evictable cached blocks)."""
        return self.block_pool.get_num_free_blocks()

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Find the longest cached prefix of a waiting request.

        Changes no state: the blocks are only adopted by the following
        :meth:`allocate_slots`. At most ``num_tokens - 1`` tokens can hit (the
        last prompt token is always recomputed to produce logits).

        Returns:
            The hit blocks per group, and the number of hit tokens.

        Raises:
            RequestTooLongError: the request is longer than ``max_model_len``.
            RequestStateError: the request holds blocks of another manager.
            InvalidRequestError: a token id is not a 64-bit integer.
        """
        owner = request._kv_owner
        if owner is not None and owner is not self:
            raise _foreign(request)
        if request.num_tokens > self.max_model_len:
            msg = (
                f"request {request.request_id!r} has {request.num_tokens} tokens, more than "
                f"max_model_len={self.max_model_len}; truncate the prompt or raise "
                "max_model_len"
            )
            raise RequestTooLongError(msg)
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0
        self._hasher.update(request)
        hits, num_hit_tokens = self.coordinator.find_longest_cache_hit(
            request.block_hashes, request.num_tokens - 1
        )
        stats = self.prefix_cache_stats
        if stats is not None:
            if request.num_preemptions:
                stats.preempted_requests += 1
                stats.preempted_queries += request.num_tokens
                stats.preempted_hits += num_hit_tokens
            else:
                stats.requests += 1
                stats.queries += request.num_tokens
                stats.hits += num_hit_tokens
        if not any(hits):
            return self.empty_kv_cache_blocks, num_hit_tokens
        return KVCacheBlocks(hits), num_hit_tokens

    # -- allocation -------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
    ) -> KVCacheBlocks | None:
        """Give a request slots for its next tokens, or change nothing and return None.

        Token layout of the request::

            | computed | new_computed | external | new | lookahead |
                       |<----------- to be allocated ------------->|
                       |<--- cached after this call --->|

        Blocks that fell out of a windowed type's attention window are freed
        first (even if the allocation then fails: they are not needed either
        way). Then the exact number of blocks needed is compared with the
        free blocks; if it does not fit, nothing else changes and ``None`` is
        returned.

        A new request adopts its cache hit here. Every group's hit blocks are
        taken before any group allocates, so that one group's allocation (for
        external tokens) never takes a block another group is about to adopt.
        The reference engine adopts group by group and can hand one block to
        two groups.

        Every argument is checked before anything changes, and the changes
        run in a transaction of the pool: if a plugin manager raises half-way,
        the pool and every block table are restored and the error goes on.

        Args:
            request: The request.
            num_new_tokens: Tokens to compute this step (including unverified
                draft tokens).
            num_new_computed_tokens: Tokens of the cache hit being adopted.
            new_computed_blocks: The hit blocks from :meth:`get_computed_blocks`.
            num_lookahead_tokens: Extra slots for speculative tokens.
            num_external_computed_tokens: Tokens a KV connector will load.
            delay_cache_blocks: Do not cache the new full blocks yet (their KV
                arrives later).
            num_encoder_tokens: Encoder tokens of the request (groups that
                allocate for the encoder, e.g. cross attention).

        Every count is an integer >= 0 (numpy integers accepted). The
        computed tokens (``request.num_computed_tokens`` plus the hit plus
        the external tokens) must be tokens of the request.

        Returns:
            The newly allocated blocks per group, or ``None`` if the pool
            cannot serve the request now.

        Raises:
            InvalidRequestError: a count is not an integer >= 0, nothing to
                allocate (no new and no external tokens), more computed tokens
                than the request has, or a token id that is not a 64-bit
                integer.
            RequestTooLongError: computed plus new tokens exceed
                ``max_model_len``.
            InvalidCacheHitError: the hit blocks are not this request's hit
                (see :class:`~kvcore.errors.InvalidCacheHitError`).
            RequestStateError: another live ``Request`` has this id, the
                request holds blocks of another manager, or a running request
                is given a hit or external tokens.
        """
        running = request._kv_owner is self
        # The decode step (a running request, plain-int counts, nothing to
        # adopt) passes one test; anything else gets the full check.
        if not (
            running
            and new_computed_blocks is None
            and num_new_tokens.__class__ is int
            and num_lookahead_tokens.__class__ is int
            and num_new_tokens > 0
            and num_lookahead_tokens >= 0
            and not (num_new_computed_tokens or num_external_computed_tokens or num_encoder_tokens)
        ):
            (
                num_new_tokens,
                num_new_computed_tokens,
                num_lookahead_tokens,
                num_external_computed_tokens,
                num_encoder_tokens,
            ) = self._check_allocation(
                request,
                running,
                num_new_tokens,
                num_new_computed_tokens,
                new_computed_blocks,
                num_lookahead_tokens,
                num_external_computed_tokens,
                num_encoder_tokens,
            )
        elif self._fast_decode:
            # The step of a running request: each part of the full path runs
            # only if the limits noted by the last full call for this request
            # (see _note_decode_limits) say it has something to do. Most
            # decode steps allocate nothing (the slots suffice in every
            # group), complete no block for the hasher, cache nothing and
            # free nothing: they return here.
            num_computed = request.num_computed_tokens
            num_tokens = len(request._all_token_ids)
            need = num_computed + num_new_tokens
            if (
                num_computed.__class__ is int
                and num_computed <= num_tokens
                and need <= self.max_model_len
            ):
                grow = need + num_lookahead_tokens > request._kv_slots
                num_to_cache = need if need < num_tokens else num_tokens
                cache = not delay_cache_blocks and num_to_cache >= request._kv_cache_at
                request_id = request.request_id
                skip = False
                for tables, block_size, skipped_tokens in self._fast_windowed:
                    skipped = skipped_tokens(num_computed) // block_size
                    if skipped > 0:
                        table = tables.get(request_id)
                        # The base class frees back from the last skipped
                        # block (as far as the table goes) to the first null.
                        if table and table[(skipped if skipped < len(table) else len(table)) - 1]:
                            skip = True
                            break
                if not (
                    grow
                    or cache
                    or skip
                    or num_tokens >= (len(request.block_hashes) + 1) * self._hash_unit
                ):
                    return self.empty_kv_cache_blocks
                num_need_slot = need + num_lookahead_tokens
                return self._running_step(
                    request, num_computed, num_need_slot, num_to_cache, grow, cache, skip
                )
        request_id = request.request_id
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        num_computed = num_local_computed + num_external_computed_tokens
        num_tokens = len(request._all_token_ids)
        if num_computed.__class__ is not int or num_computed > num_tokens:
            self._refuse_computed(request, num_new_computed_tokens, num_external_computed_tokens)
        max_model_len = self.max_model_len
        if num_computed + num_new_tokens > max_model_len:
            msg = (
                f"request {request_id!r} would hold {num_computed + num_new_tokens} "
                f"tokens ({num_computed} computed + {num_new_tokens} new), more than "
                f"max_model_len={max_model_len}; cap num_new_tokens at "
                f"{max_model_len - num_computed}"
            )
            raise RequestTooLongError(msg)
        enable_caching = self.enable_caching
        if enable_caching:
            # Hashing checks the token ids, before anything changes.
            self._hasher.update(request)
        if new_computed_blocks is None:
            hits = self._no_hits
            has_hits = False
            if num_new_computed_tokens:
                check_cache_hit(self.coordinator, request, hits, num_new_computed_tokens, 0)
        else:
            hits = new_computed_blocks.blocks
            has_hits = any(hits)
            if not running and (
                has_hits or num_new_computed_tokens or len(hits) != len(self._no_hits)
            ):
                check_cache_hit(
                    self.coordinator, request, hits, num_new_computed_tokens, num_computed
                )
        # Lookahead slots past the end of the model are never used.
        num_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        if num_need_slot > max_model_len:
            num_need_slot = max_model_len
        coordinator = self.coordinator
        pool = self.block_pool
        # self._checkpoint(), inlined: this is the decode step's path.
        undo = self._undo
        if pool._log is not undo:
            pool.begin()
        elif undo:
            undo.clear()
        try:
            if self._has_windowed_groups:
                coordinator.remove_skipped_blocks(request_id, num_computed)
            num_blocks = coordinator.get_num_blocks_to_allocate(
                request_id, num_need_slot, hits, num_encoder_tokens, num_computed
            )
            if num_blocks > self._free_queue.num_free:
                return None  # the blocks freed above stay free: nobody needs them
            if has_hits or num_external_computed_tokens > 0:
                coordinator.allocate_new_computed_blocks(
                    request_id, hits, num_local_computed, num_external_computed_tokens
                )
            new_blocks = coordinator.allocate_new_blocks(
                request_id, num_need_slot, num_encoder_tokens
            )
            if enable_caching and not delay_cache_blocks:
                # Unverified draft tokens past the request's tokens are not cached.
                num_to_cache = num_computed + num_new_tokens
                coordinator.cache_blocks(
                    request, num_to_cache if num_to_cache < num_tokens else num_tokens
                )
        except BaseException:
            pool.rollback()
            raise
        if not running:
            request._kv_owner = self
            self._requests[request_id] = request
        if self._fast_decode:
            self._note_decode_limits(request)
        if not any(new_blocks):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(new_blocks)

    def _running_step(
        self,
        request: Request,
        num_computed: int,
        num_need_slot: int,
        num_to_cache: int,
        grow: bool,
        cache: bool,
        skip: bool,
    ) -> KVCacheBlocks | None:
        """The full path of ``allocate_slots`` for a running request, minus the no-ops.

        The same calls in the same order (hashing, skipped blocks, the count
        and the refusal, the allocation, caching), each made only when its
        flag says the base class would do something: ``grow``, the slots do
        not suffice; ``cache``, a block becomes full; ``skip``, a windowed
        group has a block to free. Only for managers that follow the base
        class there (``_fast_decode``).
        """
        if self.enable_caching:
            # Hashing checks the token ids, before anything changes.
            self._hasher.update(request)
        if num_need_slot > self.max_model_len:
            num_need_slot = self.max_model_len
        request_id = request.request_id
        coordinator = self.coordinator
        pool = self.block_pool
        undo = self._undo
        if pool._log is not undo:
            pool.begin()
        elif undo:
            undo.clear()
        new_blocks = None
        try:
            if skip:
                coordinator.remove_skipped_blocks(request_id, num_computed)
            if grow:
                num_blocks = coordinator.get_num_blocks_to_allocate(
                    request_id, num_need_slot, self._no_hits, 0, num_computed
                )
                if num_blocks > self._free_queue.num_free:
                    return None  # the blocks freed above stay free: nobody needs them
                new_blocks = coordinator.allocate_new_blocks(request_id, num_need_slot, 0)
            if cache:
                coordinator.cache_blocks(request, num_to_cache)
        except BaseException:
            pool.rollback()
            raise
        if grow or cache:
            self._note_decode_limits(request)
        if new_blocks is None or not any(new_blocks):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(new_blocks)

    def _note_decode_limits(self, request: Request) -> None:
        """Note on ``request`` what the decode fast path of ``allocate_slots`` tests.

        ``_kv_slots``: tokens the request has slots for in every decoder
        group (a smaller need allocates nothing, in the base class's rule),
        less each group's ``decode_room_tokens``.
        ``_kv_cache_at``: the computed-token count at which some cacheable
        group caches its next block. Noted after every full call for the
        request (and after ``cache_blocks``); the tables change only in those.
        """
        request_id = request.request_id
        slots = _NO_LIMIT
        for manager in self._decoder_groups:
            table = manager.req_to_blocks.get(request_id)
            held = len(table) * manager.block_size if table is not None else 0
            held -= manager.decode_room_tokens
            if held < slots:
                slots = held
        request._kv_slots = slots if self._decoder_groups else 0
        cache_at = _NO_LIMIT
        for manager in self._fast_cacheable:
            next_full = (manager.num_cached_block.get(request_id, 0) + 1) * manager.block_size
            if next_full < cache_at:
                cache_at = next_full
        request._kv_cache_at = cache_at

    def _check_allocation(
        self,
        request: Request,
        running: bool,
        num_new_tokens: Any,
        num_new_computed_tokens: Any,
        new_computed_blocks: KVCacheBlocks | None,
        num_lookahead_tokens: Any,
        num_external_computed_tokens: Any,
        num_encoder_tokens: Any,
    ) -> tuple[int, int, int, int, int]:
        """The checks of ``allocate_slots`` past the decode step's: counts and request state.

        Returns the counts as plain ints (numpy integers are converted).
        """
        counts = (
            num_new_tokens,
            num_new_computed_tokens,
            num_lookahead_tokens,
            num_external_computed_tokens,
            num_encoder_tokens,
        )
        if {*map(type, counts)} != _INT or min(counts) < 0:
            num_new_tokens = checked_count("num_new_tokens", num_new_tokens)
            num_new_computed_tokens = checked_count(
                "num_new_computed_tokens", num_new_computed_tokens
            )
            num_lookahead_tokens = checked_count("num_lookahead_tokens", num_lookahead_tokens)
            num_external_computed_tokens = checked_count(
                "num_external_computed_tokens", num_external_computed_tokens
            )
            num_encoder_tokens = checked_count("num_encoder_tokens", num_encoder_tokens)
        if not running:
            if request._kv_owner is not None:
                raise _foreign(request)
            if request.request_id in self._requests:
                msg = (
                    f"request {request.request_id!r}: another Request object with id "
                    f"{request.request_id!r} holds blocks of this manager; request ids must "
                    "be unique among live requests (free the other one first)"
                )
                raise RequestStateError(msg)
        elif (
            num_new_computed_tokens
            or num_external_computed_tokens
            or (new_computed_blocks is not None and any(new_computed_blocks.blocks))
        ):
            raise _adopted_once(request, num_new_computed_tokens, new_computed_blocks)
        if not num_new_tokens and not num_external_computed_tokens:
            msg = (
                f"request {request.request_id!r}: num_new_tokens must be > 0 when there "
                "are no external computed tokens"
            )
            raise InvalidRequestError(msg)
        return (
            num_new_tokens,
            num_new_computed_tokens,
            num_lookahead_tokens,
            num_external_computed_tokens,
            num_encoder_tokens,
        )

    @staticmethod
    def _refuse_computed(request: Request, num_hit: int, num_external: int) -> None:
        engine = request.num_computed_tokens
        if engine.__class__ is not int or engine < 0:
            msg = (
                f"request {request.request_id!r}: num_computed_tokens must be an integer "
                f">= 0, got {engine!r}"
            )
            raise InvalidRequestError(msg)
        computed = engine + num_hit + num_external
        msg = (
            f"request {request.request_id!r} has {request.num_tokens} tokens, fewer than the "
            f"{computed} computed (num_computed_tokens={engine} + num_new_computed_tokens="
            f"{num_hit} + num_external_computed_tokens={num_external}); computed tokens "
            "must be tokens of the request"
        )
        raise InvalidRequestError(msg)

    def _checkpoint(self) -> None:
        """Start recording this operation's changes (forget the previous one's).

        The pool records every change while this manager lives: an operation
        only drops what the previous one recorded (cheaper than starting and
        ending a transaction around every decode step). After a rollback,
        recording is started again.
        """
        undo = self._undo
        if self.block_pool._log is not undo:
            self.block_pool.begin()
        elif undo:
            undo.clear()

    def _run(self, operation: Any, *arguments: Any) -> None:
        """Run ``operation(*arguments)`` so that it completes or changes nothing."""
        self._checkpoint()
        try:
            operation(*arguments)
        except BaseException:
            self.block_pool.rollback()
            raise

    def free(self, request: Request) -> None:
        """Release every block of a finished or preempted request.

        Blocks are freed last first, so a request's tail is evicted before
        its head (which other requests are more likely to share). A request
        that holds no blocks (never allocated, or freed already: preempted,
        then aborted while waiting) is ignored, as the reference engine does.

        Raises:
            RequestStateError: the request holds blocks of another manager;
                nothing changes.
        """
        owner = request._kv_owner
        if owner is not self:
            if owner is None:
                return
            raise _foreign(request)
        # What _run(coordinator.free, ...) does, two calls fewer: free runs
        # once per finished request, mostly on short or windowed tables.
        request_id = request.request_id
        self._checkpoint()
        try:
            for manager in self._managers:
                manager.free(request_id)
        except BaseException:
            self.block_pool.rollback()
            raise
        request._kv_owner = None
        del self._requests[request_id]

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's blocks that are full after ``num_computed_tokens`` tokens.

        For blocks allocated with ``delay_cache_blocks=True`` whose KV has
        arrived since. A no-op with prefix caching off.

        Raises:
            InvalidRequestError: ``num_computed_tokens`` is not an integer >=
                0, or is more than the request's tokens or slots.
            RequestStateError: the request holds no blocks of this manager.
        """
        if num_computed_tokens.__class__ is not int or num_computed_tokens < 0:
            num_computed_tokens = checked_count("num_computed_tokens", num_computed_tokens)
        if not self.enable_caching:
            return
        if request._kv_owner is not self:
            msg = (
                f"request {request.request_id!r} holds no blocks of this manager; cache the "
                "blocks of a request after allocate_slots gave it some"
            )
            raise RequestStateError(msg)
        if num_computed_tokens > request.num_tokens:
            msg = (
                f"num_computed_tokens={num_computed_tokens} is more than request "
                f"{request.request_id!r}'s {request.num_tokens} tokens; blocks are cached "
                "only for tokens of the request"
            )
            raise InvalidRequestError(msg)
        self._check_slots(request.request_id, num_computed_tokens, "num_computed_tokens")
        self._hasher.update(request)
        self._run(self.coordinator.cache_blocks, request, num_computed_tokens)
        if self._fast_decode:
            self._note_decode_limits(request)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the request's blocks that fell out of every windowed type's window.

        ``total_computed_tokens`` may be the request's token count even where
        that is one more than it has slots for: vLLM's scheduler passes
        ``request.num_tokens`` when a finished request is handed to a KV
        connector, and the last sampled token never got a slot. A request
        that holds no blocks is ignored.

        Raises:
            InvalidRequestError: ``total_computed_tokens`` is not an integer >=
                0, or is more than both the tokens the request has slots for
                and its token count (it would free blocks the request still
                reads).
        """
        if total_computed_tokens.__class__ is not int or total_computed_tokens < 0:
            total_computed_tokens = checked_count("total_computed_tokens", total_computed_tokens)
        request = self._requests.get(request_id)
        if request is None:
            return
        if self._decoder_groups and total_computed_tokens > request.num_tokens:
            self._check_slots(request_id, total_computed_tokens, "total_computed_tokens")
        if self._has_windowed_groups:
            self._run(self.coordinator.remove_skipped_blocks, request_id, total_computed_tokens)

    def _check_slots(self, request_id: str, num_tokens: int, name: str) -> None:
        slots = max(
            (len(m.get_block_ids(request_id)) * m.block_size for m in self._decoder_groups),
            default=0,
        )
        if num_tokens > slots:
            msg = (
                f"{name}={num_tokens} is more than the {slots} tokens request {request_id!r} "
                f"has slots for; pass a count of the request's computed tokens"
            )
            raise InvalidRequestError(msg)

    def new_step_starts(self) -> None:
        """Announce a new scheduling step; call it once at the start of every step.

        Blocks cached while a step is scheduled hold their contents only once
        the step has run. Attention reads them in time, but a recurrent layer
        (Mamba) reads a request's stored state when the step starts, so a
        request must not adopt a state cached in the same step: from the
        first call on, such an allocation returns ``None`` (the request waits
        one step, nothing changes) and succeeds after the next call. vLLM's
        scheduler (0.15 and later) makes the same call. An engine that never
        calls it keeps vLLM 0.14's behaviour, in which that hit reads a state
        not written yet (the Mamba manager logs a warning when it happens).
        Cheap: O(groups) plus the states cached in the step that ended.
        """
        self.coordinator.new_step_starts()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, if no request holds blocks (else change nothing).

        Returns:
            Whether the cache was cleared.
        """
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop the given blocks from the prefix cache (their contents are invalid).

        Raises:
            InvalidBlockError: an id is not a block of the pool; nothing changes.
        """
        self.block_pool.evict_blocks(block_ids)

    def take_events(self) -> list[KVCacheEvent]:
        """Return and clear the queued KV cache events (empty if events are off)."""
        return self.block_pool.take_events()

    def peek_events(self) -> tuple[KVCacheEvent, ...]:
        """The queued KV cache events, oldest first, without taking them."""
        return self.block_pool.peek_events()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Return the lookup statistics gathered since the last call, and restart them.

        ``None`` when the manager was built with ``log_stats=False``.
        """
        stats = self.prefix_cache_stats
        if stats is None:
            return None
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's blocks in every group."""
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids in every group (copies)."""
        return tuple(list(blocks) for blocks in self.coordinator.get_blocks(request_id))

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, leading blocks shared by every request that holds blocks."""
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def block_table(
        self, request_ids: Sequence[str], group_id: int = 0, width: int | None = None
    ) -> Any:
        """A padded ``int32`` numpy array of the requests' block tables in one group.

        Row ``i`` holds the block ids of ``request_ids[i]``, padded with the
        null block (0) up to ``width`` columns (default: the longest table).
        This is the array a model runner copies to the device.

        Raises:
            InvalidRequestError: a table is longer than ``width``, or
                ``group_id`` is not a group.
        """
        import numpy as np

        if group_id.__class__ is not int or not 0 <= group_id < self.num_kv_cache_groups:
            msg = f"group_id must be 0..{self.num_kv_cache_groups - 1}, got {group_id!r}"
            raise InvalidRequestError(msg)
        manager = self.coordinator.managers[group_id]
        tables = [manager.get_block_ids(request_id) for request_id in request_ids]
        longest = max(map(len, tables), default=0)
        if width is None:
            width = longest
        elif longest > width:
            msg = f"a block table has {longest} blocks, more than width={width}"
            raise InvalidRequestError(msg)
        array = np.zeros((len(tables), width), dtype=np.int32)
        for row, table in enumerate(tables):
            array[row, : len(table)] = table
        return array


def _foreign(request: Request) -> RequestStateError:
    msg = (
        f"request {request.request_id!r} holds blocks of another KVCacheManager; a Request "
        "belongs to one manager (free it with the manager that allocated it)"
    )
    return RequestStateError(msg)


def _adopted_once(request: Request, num_hit: int, hit: KVCacheBlocks | None) -> RequestStateError:
    if num_hit or (hit is not None and any(hit.blocks)):
        what = "cache hits (num_new_computed_tokens, new_computed_blocks)"
    else:
        what = "external computed tokens (num_external_computed_tokens)"
    msg = (
        f"request {request.request_id!r} already holds blocks; {what} are adopted once, "
        "when it is admitted (a preempted request is freed, then admitted again)"
    )
    return RequestStateError(msg)
