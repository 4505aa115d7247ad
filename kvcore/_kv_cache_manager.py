"""The engine-facing KV cache manager.

An engine asks three things per request and step: how much of this prompt is
already cached (:meth:`KVCacheManager.get_computed_blocks`), give me slots for
N more tokens or say no without changing anything
(:meth:`KVCacheManager.allocate_slots`), and this request is done
(:meth:`KVCacheManager.free`). The answers are block tables, one per KV cache
group. Method names and meanings follow the reference engine's scheduler
interface, so an engine written against it can switch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from kvcore._config import KVCacheConfig
from kvcore._coordinator import make_coordinator
from kvcore._events import KVCacheEvent
from kvcore._hashing import BlockHasher
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore._request import Request
from kvcore.errors import DoubleFreeError, InvalidRequestError, RequestTooLongError

__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats"]


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

    Attributes:
        requests: Lookups made.
        queries: Prompt tokens looked up.
        hits: Tokens found in the cache.
        preempted_requests: Lookups of requests resumed after a preemption.
        preempted_queries: Prompt tokens those lookups covered.
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
        """``hits / queries`` (0.0 with no queries)."""
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
        hash_algorithm: ``"sha256"`` (reproducible, collision resistant) or
            ``"fast"`` (for simulation).
        enable_kv_cache_events: Queue events for :meth:`take_events`.

    Raises:
        UnknownSpecError: a group's spec is served by no loaded plugin.
        InvalidConfigError: the config cannot be served as asked.
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
    ) -> None:
        if type(max_model_len) is not int or max_model_len <= 0:
            msg = f"max_model_len must be a positive integer, got {max_model_len!r}"
            raise InvalidRequestError(msg)
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
        )
        self.block_pool = self.coordinator.block_pool
        self._has_windowed_groups = self.coordinator.has_windowed_groups
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.hash_block_size = self.coordinator.hash_block_size
        self._hasher = BlockHasher(self.hash_block_size, hash_algorithm)
        self.empty_kv_cache_blocks = KVCacheBlocks(
            tuple(() for _ in range(self.num_kv_cache_groups))
        )
        self.prefix_cache_stats = PrefixCacheStats()

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
        """
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
        stats.requests += 1
        stats.queries += request.num_tokens
        stats.hits += num_hit_tokens
        if request.num_preemptions:
            stats.preempted_requests += 1
            stats.preempted_queries += request.num_tokens
            stats.preempted_hits += num_hit_tokens
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

        Returns:
            The newly allocated blocks per group, or ``None`` if the pool
            cannot serve the request now.

        Raises:
            InvalidRequestError: nothing to allocate (no new and no external
                tokens).
            RequestTooLongError: computed plus new tokens exceed
                ``max_model_len``.
        """
        if num_new_tokens == 0 and num_external_computed_tokens == 0:
            msg = (
                f"request {request.request_id!r}: num_new_tokens must be > 0 when there "
                "are no external computed tokens"
            )
            raise InvalidRequestError(msg)
        num_local_computed = request.num_computed_tokens + num_new_computed_tokens
        num_computed = num_local_computed + num_external_computed_tokens
        max_model_len = self.max_model_len
        if num_computed + num_new_tokens > max_model_len:
            msg = (
                f"request {request.request_id!r} would hold {num_computed + num_new_tokens} "
                f"tokens ({num_computed} computed + {num_new_tokens} new), more than "
                f"max_model_len={max_model_len}; cap num_new_tokens at "
                f"{max_model_len - num_computed}"
            )
            raise RequestTooLongError(msg)
        if new_computed_blocks is not None:
            hits = new_computed_blocks.blocks
            has_hits = any(hits)
        else:
            hits = self.empty_kv_cache_blocks.blocks
            has_hits = False
        # Lookahead slots past the end of the model are never used.
        num_need_slot = num_computed + num_new_tokens + num_lookahead_tokens
        if num_need_slot > max_model_len:
            num_need_slot = max_model_len
        coordinator = self.coordinator
        request_id = request.request_id
        if self._has_windowed_groups:
            coordinator.remove_skipped_blocks(request_id, num_computed)
        num_blocks = coordinator.get_num_blocks_to_allocate(
            request_id, num_need_slot, hits, num_encoder_tokens, num_computed
        )
        if num_blocks > self.block_pool._free.num_free:
            return None
        if has_hits or num_external_computed_tokens > 0:
            coordinator.allocate_new_computed_blocks(
                request_id, hits, num_local_computed, num_external_computed_tokens
            )
        new_blocks = coordinator.allocate_new_blocks(request_id, num_need_slot, num_encoder_tokens)
        request._kv_state = "allocated"
        if self.enable_caching and not delay_cache_blocks:
            self._hasher.update(request)
            # Unverified draft tokens past the request's tokens are not cached.
            num_to_cache = num_computed + num_new_tokens
            num_tokens = len(request._all_token_ids)
            coordinator.cache_blocks(
                request, num_to_cache if num_to_cache < num_tokens else num_tokens
            )
        if not any(new_blocks):
            return self.empty_kv_cache_blocks
        return KVCacheBlocks(new_blocks)

    def free(self, request: Request) -> None:
        """Release every block of a finished or preempted request.

        Blocks are freed last first, so a request's tail is evicted before
        its head (which other requests are more likely to share). A request
        that was never allocated (aborted while waiting) is ignored.

        Raises:
            DoubleFreeError: the request was already freed and not allocated
                since; nothing changes.
        """
        if request._kv_state == "freed":
            msg = (
                f"request {request.request_id!r} was already freed; free a request once "
                "per allocation (after preemption, allocate it again before freeing)"
            )
            raise DoubleFreeError(msg)
        if request._kv_state == "allocated":
            self.coordinator.free(request.request_id)
            request._kv_state = "freed"

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's blocks that are full after ``num_computed_tokens`` tokens."""
        if self.enable_caching:
            self._hasher.update(request)
            self.coordinator.cache_blocks(request, num_computed_tokens)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the request's blocks that fell out of every windowed type's window."""
        self.coordinator.remove_skipped_blocks(request_id, total_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, if no request holds blocks (else change nothing).

        Returns:
            Whether the cache was cleared.
        """
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats.reset = True
        return True

    def evict_blocks(self, block_ids: Sequence[int]) -> None:
        """Drop the given blocks from the prefix cache (their contents are invalid)."""
        self.block_pool.evict_blocks(block_ids)

    def take_events(self) -> list[KVCacheEvent]:
        """Return and clear the queued KV cache events (empty if events are off)."""
        return self.block_pool.take_events()

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        """Return the lookup statistics gathered since the last call, and restart them."""
        stats = self.prefix_cache_stats
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
            InvalidRequestError: a table is longer than ``width``.
        """
        import numpy as np

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
