"""The Mamba / linear-attention state manager."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from math import gcd
from typing import Any, ClassVar

from kvcore import Request
from kvcore.errors import InvalidConfigError
from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore_plugins.mamba.spec import MambaSpec

__all__ = ["MambaManager"]

logger = logging.getLogger("kvcore.mamba")


def _forget(cached_this_step: set[int], blocks: list[int]) -> None:
    cached_this_step.difference_update(blocks)


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
        num_tokens += self.speculative_room
        return super().get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens
        )

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """As the base class, with ``num_speculative_blocks`` more blocks of room."""
        return super().allocate_new_blocks(request_id, num_tokens + self.speculative_room)

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
