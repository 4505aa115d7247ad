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

The tokens of a request, as :meth:`KVCacheManager.allocate_slots` sees them::

    | computed | new_computed | external | new | lookahead |
               |<----------- to be allocated ------------->|
               |<--- cached after this call --->|

An allocation takes one route. A running request's decode step that stays
within every group's :meth:`~kvcore.managers.SingleTypeManager.steady_until`
(and completes no block for the hasher) changes nothing and returns at once.
Any other call has its counts, lengths and hit checked, then, in one
transaction: the blocks no longer read are freed, the blocks needed are
counted against the free ones (``None`` if they do not fit), the hit and the
external tokens' blocks are adopted, the table grows, and the full blocks are
cached. Every group's hit blocks are taken before any group allocates, so one
group's allocation (for external tokens) never takes a block another group
is about to adopt; the reference engine adopts group by group and can hand
one block to two groups.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

import attrs

from kvcore._config import KVCacheConfig
from kvcore._coordinator import make_coordinator
from kvcore._events import KVCacheEvent
from kvcore._eviction.registry import DEFAULT_POLICY, select_policy
from kvcore._hashing import DIGEST_SIZES, INT_HASH_ALGORITHMS, BlockHasher
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore.errors import (
    ConcurrentUseError,
    InvalidConfigError,
    InvalidRequestError,
    RequestStateError,
    RequestTooLongError,
)
from kvcore.eviction import EvictionPolicyFactory

__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats", "checked_count"]


# A token count no request reaches: hashing never has work with caching off.
_NO_LIMIT = 2**62


