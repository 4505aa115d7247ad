"""Invariant checks and a random engine, behind :mod:`kvcore.testing` (see there).

Its own module so that the conformance kit can drive the random engine
without importing the public module that re-exports the kit.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from kvcore._block_pool import BlockPool
from kvcore._hashing import hashes_at_block_size
from kvcore._kv_cache_manager import KVCacheBlocks, KVCacheManager
from kvcore._request import Request
from kvcore._two_level_pool import TwoLevelBlockPool
from kvcore.errors import InvalidConfigError
from kvcore.managers import SingleTypeManager

__all__ = ["RandomWorkload", "WorkloadStats", "admit", "check_manager_invariants", "snapshot"]


def admit(
    manager: KVCacheManager, request: Request, **allocate_kwargs: object
) -> tuple[KVCacheBlocks | None, int]:
    """Admit a waiting request as a scheduler does, in one step.

    Looks the prompt up in the prefix cache, allocates slots for the rest of
    it, and on success marks every token computed (as after the prefill).

    Returns:
        The newly allocated blocks (``None`` if the pool refused), and the
        number of cache-hit tokens.
    """
    hit, num_hit = manager.get_computed_blocks(request)
    blocks = manager.allocate_slots(
        request,
        request.num_tokens - num_hit,
        num_hit,
        hit,
        **allocate_kwargs,  # type: ignore[arg-type]
    )
    if blocks is not None:
        request.num_computed_tokens = request.num_tokens
    return blocks, num_hit


def check_manager_invariants(manager: KVCacheManager) -> None:
    """Check the pool's and the managers' bookkeeping against each other.

    * the pool's own invariants (:meth:`~kvcore.managers.BlockPool.check_invariants`:
      the free count matches the free queue, which has no cycle, every
      cache-map entry matches its block; with a two-level pool, those of
      every page class and of the large pages: a small page only in a large
      page its class owns, a large page owned by at most one class, free
      counts per class adding up);
    * every block's reference count equals the number of block tables (over
      all requests and the groups of its pool) holding it, plus one if it
      is reserved;
    * no block is in the tables of two groups of one pool;
    * in each pool, the blocks in use are those held (counted once) and
      those reserved;
    * each manager's cached-block count never exceeds its table length;
    * every block a table marks as cached that still carries a hash carries
      the hash its position implies for its request;
    * only requests the manager knows as holding blocks have tables.

    O(pool size + table entries): for tests, not for the allocation path.

    Raises:
        AssertionError: naming the violated invariant.
    """
    manager.block_pool.check_invariants()
    live = manager._requests
    for pool, groups in _pools(manager):
        _check_pool_tables(pool, groups, live)
    for request_id, request in live.items():
        if request._kv_owner is not manager:
            msg = f"request {request_id!r} is live but does not belong to this manager"
            raise AssertionError(msg)
    _check_cached_positions(manager)


def _pools(manager: KVCacheManager) -> list[tuple[BlockPool, list[SingleTypeManager[Any]]]]:
    """Each pool of the manager (one, or one per page class) with the groups it holds."""
    found: dict[int, tuple[BlockPool, list[SingleTypeManager[Any]]]] = {}
    for group in manager.coordinator.managers:
        found.setdefault(id(group.block_pool), (group.block_pool, []))[1].append(group)
    return list(found.values())


def _check_pool_tables(
    pool: BlockPool, groups: Sequence[SingleTypeManager[Any]], live: Mapping[str, object]
) -> None:
    holders: Counter[int] = Counter()
    owner_group: dict[int, int] = {}
    for group in groups:
        group_id = group.kv_cache_group_id
        for request_id, table in group.req_to_blocks.items():
            holders.update(block for block in table if block)
            cached = group.num_cached_block.get(request_id, 0)
            if cached > len(table):
                msg = f"group {group_id}: {request_id!r} cached {cached} > table"
                raise AssertionError(msg)
            if table and request_id not in live:
                msg = f"group {group_id} has a table for {request_id!r}, which holds no blocks"
                raise AssertionError(msg)
            for block in table:
                if block and owner_group.setdefault(block, group_id) != group_id:
                    msg = (
                        f"block {block} is in the tables of groups {owner_group[block]} and "
                        f"{group_id}"
                    )
                    raise AssertionError(msg)
    reserved = set(pool._reserved)
    for block in range(1, pool.num_blocks):
        expected = holders.get(block, 0) + (block in reserved)
        if pool.ref_count(block) != expected:
            msg = (
                f"block {block}: ref count {pool.ref_count(block)} but held by "
                f"{holders.get(block, 0)} tables (reserved: {block in reserved})"
            )
            raise AssertionError(msg)
    if pool.num_in_use != len(holders) + len(reserved):
        msg = f"{pool.num_in_use} blocks in use, but held {len(holders)} + reserved {len(reserved)}"
        raise AssertionError(msg)


def _check_cached_positions(manager: KVCacheManager) -> None:
    """A table's cached, still-hashed blocks carry their position's hash for that request."""
    coordinator = manager.coordinator
    for group in coordinator.managers:
        pool = group.block_pool
        if not coordinator.enable_caching or not group.is_prefix_cacheable(group.spec):
            continue
        for request_id, table in group.req_to_blocks.items():
            request = manager._requests.get(request_id)
            if request is None:
                continue
            hashes = hashes_at_block_size(
                request.block_hashes, coordinator.hash_block_size, group.block_size
            )
            num_cached = group.num_cached_block.get(request_id, 0)
            for position, block in enumerate(table[:num_cached]):
                block_hash = pool._hash[block] if block else None
                if block_hash is None:
                    continue  # evicted while held (evict_blocks), or never hashed
                if position >= len(hashes) or block_hash != hashes[position]:
                    msg = (
                        f"group {group.kv_cache_group_id}: block {block} at position "
                        f"{position} of request {request_id!r} is cached under the hash of "
                        "another position"
                    )
                    raise AssertionError(msg)


def snapshot(manager: KVCacheManager) -> tuple[object, ...]:
    """Everything an operation may change, for comparing before and after.

    Per pool (one per page class with a two-level pool): reference counts,
    free-queue order, each block's hash and group, the cache map (with
    duplicates), reserved blocks; the large pages' owners, use counts and
    fully free pages; pending events, every block table and cached-block
    count, and the requests holding blocks.
    """
    tables = tuple(
        (
            tuple(sorted((k, tuple(v)) for k, v in group.req_to_blocks.items())),
            tuple(sorted(group.num_cached_block.items())),
        )
        for group in manager.coordinator.managers
    )
    pools = tuple(_pool_state(pool) for pool, _ in _pools(manager))
    top = manager.block_pool
    pages = getattr(top, "pages", None)
    large = (
        None
        if pages is None
        else (
            tuple(pages.owner),
            tuple(pages.free),
            tuple(pages.in_use),
            tuple(pages.owned),
            tuple(tuple(sorted(f.items())) for f in pages.fully_free),
            pages.clock,
        )
    )
    return (pools, large, top.peek_events(), tables, tuple(sorted(manager._requests)))


def _pool_state(pool: BlockPool) -> tuple[object, ...]:
    cache_map = tuple(
        (dict(cached), {h: tuple(blocks) for h, blocks in dups.items()})
        for cached, dups in zip(pool._cached, pool._dups, strict=True)
    )
    return (
        tuple(pool._ref),
        tuple(pool.free_block_ids()),
        tuple(pool._hash),
        tuple(pool._group),
        cache_map,
        tuple(pool._reserved),
    )


def _surely_fits(manager: KVCacheManager, demand: Sequence[int]) -> bool:
    """Whether an allocation of ``demand`` blocks per group must succeed, worked out apart.

    One shared pool: the blocks against the free ones. A two-level pool:
    each class's own free blocks, then whole free large pages for the rest
    (sufficient, not necessary: other classes' fully free pages may fit
    more).
    """
    pool = manager.block_pool
    if not isinstance(pool, TwoLevelBlockPool):
        return sum(demand) <= pool.num_free
    classes = pool.page_pool.group_classes
    per_class: Counter[int] = Counter()
    for group, count in enumerate(demand):
        per_class[classes[group]] += count
    pages_needed = 0
    for klass, count in per_class.items():
        short = max(0, count - pool.pools[klass].own_free())
        pages_needed += -(-short // pool.pages.per_page[klass])
    return pages_needed <= len(pool.pages.free)


@attrs.define
class WorkloadStats:
    """What a :class:`RandomWorkload` run did (to check it exercised every path)."""

    admitted: int = 0
    refused_admissions: int = 0
    decodes: int = 0
    refused_decodes: int = 0
    preemptions: int = 0
    finished: int = 0
    hit_tokens: int = 0
    external_tokens: int = 0
    resets: int = 0


class RandomWorkload:
    """Random engine-like traffic against a manager, checking invariants as it goes.

    Prompts are built from a few shared prefixes so that cache hits, revivals
    of freed cached blocks and evictions all happen. Some admissions also get
    tokens a KV connector loads (``num_external_computed_tokens``): after the
    cache hit, between 1 and all but one of the prompt's remaining tokens,
    loaded at once (their blocks are cached with the step's).

    Args:
        manager: The manager under test.
        seed: Seed of the random generator (runs are reproducible).
        max_running: Most requests holding blocks at once.
        prompt_lengths: Range of prompt lengths, in tokens.
        max_output: Most decode tokens per request.
        num_encoder_tokens: Encoder tokens per request (for cross attention).
        max_lookahead: Most lookahead slots asked for per decode step.
        external_rate: Chance (0 to 1) that an admission with at least two
            tokens past its cache hit gets external tokens.
        check_every: Run the full (O(pool size)) invariant check every this
            many operations; the per-operation checks always run.

    Raises:
        InvalidConfigError: ``external_rate`` is not between 0 and 1.
    """

    def __init__(
        self,
        manager: KVCacheManager,
        *,
        seed: int = 0,
        max_running: int = 6,
        prompt_lengths: tuple[int, int] = (1, 120),
        max_output: int = 40,
        num_encoder_tokens: int = 0,
        max_lookahead: int = 2,
        external_rate: float = 0.25,
        check_every: int = 1,
    ) -> None:
        if not 0 <= external_rate <= 1:
            msg = f"RandomWorkload external_rate must be between 0 and 1, got {external_rate!r}"
            raise InvalidConfigError(msg)
        self.manager = manager
        self.rng = random.Random(seed)
        self.max_running = max_running
        self.prompt_lengths = prompt_lengths
        self.max_output = max_output
        self.num_encoder_tokens = num_encoder_tokens
        self.max_lookahead = max_lookahead
        self.external_rate = external_rate
        self.check_every = check_every
        self.stats = WorkloadStats()
        self._prefixes = [
            [self.rng.randrange(1, 50) for _ in range(self.rng.randrange(8, 100))] for _ in range(4)
        ]
        self._running: list[Request] = []
        self._waiting: list[Request] = []
        self._targets: dict[str, int] = {}
        self._next_id = 0
        self._ops = 0
        self._alignment = manager.coordinator.alignment_tokens

    def _new_request(self) -> Request:
        rng = self.rng
        low, high = self.prompt_lengths
        length = rng.randint(low, min(high, self.manager.max_model_len - 1))
        tokens: list[int] = []
        if rng.random() < 0.8:
            tokens = list(rng.choice(self._prefixes))[:length]
        tokens += [rng.randrange(1, 50) for _ in range(length - len(tokens))]
        request_id = f"r{self._next_id}"
        self._next_id += 1
        request = Request(request_id, tokens)
        room = self.manager.max_model_len - request.num_tokens
        self._targets[request_id] = rng.randint(0, min(self.max_output, room))
        return request

    def _checked_allocate(
        self,
        request: Request,
        num_new_tokens: int,
        num_hit: int = 0,
        hit: object = None,
        num_lookahead: int = 0,
        num_external: int = 0,
    ) -> bool:
        manager = self.manager
        num_computed = request.num_computed_tokens + num_hit + num_external
        # Groups that decide from the request see it first, as allocate_slots shows it.
        for group in manager.coordinator.watching:
            group.before_allocation(request)
        manager.remove_skipped_blocks(request.request_id, num_computed)
        need = min(num_computed + num_new_tokens + num_lookahead, manager.max_model_len)
        hits = hit.blocks if hit is not None else manager.empty_kv_cache_blocks.blocks  # type: ignore[attr-defined]
        demand = manager.coordinator.blocks_to_allocate(
            request.request_id, need, hits, self.num_encoder_tokens, num_computed
        )
        before = snapshot(manager)
        in_use_before = manager.block_pool.num_in_use
        fits = _surely_fits(manager, demand)
        result = manager.allocate_slots(
            request,
            num_new_tokens,
            num_hit,
            hit,  # type: ignore[arg-type]
            num_lookahead_tokens=num_lookahead,
            num_external_computed_tokens=num_external,
            num_encoder_tokens=self.num_encoder_tokens,
        )
        if result is None:
            if fits:
                msg = f"allocation refused although its {demand} blocks per group fit"
                raise AssertionError(msg)
            if snapshot(manager) != before:
                msg = f"refused allocation of {request.request_id!r} changed state"
                raise AssertionError(msg)
            return False
        taken = manager.block_pool.num_in_use - in_use_before
        if taken != sum(demand):
            msg = (
                f"allocation of {request.request_id!r} predicted {sum(demand)} blocks, took {taken}"
            )
            raise AssertionError(msg)
        return True

    def _admit(self) -> None:
        manager = self.manager
        if self._waiting and self.rng.random() < 0.5:
            request = self._waiting[0]
        else:
            request = self._new_request()
            self._waiting.append(request)
        hit, num_hit = manager.get_computed_blocks(request)
        if num_hit % self._alignment or num_hit > request.num_tokens - 1:
            msg = f"hit of {num_hit} tokens for a {request.num_tokens}-token request"
            raise AssertionError(msg)
        remaining = request.num_tokens - num_hit
        external = 0
        if remaining > 1 and self.rng.random() < self.external_rate:
            external = self.rng.randint(1, remaining - 1)
            remaining -= external
        chunk = remaining if self.rng.random() < 0.5 else self.rng.randint(1, remaining)
        if self._checked_allocate(request, chunk, num_hit, hit, num_external=external):
            self.stats.admitted += 1
            self.stats.hit_tokens += num_hit
            self.stats.external_tokens += external
            request.num_computed_tokens = num_hit + external + chunk
            self._waiting.remove(request)
            self._running.append(request)
        else:
            self.stats.refused_admissions += 1

    def _step(self, request: Request) -> None:
        rng = self.rng
        decoding = request.num_computed_tokens >= request.num_tokens
        if not decoding:  # still prefilling
            remaining = request.num_tokens - request.num_computed_tokens
            num_new = rng.randint(1, remaining)
            lookahead = 0
        else:
            if len(request.output_token_ids) >= self._targets[request.request_id]:
                self.manager.free(request)
                self._running.remove(request)
                self.stats.finished += 1
                return
            request.append_output_token_ids(rng.randrange(1, 50))
            num_new = 1
            room = self.manager.max_model_len - request.num_tokens
            lookahead = rng.randint(0, min(self.max_lookahead, room))
        if self._checked_allocate(request, num_new, num_lookahead=lookahead):
            request.num_computed_tokens += num_new
            self.stats.decodes += 1
            return
        self.stats.refused_decodes += 1
        if decoding:
            request._all_token_ids.pop()  # the engine retries this token later
        victim = self._running.pop()
        self.manager.free(victim)
        victim.num_computed_tokens = 0
        victim.num_preemptions += 1
        self._waiting.insert(0, victim)
        self.stats.preemptions += 1

    def step(self) -> None:
        """Do one random operation and check the invariants."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.004:
            # A weight update: the engine preempts everything, then resets.
            for victim in self._running:
                self.manager.free(victim)
                victim.num_computed_tokens = 0
                victim.num_preemptions += 1
                self.stats.preemptions += 1
            self._waiting[:0] = self._running
            self._running.clear()
            self._reset()
        elif roll < 0.02:
            self._reset()
        elif roll < 0.27 or not self._running:
            if len(self._running) < self.max_running:
                self._admit()
        elif roll < 0.97:
            self._step(rng.choice(self._running))
        else:
            victim = rng.choice(self._running)
            self.manager.free(victim)
            self._running.remove(victim)
            victim.num_computed_tokens = 0
            victim.num_preemptions += 1
            self._waiting.append(victim)
            self.stats.preemptions += 1
        self._ops += 1
        if self._ops % self.check_every == 0:
            check_manager_invariants(self.manager)

    def _reset(self) -> None:
        before = snapshot(self.manager)
        nothing_in_use = not self._running
        if self.manager.reset_prefix_cache():
            self.stats.resets += 1
            if self.manager.block_pool.num_cached_blocks():
                msg = "reset_prefix_cache succeeded but blocks are still cached"
                raise AssertionError(msg)
        elif nothing_in_use:
            msg = "reset_prefix_cache refused although no request holds a block"
            raise AssertionError(msg)
        elif snapshot(self.manager) != before:
            msg = "a refused reset_prefix_cache changed state"
            raise AssertionError(msg)

    def run(self, num_ops: int) -> WorkloadStats:
        """Do ``num_ops`` operations, then finish every request; return the stats."""
        for _ in range(num_ops):
            self.step()
        for request in list(self._running):
            self.manager.free(request)
        self._running.clear()
        check_manager_invariants(self.manager)
        pool = self.manager.block_pool
        if pool.num_in_use != pool.num_reserved_blocks:
            msg = "blocks leaked: not every block is free after all requests finished"
            raise AssertionError(msg)
        return self.stats

    @property
    def running(self) -> Sequence[Request]:
        """The requests currently holding blocks."""
        return tuple(self._running)
