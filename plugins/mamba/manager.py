"""The Mamba / linear-attention state manager."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from math import gcd
from typing import Any, ClassVar

from kvcore import Request
from kvcore.errors import InvalidConfigError
from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore_plugins.mamba.crossed import CrossedBoundaries
from kvcore_plugins.mamba.spec import MambaSpec

__all__ = ["MambaManager"]

logger = logging.getLogger("kvcore.mamba")


#: Boundaries a selective group remembers per block of its pool (at least
#: :data:`_MIN_CROSSED`): enough to outlive the states the pool can hold.
_CROSSED_PER_BLOCK = 4
_MIN_CROSSED = 4096
_MISSING: Any = object()


def _forget(cached_this_step: set[int], blocks: list[int]) -> None:
    cached_this_step.difference_update(blocks)


def _restore(mapping: dict[str, Any], key: str, value: Any) -> None:
    if value is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def _truncate(table: list[int], length: int) -> None:
    del table[length:]


def _put_back(table: list[int], positions: list[int], blocks: list[int]) -> None:
    for position, block in zip(positions, blocks, strict=True):
        table[position] = block


class MambaManager(SingleTypeManager[MambaSpec]):
    """Keeps only the latest state of a request; a hit is one cached state.

    Block ``i`` of a request's table holds the state after ``(i + 1) ×
    block_size`` tokens. Computing the next token needs only the state after
    the last computed one, so every block before it is freed (skipped tokens
    = ``n - 1``). Each allocation also reserves ``num_speculative_blocks``
    extra blocks for the states of speculative tokens.

    Prefix caching works only in ``mamba_cache_mode="align"``; in ``"none"``
    the group is not cacheable and a config asking for prefix caching is
    refused.

    **The same-step rule.** A state block is cached when the step that
    computes it is scheduled, but the state is written only while that step
    runs, and a recurrent layer reads a request's initial state when the step
    starts. So a request admitted in the same step must not adopt it: once
    the engine announces steps (:meth:`kvcore.KVCacheManager.new_step_starts`),
    an allocation whose hit ends on a state cached in the current step is
    refused as if the pool were full (``allocate_slots`` returns ``None``)
    and succeeds from the next step on, as in vLLM 0.15 and later. An engine
    that never announces steps gets vLLM 0.14's behaviour, where such a hit
    reads a state that is not written yet; the manager logs a warning the
    first time it adopts a hit then.

    **Selective prefill states** (``spec.prefill_states="selective"``, with
    prefix caching on). Inside the prompt an allocation keeps a state only
    at the prompt's last block boundary and at the deepest boundary it
    crosses that an earlier prompt crossed too (where two prompts diverge,
    a third is likely to); ``CrossedBoundaries`` remembers the boundaries
    crossed, four hashes per block of the pool (at least 4,096), the oldest
    forgotten first. Every other boundary it crosses gets the null block:
    nothing is allocated, written or cached there. The block holding the
    running state, the speculative slots and the boundaries past the prompt
    are allocated as under ``"every"``. Such a group watches requests
    (``before_allocation``) to read their prompt length and hashes.
    """

    #: The state is not produced by the draft model: EAGLE never drops a block.
    eagle_drops_last_block: ClassVar[bool] = False
    #: Every state but the latest is freed as the request advances.
    frees_skipped_blocks: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Tokens of room kept past a request's tokens for speculative states.
        self.speculative_room = self.block_size * self.spec.num_speculative_blocks
        #: State blocks cached since the current step began (steps announced).
        self.cached_blocks_this_step: set[int] = set()
        self._steps_announced = False
        self._warned_unannounced = False
        #: Whether prefills keep states at chosen boundaries only (see the class).
        self.selective = self.caches_blocks and self.spec.prefill_states == "selective"
        self.watches_requests = self.selective
        # The requests this group allocates for, by id (selective only).
        self._requests: dict[str, Request] = {}
        num_crossed = max(_CROSSED_PER_BLOCK * self.block_pool.num_blocks, _MIN_CROSSED)
        self._crossed = CrossedBoundaries(num_crossed)
        hash_block_size = self.block_pool.hash_block_size
        # Entries of Request.block_hashes per block of this group.
        self._hash_stride = self.block_size // hash_block_size if hash_block_size else 1

    @classmethod
    def is_prefix_cacheable(cls, spec: MambaSpec) -> bool:
        """Only in ``"align"`` mode are states at block boundaries cached."""
        return spec.mamba_cache_mode == "align"

    @classmethod
    def validate_config(
        cls,
        spec: MambaSpec,
        *,
        enable_caching: bool,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> None:
        """Refuse prefix caching for a ``"none"``-mode group.

        Raises:
            InvalidConfigError: prefix caching is on and
                ``spec.mamba_cache_mode`` is ``"none"``.
        """
        if enable_caching and spec.mamba_cache_mode == "none":
            msg = (
                "MambaSpec.mamba_cache_mode is 'none' (one state per request, never "
                "cached) but prefix caching is on; set mamba_cache_mode='align' (with "
                "block_size equal to the attention block size) or pass enable_caching=False"
            )
            raise InvalidConfigError(msg)

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[MambaSpec]) -> tuple[list[int], ...]:
        """The latest cached state at an aligned position, searched right to left.

        A hit of ``(i + 1) × block_size`` tokens needs only block ``i`` (the
        state after those tokens), and ``(i + 1) × block_size`` must be a
        multiple of ``alignment_tokens``. Only aligned positions are probed.
        EAGLE drops nothing (the draft model has no state layers).

        Returns:
            Per group id, ``i`` null blocks followed by the cached state
            block, or an empty list when no aligned state is cached.
        """
        block_size = query.spec.block_size
        max_blocks = query.max_length // block_size
        alignment_tokens = query.alignment_tokens
        kv_cache_group_ids = query.kv_cache_group_ids
        block_hashes = query.block_hashes
        # Position i qualifies when (i + 1) × block_size ≡ 0 (mod alignment).
        stride = alignment_tokens // gcd(alignment_tokens, block_size)
        get = query.cache.get_cached_block
        for i in range((max_blocks // stride) * stride - 1, -1, -stride):
            blocks = get(block_hashes[i], kv_cache_group_ids)
            if blocks is not None:
                return tuple([NULL_BLOCK] * i + [block] for block in blocks)
        return tuple([] for _ in kv_cache_group_ids)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every token but the last computed one: ``n - 1``."""
        return num_computed_tokens - 1

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
    ) -> int:
        """As the base class, with ``num_speculative_blocks`` more blocks of room.

        A hit whose state block was cached in the current step (see the
        class's same-step rule) asks for one block more than the pool has,
        so the allocation is refused and nothing changes.
        """
        if new_computed_blocks:
            state = new_computed_blocks[-1]
            if self._steps_announced:
                if state in self.cached_blocks_this_step:
                    return self.block_pool.num_blocks + 1
            elif state and not self._warned_unannounced:
                self._warned_unannounced = True
                logger.warning(
                    "kvcore: group %d adopts a cached Mamba state, but the engine never "
                    "called KVCacheManager.new_step_starts(), so a state cached in the same "
                    "step would be read before it is written. Call new_step_starts() at the "
                    "start of every scheduling step.",
                    self.kv_cache_group_id,
                )
        num_new = super().get_num_blocks_to_allocate(
            request_id,
            num_tokens + self.speculative_room,
            new_computed_blocks,
            total_computed_tokens,
        )
        if self.selective:
            table = self.req_to_blocks.get(request_id)
            if request_id in self.num_cached_block:
                first = len(table) if table else 0
            else:
                # Where the table ends once the hit (and any externally computed
                # tokens, which get plain blocks) is adopted.
                held = len(table) if table else 0
                block_size = self.block_size
                skipped = self.get_num_skipped_tokens(total_computed_tokens) // block_size
                external = -(-total_computed_tokens // block_size)
                first = max(skipped, len(new_computed_blocks) + held, external)
            num_new -= len(self._dropped(request_id, first, num_tokens))
        return num_new

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """As the base class, with ``num_speculative_blocks`` more blocks of room.

        A selective group puts null blocks at the prompt boundaries it does
        not keep; they are part of the returned list, in table order.
        """
        if not self.selective:
            return super().allocate_new_blocks(request_id, num_tokens + self.speculative_room)
        table = self.req_to_blocks.get(request_id)
        first = len(table) if table else 0
        dropped = self._dropped(request_id, first, num_tokens)
        self._note_crossed(request_id, first, num_tokens)
        if not dropped:
            return super().allocate_new_blocks(request_id, num_tokens + self.speculative_room)
        pool = self.block_pool
        if table is None:
            table = self.req_to_blocks[request_id] = []
            pool.record(_restore, self.req_to_blocks, request_id, _MISSING)
        num_required = -(-(num_tokens + self.speculative_room) // self.block_size)
        taken = iter(pool.get_new_blocks(num_required - first - len(dropped)))
        skip = set(dropped)
        grown = [NULL_BLOCK if p in skip else next(taken) for p in range(first, num_required)]
        pool.record(_truncate, table, first)
        table.extend(grown)
        return grown

    def before_allocation(self, request: Request) -> None:
        """Remember the request (selective groups only): its prompt length and hashes."""
        request_id = request.request_id
        previous = self._requests.get(request_id, _MISSING)
        if previous is not request:
            self._requests[request_id] = request
            self.block_pool.record(_restore, self._requests, request_id, previous)

    def free(self, request_id: str) -> None:
        """As the base class; a selective group also forgets the request."""
        super().free(request_id)
        request = self._requests.pop(request_id, None)
        if request is not None:
            self.block_pool.record(_restore, self._requests, request_id, request)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """As the base class; a selective table may hold nulls between kept states.

        So every block before the skipped tokens' end is freed, not only the
        run that ends there.
        """
        if not self.selective:
            super().remove_skipped_blocks(request_id, total_computed_tokens)
            return
        table = self.req_to_blocks.get(request_id)
        if not table:
            return
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        held = [p for p in range(min(num_skipped_blocks, len(table))) if table[p]]
        if not held:
            return
        removed = [table[p] for p in held]
        self.block_pool.free_blocks(removed[::-1])
        for p in held:
            table[p] = NULL_BLOCK
        self.block_pool.record(_put_back, table, held, removed)

    def _dropped(self, request_id: str, first: int, num_tokens: int) -> list[int]:
        """Positions from ``first`` whose states a selective prefill does not keep.

        Only full prompt boundaries before the block of the running state
        (the one holding token ``num_tokens - 1``) are candidates; the
        prompt's last boundary and the deepest one already crossed by an
        earlier prompt are kept. Empty for a request never seen.
        """
        request = self._requests.get(request_id)
        if request is None:
            return []
        block_size = self.block_size
        num_prompt_blocks = request.num_prompt_tokens // block_size
        stop = (num_tokens - 1) // block_size
        if stop > num_prompt_blocks:
            stop = num_prompt_blocks
        if first >= stop:
            return []
        hashes = request.block_hashes
        stride = self._hash_stride
        crossed = self._crossed
        deepest = -1
        for position in range(stop - 1, first - 1, -1):
            index = (position + 1) * stride - 1
            if index < len(hashes) and hashes[index] in crossed:
                deepest = position
                break
        last = num_prompt_blocks - 1
        return [p for p in range(first, stop) if p != last and p != deepest]

    def _note_crossed(self, request_id: str, first: int, num_tokens: int) -> None:
        """Remember the full prompt boundaries from ``first`` that this step reaches."""
        request = self._requests.get(request_id)
        if request is None:
            return
        block_size = self.block_size
        stop = min(num_tokens, request.num_prompt_tokens) // block_size
        hashes = request.block_hashes
        stride = self._hash_stride
        reached = [
            hashes[(p + 1) * stride - 1]
            for p in range(first, stop)
            if (p + 1) * stride <= len(hashes)
        ]
        if reached:
            self._crossed.add(reached, self.block_pool.record)

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        """As the base class, less the room kept for speculative states.

        Caching and freeing follow the base class's rules (a decode step
        adopts no hit, so the same-step rule does not apply to it).
        """
        limit = super().steady_until(request_id, num_computed_tokens)
        table = self.req_to_blocks.get(request_id)
        if table:
            limit = min(limit, len(table) * self.block_size - self.speculative_room)
        return limit

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """As the base class; once steps are announced, remember what this step cached."""
        if not self._steps_announced:
            super().cache_blocks(request, num_tokens)
            return
        request_id = request.request_id
        before = self.num_cached_block.get(request_id, 0)
        super().cache_blocks(request, num_tokens)
        after = self.num_cached_block.get(request_id, 0)
        if after > before:
            step = self.cached_blocks_this_step
            added = [b for b in self.req_to_blocks[request_id][before:after] if b and b not in step]
            if added:
                step.update(added)
                self.block_pool.record(_forget, step, added)

    def new_step_starts(self) -> None:
        """Forget the states cached in the previous step: they are written now."""
        self._steps_announced = True
        self.cached_blocks_this_step.clear()