def checked_count(name: str, value: object) -> int:
    """``value`` as an ``int`` >= 0 (numpy integers accepted), else a request error.

    ``bool`` and ``float`` are refused even when integral: a float count
    would turn the pool's counters into floats.
    """
    if isinstance(value, bool | float):
        value_ok = None
    else:
        try:
            value_ok = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            value_ok = None
    if value_ok is None or value_ok < 0:
        msg = f"{name} must be an integer >= 0, got {value!r}"
        raise InvalidRequestError(msg)
    return value_ok


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

    def count(self, request: Request, num_hit_tokens: int) -> None:
        """Count one lookup of ``request`` that found ``num_hit_tokens`` cached tokens.

        A resumed request's lookup counts only in the ``preempted_*`` fields
        (as vLLM 0.14's statistics count it), a fresh one only in the others.
        """
        if request.num_preemptions:
            self.preempted_requests += 1
            self.preempted_queries += request.num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.requests += 1
            self.queries += request.num_tokens
            self.hits += num_hit_tokens

    @property
    def hit_rate(self) -> float:
        """``hits / queries`` over requests never preempted (0.0 with no queries)."""
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    """Allocates the KV cache of a model's requests, with prefix caching.

    A manager is single-threaded: a call made while another thread's call
    runs is refused with :class:`~kvcore.errors.ConcurrentUseError` before it
    changes anything.

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
        backend: The block pool's implementation: ``"auto"`` (the compiled
            pool where it serves the configuration, else the Python one),
            ``"native"`` (the compiled pool, or an error) or ``"python"``;
            ``None``: the ``KVCORE_BACKEND`` environment variable, else
            ``"auto"``. :attr:`backend` tells which one serves.

    Raises:
        UnknownSpecError: a group's spec is served by no loaded plugin.
        InvalidConfigError: the config cannot be served as asked (a bad
            ``max_model_len`` included; an unknown ``backend``, or
            ``"native"`` for a configuration it does not serve).
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
        backend: str | None = None,
    ) -> None:
        if type(max_model_len) is not int or max_model_len <= 0:
            msg = f"max_model_len must be a positive integer, got {max_model_len!r}"
            raise InvalidConfigError(msg)
        if registry is None:
            registry = load_registry()
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
            eviction=select_policy(eviction, registry.eviction_policies),
            backend=backend,
            digest_size=DIGEST_SIZES.get(hash_algorithm),
            int_hashes=hash_algorithm in INT_HASH_ALGORITHMS,
        )
        self.block_pool = self.coordinator.block_pool
        #: Which backend serves this manager's block pool, ``"native"`` or ``"python"``.
        self.backend: str = self.block_pool.backend
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.hash_block_size = self.coordinator.hash_block_size
        self._hasher = BlockHasher(
            self.hash_block_size, hash_algorithm, native=self.backend == "native"
        )
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
        # Per running request: the tokens it may need before any group has
        # something to do (the least of the coordinator's steady_until after
        # its last change), and that count per group.
        self._steady: dict[str, int] = {}
        self._group_steady: dict[str, list[int]] = {}
        # A running request's step that adopts nothing calls only the groups
        # with work (see _groups_due); with encoder groups, every group acts,
        # and so does the one group of a single-group model.
        self._steps_by_group = (
            not self.coordinator.encoder_groups and self.num_kv_cache_groups > 1
        )
        # The pool's one transaction object (see BlockPool.transaction).
        self._transaction = self.block_pool.transaction()
        # A decode step has hashing to do once its tokens fill a new hash unit.
        self._hash_unit = self.hash_block_size if enable_caching else _NO_LIMIT
        self._busy = threading.Lock()

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
            ConcurrentUseError: another thread is inside this manager.
        """
        self._enter()
        try:
            return self._lookup(request)
        finally:
            self._busy.release()

    def _lookup(self, request: Request) -> tuple[KVCacheBlocks, int]:
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
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.count(request, num_hit_tokens)
        if not any(hits):
            return self.empty_kv_cache_blocks, num_hit_tokens
        return KVCacheBlocks(hits), num_hit_tokens

    # -- allocation -------------------------------------------------------------------
    # The allocation route compares with ``if`` rather than min()/max(): see the
    # note in kvcore.managers (the builtins cost ten comparisons each on CPython 3.11).

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

        Blocks that fell out of a windowed type's window are freed first (even
        if the allocation then fails: nobody needs them); then the exact
        number of blocks needed is compared with the free blocks. A new
        request adopts its cache hit here. See the module documentation for
        the token layout and the route a call takes.

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
        the external tokens) must be tokens of the request; a request that
        holds no blocks starts from ``num_computed_tokens == 0``.

        Returns:
            The newly allocated blocks per group, or ``None`` if the pool
            cannot serve the request now.

        Raises:
            InvalidRequestError: a count is not an integer >= 0, nothing to
                allocate (no new and no external tokens), more computed tokens
                than the request has, a request holding no blocks with
                computed tokens, or a token id that is not a 64-bit integer.
            RequestTooLongError: computed plus new tokens exceed
                ``max_model_len``.
            InvalidCacheHitError: the hit blocks are not this request's hit
                (see :class:`~kvcore.errors.InvalidCacheHitError`).
            RequestStateError: another live ``Request`` has this id, the
                request holds blocks of another manager, or a running request
                is given a hit or external tokens.
            ConcurrentUseError: another thread is inside this manager.
        """
        if (
            new_computed_blocks is None
            and request._kv_owner is self
            and not (num_new_computed_tokens or num_external_computed_tokens or num_encoder_tokens)
            and self._decode_step_is_steady(request, num_new_tokens, num_lookahead_tokens)
        ):
            return self.empty_kv_cache_blocks
        # Inline rather than self._enter(): this call runs on every engine step.
        if not self._busy.acquire(False):
            raise _called_from_two_threads()
        try:
            return self._allocate(
                request,
                num_new_tokens,
                num_new_computed_tokens,
                new_computed_blocks,
                num_lookahead_tokens,
                num_external_computed_tokens,
                delay_cache_blocks,
                num_encoder_tokens,
            )
        finally:
            self._busy.release()

    def _decode_step_is_steady(
        self, request: Request, num_new_tokens: object, num_lookahead_tokens: object
    ) -> bool:
        """Whether this step of a running request changes no table (no group has work).

        A decode step mostly allocates, caches and frees nothing. One that
        completes a hash unit is hashed here (the hasher checks the new token
        ids; nothing else changes). Only valid arguments qualify: any doubt
        sends the call the full way, where it is checked.
        """
        num_computed = request.num_computed_tokens
        if not (
            num_new_tokens.__class__ is int
            and num_lookahead_tokens.__class__ is int
            and num_computed.__class__ is int
        ):
            return False
        need = num_computed + num_new_tokens
        num_tokens = len(request._all_token_ids)
        if not (
            num_new_tokens > 0
            and num_lookahead_tokens >= 0
            and 0 <= num_computed <= num_tokens
            and need <= self.max_model_len
            and need + num_lookahead_tokens <= self._steady[request.request_id]
        ):
            return False
        if num_tokens >= (len(request.block_hashes) + 1) * self._hash_unit:
            self._hasher.update(request)
        return True

    def _allocate(
        self,
        request: Request,
        num_new_tokens: Any,
        num_new_computed_tokens: Any,
        new_computed_blocks: KVCacheBlocks | None,
        num_lookahead_tokens: Any,
        num_external_computed_tokens: Any,
        delay_cache_blocks: bool,
        num_encoder_tokens: Any,
    ) -> KVCacheBlocks | None:
        """The one allocation route: the checks, then the changes in one transaction."""
        running = request._kv_owner is self
        num_new, num_hit, num_lookahead, num_external, num_encoder = self._checked_counts(
            request,
            running,
            (
                num_new_tokens,
                num_new_computed_tokens,
                num_lookahead_tokens,
                num_external_computed_tokens,
                num_encoder_tokens,
            ),
            new_computed_blocks,
        )
        num_computed = self._checked_computed(request, running, num_new, num_hit, num_external)
        if self.enable_caching:
            # Hashing checks the token ids, before anything changes.
            self._hasher.update(request)
        hits = self._checked_hits(request, running, new_computed_blocks, num_hit, num_computed)
        # Lookahead slots past the end of the model are never used.
        num_need_slot = num_computed + num_new + num_lookahead
        if num_need_slot > self.max_model_len:
            num_need_slot = self.max_model_len
        num_to_cache = None
        if not delay_cache_blocks:
            # Draft tokens are not the request's tokens yet: they are never cached.
            num_to_cache = num_computed + num_new
            num_tokens = len(request._all_token_ids)
            if num_to_cache > num_tokens:
                num_to_cache = num_tokens
        request_id = request.request_id
        groups = None
        if running and self._steps_by_group and not (num_hit or num_external or num_encoder):
            groups = self._groups_due(request_id, num_computed + num_new + num_lookahead)
            if not groups:
                return self.empty_kv_cache_blocks
            if len(groups) == self.num_kv_cache_groups:
                groups = None  # every group acts: the plain passes, without picking
        with self._transaction:
            new_blocks = self._change_tables(
                request,
                hits,
                (num_computed - num_external, num_external, num_need_slot, num_encoder),
                num_to_cache,
                groups,
            )
            # Asked inside the transaction: a manager that raises here undoes the step.
            holds_blocks = running or new_blocks is not None
            if holds_blocks:
                steady = self._steady_after(request, groups)
        if holds_blocks:
            self._set_steady(request_id, steady)
        if new_blocks is None:
            return None
        if not running:
            request._kv_owner = self
            self._requests[request_id] = request
        return KVCacheBlocks(new_blocks) if any(new_blocks) else self.empty_kv_cache_blocks

    def _change_tables(
        self,
        request: Request,
        hits: tuple[Sequence[int], ...],
        counts: tuple[int, int, int, int],
        num_to_cache: int | None,
        groups: Sequence[int] | None,
    ) -> tuple[Sequence[int], ...] | None:
        """Free skipped blocks, then adopt, allocate and cache, or return ``None`` if no room.

        ``counts``: local computed tokens, external tokens, tokens that need
        a slot, encoder tokens. ``groups``: the groups that act (``None``:
        all). Runs inside the caller's transaction. The skipped blocks freed
        before a refusal stay free: nobody needs them.
        """
        num_local_computed, num_external, num_need_slot, num_encoder = counts
        request_id = request.request_id
        coordinator = self.coordinator
        num_computed = num_local_computed + num_external
        for manager in coordinator.watching:
            manager.before_allocation(request)
        if coordinator.windowed:
            coordinator.remove_skipped_blocks(request_id, num_computed, groups)
        demand = coordinator.blocks_to_allocate(
            request_id, num_need_slot, hits, num_encoder, num_computed, groups
        )
        if not self.block_pool.make_room(demand, hits):
            return None
        if any(hits) or num_external > 0:
            coordinator.allocate_new_computed_blocks(
                request_id, hits, num_local_computed, num_external
            )
        new_blocks = coordinator.allocate_new_blocks(request_id, num_need_slot, num_encoder, groups)
        if self.enable_caching and num_to_cache is not None:
            coordinator.cache_blocks(request, num_to_cache, groups)
        return new_blocks

    def _groups_due(self, request_id: str, num_wanted: int) -> list[int]:
        """The groups with work in a running request's step that adopts nothing.

        ``num_wanted``: computed plus new plus lookahead tokens. A group
        whose :meth:`~kvcore.managers.SingleTypeManager.steady_until` (asked
        after its table last changed) is at least that has nothing to do, so
        a step costs what its acting groups do, not what every group does
        (groups with small blocks act every few tokens, the others rarely).
        """
        due = []  # a loop, not a comprehension: see KVCacheCoordinator.blocks_to_allocate
        for group, limit in enumerate(self._group_steady[request_id]):
            if num_wanted > limit:
                due.append(group)
        return due

    def _steady_after(self, request: Request, groups: Sequence[int] | None = None) -> list[int]:
        """Ask the groups when the request's next change comes (after its tables changed).

        ``groups``: the groups whose tables may have changed (``None``: all);
        the others keep their answer.
        """
        coordinator = self.coordinator
        num_computed = request.num_computed_tokens
        if groups is None:
            return coordinator.steady_until(request.request_id, num_computed)
        steady = self._group_steady[request.request_id].copy()
        for group in groups:
            steady[group] = coordinator.managers[group].steady_until(
                request.request_id, num_computed
            )
        return steady

    def _set_steady(self, request_id: str, limits: list[int]) -> None:
        self._group_steady[request_id] = limits
        self._steady[request_id] = min(limits)

    # -- the checks of the allocation route ---------------------------------------------

    def _checked_counts(
        self,
        request: Request,
        running: bool,
        counts: tuple[Any, Any, Any, Any, Any],
        new_computed_blocks: KVCacheBlocks | None,
    ) -> tuple[int, int, int, int, int]:
        """The counts as plain ints (numpy integers converted), and the request's state.

        ``counts``: new, hit, lookahead, external and encoder tokens.
        """
        new, hit, lookahead, external, encoder = counts
        if not (
            new.__class__ is int
            and hit.__class__ is int
            and lookahead.__class__ is int
            and external.__class__ is int
            and encoder.__class__ is int
            and min(counts) >= 0
        ):
            names = (
                "num_new_tokens",
                "num_new_computed_tokens",
                "num_lookahead_tokens",
                "num_external_computed_tokens",
                "num_encoder_tokens",
            )
            counts = tuple(  # type: ignore[assignment]
                checked_count(name, value) for name, value in zip(names, counts, strict=True)
            )
        num_new, num_hit, _, num_external, _ = counts
        if not running:
            self._check_admissible(request)
        elif num_hit or num_external or (new_computed_blocks and any(new_computed_blocks.blocks)):
            raise _adopted_once(request, num_hit, new_computed_blocks)
        if not num_new and not num_external:
            msg = (
                f"request {request.request_id!r}: num_new_tokens must be > 0 when there "
                "are no external computed tokens"
            )
            raise InvalidRequestError(msg)
        return counts

    def _check_admissible(self, request: Request) -> None:
        """A request holding no blocks: not another manager's, its id free, nothing computed."""
        if request._kv_owner is not None:
            raise _foreign(request)
        if request.request_id in self._requests:
            msg = (
                f"request {request.request_id!r}: another Request object with id "
                f"{request.request_id!r} holds blocks of this manager; request ids must "
                "be unique among live requests (free the other one first)"
            )
            raise RequestStateError(msg)
        if request.num_computed_tokens != 0:
            msg = (
                f"request {request.request_id!r} holds no blocks but has "
                f"num_computed_tokens={request.num_computed_tokens!r}: tokens computed "
                "before have no KV anywhere (a preempted request is freed and starts over); "
                "set num_computed_tokens to 0 and pass a cache hit or external tokens instead"
            )
            raise InvalidRequestError(msg)

    def _checked_computed(
        self, request: Request, running: bool, num_new: int, num_hit: int, num_external: int
    ) -> int:
        """The computed tokens (local, hit, external): tokens of the request, within the limit."""
        num_computed = request.num_computed_tokens + num_hit + num_external
        if num_computed.__class__ is not int or num_computed > len(request._all_token_ids):
            self._refuse_computed(request, num_hit, num_external)
        if num_computed + num_new > self.max_model_len:
            msg = (
                f"request {request.request_id!r} would hold {num_computed + num_new} "
                f"tokens ({num_computed} computed + {num_new} new), more than "
                f"max_model_len={self.max_model_len}; cap num_new_tokens at "
                f"{self.max_model_len - num_computed}"
            )
            raise RequestTooLongError(msg)
        return num_computed

    def _checked_hits(
        self,
        request: Request,
        running: bool,
        new_computed_blocks: KVCacheBlocks | None,
        num_hit: int,
        num_computed: int,
    ) -> tuple[Sequence[int], ...]:
        """The hit blocks to adopt, checked to be this request's (hashes up to date)."""
        if new_computed_blocks is None:
            if num_hit:
                self.coordinator.check_hit(request, self.empty_kv_cache_blocks.blocks, num_hit, 0)
            return self.empty_kv_cache_blocks.blocks
        hits = new_computed_blocks.blocks
        if not running:
            self.coordinator.check_hit(request, hits, num_hit, num_computed)
        return hits

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

    def _enter(self) -> None:
        """Hold the manager for this call, or refuse a call from a second thread."""
        if not self._busy.acquire(False):  # positional: no keyword dict per call
            raise _called_from_two_threads()

    # -- freeing and caching ----------------------------------------------------------

    def free(self, request: Request) -> None:
        """Release every block of a finished or preempted request.

        Blocks are freed last first, so a request's tail is evicted before
        its head (which other requests are more likely to share). A request
        that holds no blocks (never allocated, or freed already: preempted,
        then aborted while waiting) is ignored, as the reference engine does.

        Raises:
            RequestStateError: the request holds blocks of another manager;
                nothing changes.
            ConcurrentUseError: another thread is inside this manager.
        """
        owner = request._kv_owner
        if owner is not self:
            if owner is None:
                return
            raise _foreign(request)
        self._enter()
        try:
            with self._transaction:
                self.coordinator.free(request.request_id)
            request._kv_owner = None
            del self._requests[request.request_id]
            del self._steady[request.request_id]
            del self._group_steady[request.request_id]
        finally:
            self._busy.release()

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's blocks that are full after ``num_computed_tokens`` tokens.

        For blocks allocated with ``delay_cache_blocks=True`` whose KV has
        arrived since. A no-op with prefix caching off.

        Raises:
            InvalidRequestError: ``num_computed_tokens`` is not an integer >=
                0, or is more than the request's tokens or slots.
            RequestStateError: the request holds no blocks of this manager.
            ConcurrentUseError: another thread is inside this manager.
        """
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
        self._enter()
        try:
            self._hasher.update(request)
            with self._transaction:
                self.coordinator.cache_blocks(request, num_computed_tokens)
                steady = self._steady_after(request)
            self._set_steady(request.request_id, steady)
        finally:
            self._busy.release()

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
            ConcurrentUseError: another thread is inside this manager.
        """
        total_computed_tokens = checked_count("total_computed_tokens", total_computed_tokens)
        request = self._requests.get(request_id)
        if request is None:
            return
        if self.coordinator.decoder_groups and total_computed_tokens > request.num_tokens:
            self._check_slots(request_id, total_computed_tokens, "total_computed_tokens")
        if not self.coordinator.windowed:
            return
        self._enter()
        try:
            with self._transaction:
                self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens)
                steady = self._steady_after(request)
            self._set_steady(request_id, steady)
        finally:
            self._busy.release()

    def _check_slots(self, request_id: str, num_tokens: int, name: str) -> None:
        slots = max(
            (
                len(m.get_block_ids(request_id)) * m.block_size
                for m in self.coordinator.decoder_groups
            ),
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


def _called_from_two_threads() -> ConcurrentUseError:
    """The error for a call that finds the manager held by another thread."""
    msg = (
        "KVCacheManager was called from two threads at once; a manager is "
        "single-threaded: call it from one scheduler thread (or serialise the "
        "calls with a lock of your own)"
    )
    return ConcurrentUseError(msg)


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
