"""vLLM 0.14's ``KVCacheManager`` interface, served by kvcore's manager.

:class:`KVCoreKVCacheManager` takes what vLLM's scheduler passes (vLLM
requests, vLLM's KV cache config) and answers what it expects (blocks with
``get_block_ids``, vLLM's ``PrefixCacheStats`` and KV event classes), with
kvcore's :class:`~kvcore.KVCacheManager` doing every allocation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vllm.distributed.kv_events import AllBlocksCleared as VLLMAllBlocksCleared
from vllm.distributed.kv_events import BlockRemoved as VLLMBlockRemoved
from vllm.distributed.kv_events import BlockStored as VLLMBlockStored
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.metrics.stats import PrefixCacheStats as VLLMPrefixCacheStats

from kvcore._block_pool import BlockPool
from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore._kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from kvcore._registry import Registry
from kvcore.errors import InvalidConfigError
from kvcore.integrations.vllm._convert import kv_cache_config_from_vllm
from kvcore.integrations.vllm._mirror import RequestMirror

__all__ = ["KVCoreKVCacheManager", "VLLMKVCacheBlocks", "vllm_event", "vllm_prefix_cache_stats"]

#: vLLM's ``prefix_caching_hash_algo`` → kvcore's ``hash_algorithm``. Hash
#: values differ from vLLM's either way (kvcore encodes canonically, not with
#: pickle or CBOR); only their strength and speed correspond.
HASH_ALGORITHMS = {
    "sha256": "sha256",
    "sha256_cbor": "sha256",
    "xxhash": "xxh3_128",
    "xxhash_cbor": "xxh3_128",
}


class VLLMKVCacheBlocks(KVCacheBlocks):
    """kvcore's blocks per group, with what vLLM's KV connectors also ask of them."""

    __slots__ = ("_pool",)

    def __init__(self, blocks: tuple[Sequence[int], ...], pool: BlockPool) -> None:
        super().__init__(blocks)
        self._pool = pool

    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of the blocks not in the prefix cache, of the one group (vLLM's contract).

        Raises:
            InvalidConfigError: there is more than one group.
        """
        if len(self.blocks) != 1:
            msg = f"get_unhashed_block_ids serves one KV cache group; there are {len(self.blocks)}"
            raise InvalidConfigError(msg)
        block_hash = self._pool.block_hash
        return [block for block in self.blocks[0] if block_hash(block) is None]

    def __add__(self, other: KVCacheBlocks) -> VLLMKVCacheBlocks:
        joined = tuple([*a, *b] for a, b in zip(self.blocks, other.blocks, strict=True))
        return VLLMKVCacheBlocks(joined, self._pool)

    def new_empty(self) -> VLLMKVCacheBlocks:
        """An instance with the same number of groups and no blocks."""
        return VLLMKVCacheBlocks(tuple(() for _ in self.blocks), self._pool)


def vllm_prefix_cache_stats(stats: PrefixCacheStats) -> Any:
    """VLLM's ``PrefixCacheStats`` with the counts of kvcore's (the same meanings)."""
    return VLLMPrefixCacheStats(
        reset=stats.reset,
        requests=stats.requests,
        queries=stats.queries,
        hits=stats.hits,
        preempted_requests=stats.preempted_requests,
        preempted_queries=stats.preempted_queries,
        preempted_hits=stats.preempted_hits,
    )


def _external_hash(block_hash: Any) -> Any:
    # vLLM publishes a digest as an int of its low 64 bits, or as the bytes
    # (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); its own helper decides.
    return maybe_convert_block_hash(block_hash) if isinstance(block_hash, bytes) else block_hash


def _external_hashes(hashes: Iterable[Any]) -> list[Any]:
    return [_external_hash(block_hash) for block_hash in hashes]


def vllm_event(event: KVCacheEvent) -> Any:
    """The vLLM 0.14 event class instance for one kvcore KV cache event.

    vLLM 0.14's events carry no group: ``group_idx`` and ``kind`` are dropped
    (kvcore's own wire format, :mod:`kvcore.cluster`, keeps them).

    Raises:
        TypeError: ``event`` is not a kvcore KV cache event.
    """
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return VLLMBlockStored(
            block_hashes=_external_hashes(event.block_hashes),
            parent_block_hash=None if parent is None else _external_hash(parent),
            token_ids=list(event.token_ids),
            block_size=event.block_size,
            lora_id=event.lora_id,
            medium=event.medium,
            lora_name=event.lora_name,
        )
    if isinstance(event, BlockRemoved):
        return VLLMBlockRemoved(
            block_hashes=_external_hashes(event.block_hashes), medium=event.medium
        )
    if isinstance(event, AllBlocksCleared):
        return VLLMAllBlocksCleared()
    msg = f"not a kvcore KV cache event: {event!r}"
    raise TypeError(msg)


class KVCoreKVCacheManager:
    """vLLM 0.14's ``KVCacheManager``, every call served by a kvcore manager.

    The constructor takes vLLM's arguments. The methods are those vLLM 0.14's
    scheduler calls, with its arguments and meanings; requests are vLLM's
    ``Request`` objects, mirrored as kvcore requests (see
    :mod:`kvcore.integrations.vllm` for what is read and when).

    Args:
        kv_cache_config: vLLM's ``KVCacheConfig``
            (:func:`~kvcore.integrations.vllm.kv_cache_config_from_vllm`
            converts it).
        max_model_len: Longest request, in tokens.
        hash_block_size: vLLM's hashing granularity; kvcore derives its own
            from the groups (the same for every config vLLM 0.14 builds).
        enable_caching: Prefix caching on.
        use_eagle: EAGLE speculative decoding.
        log_stats: Gather lookup statistics.
        enable_kv_cache_events: Queue KV events for :meth:`take_events`.
        dcp_world_size, pcp_world_size: Context parallelism; only 1 is served.
        metrics_collector: vLLM's KV cache residency metrics; not served
            (must be ``None``).
        hash_algorithm: vLLM's ``prefix_caching_hash_algo``.
        registry: kvcore's plugin registry (default: every installed plugin,
            or the selection in ``KVCORE_PLUGINS``).

    Raises:
        InvalidConfigError: context parallelism, the metrics collector, or an
            unknown hash algorithm; and everything
            :func:`~kvcore.integrations.vllm.kv_cache_config_from_vllm` and
            :class:`kvcore.KVCacheManager` raise.
    """

    def __init__(
        self,
        kv_cache_config: Any,
        max_model_len: int,
        hash_block_size: int,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        *,
        hash_algorithm: str = "sha256",
        registry: Registry | None = None,
    ) -> None:
        _refuse_unserved(dcp_world_size, pcp_world_size, metrics_collector, hash_algorithm)
        config = kv_cache_config_from_vllm(
            kv_cache_config, enable_caching=enable_caching, registry=registry
        )
        self.manager = KVCacheManager(
            config,
            max_model_len,
            registry=registry,
            enable_caching=enable_caching,
            use_eagle=use_eagle,
            hash_algorithm=HASH_ALGORITHMS[hash_algorithm],
            enable_kv_cache_events=enable_kv_cache_events,
            log_stats=log_stats,
        )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.use_eagle = use_eagle
        self.log_stats = log_stats
        self.num_kv_cache_groups = self.manager.num_kv_cache_groups
        #: kvcore's block pool (``get_num_free_blocks``, ``get_usage``), not vLLM's.
        self.block_pool = self.manager.block_pool
        # The pool of group 0's blocks: the one a single-group connector asks about.
        self._first_pool = self.block_pool.pool_of(0)
        self.requests = RequestMirror(self._holds_blocks)
        self.empty_kv_cache_blocks = VLLMKVCacheBlocks(
            self.manager.empty_kv_cache_blocks.blocks, self._first_pool
        )

    # -- what vLLM's scheduler calls ------------------------------------------------------

    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use (0.0-1.0)."""
        return self.manager.usage

    @property
    def prefix_cache_stats(self) -> Any:
        """The statistics gathered so far, as vLLM's ``PrefixCacheStats`` (``None`` if off)."""
        stats = self.manager.prefix_cache_stats
        return None if stats is None else vllm_prefix_cache_stats(stats)

    def make_prefix_cache_stats(self) -> Any:
        """VLLM's ``PrefixCacheStats`` since the last call (``None`` with ``log_stats`` off)."""
        stats = self.manager.make_prefix_cache_stats()
        return None if stats is None else vllm_prefix_cache_stats(stats)

    def get_computed_blocks(self, request: Any) -> tuple[VLLMKVCacheBlocks, int]:
        """The cached prefix of a waiting vLLM request: blocks per group, hit tokens."""
        blocks, num_hit = self.manager.get_computed_blocks(self.requests.sync(request))
        return self._wrap(blocks), num_hit

    def allocate_slots(
        self,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
    ) -> VLLMKVCacheBlocks | None:
        """Slots for a vLLM request's next tokens, or ``None`` (nothing changed)."""
        new_blocks = self.manager.allocate_slots(
            self.requests.sync(request),
            num_new_tokens,
            num_new_computed_tokens,
            new_computed_blocks,
            num_lookahead_tokens,
            num_external_computed_tokens,
            delay_cache_blocks,
            num_encoder_tokens,
        )
        return None if new_blocks is None else self._wrap(new_blocks)

    def free(self, request: Any) -> None:
        """Free a request's blocks; a finished request's kvcore copy goes too."""
        copy = self.requests.get(request.request_id)
        if copy is not None:
            self.manager.free(copy)
        if request.is_finished():
            self.requests.drop(request.request_id)

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the blocks outside every window (vLLM passes the token count at a finish)."""
        if self.requests.sync_id(request_id) is not None:
            self.manager.remove_skipped_blocks(request_id, total_computed_tokens)

    def evict_blocks(self, block_ids: Iterable[int]) -> None:
        """Drop the given blocks from the prefix cache (their KV failed to load)."""
        self.manager.evict_blocks(sorted(block_ids))

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block if no request holds blocks; whether it did."""
        return self.manager.reset_prefix_cache()

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Per group, the leading blocks every request holding blocks shares."""
        return self.manager.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[Any]:
        """The queued KV events as vLLM 0.14's event classes, oldest first."""
        return [vllm_event(event) for event in self.manager.take_events()]

    def get_blocks(self, request_id: str) -> VLLMKVCacheBlocks:
        """The request's blocks in every group."""
        return self._wrap(self.manager.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids in every group (copies)."""
        return self.manager.get_block_ids(request_id)

    def cache_blocks(self, request: Any, num_computed_tokens: int) -> None:
        """Cache the request's blocks full after ``num_computed_tokens`` tokens."""
        self.manager.cache_blocks(self.requests.sync(request), num_computed_tokens)

    def create_kv_cache_blocks(self, blocks: tuple[Sequence[int], ...]) -> VLLMKVCacheBlocks:
        """Blocks per group as handed to the scheduler (the shared empty one if none)."""
        if not any(blocks):
            return self.empty_kv_cache_blocks
        return VLLMKVCacheBlocks(blocks, self._first_pool)

    # -- helpers ------------------------------------------------------------------------

    def _wrap(self, blocks: KVCacheBlocks) -> VLLMKVCacheBlocks:
        if not any(blocks.blocks):
            return self.empty_kv_cache_blocks
        return VLLMKVCacheBlocks(blocks.blocks, self._first_pool)

    def _holds_blocks(self, request_id: str) -> bool:
        return any(self.manager.get_block_ids(request_id))


def _refuse_unserved(
    dcp_world_size: int, pcp_world_size: int, metrics_collector: Any, hash_algorithm: str
) -> None:
    if dcp_world_size != 1 or pcp_world_size != 1:
        msg = (
            f"decode/prefill context parallelism (dcp_world_size={dcp_world_size}, "
            f"pcp_world_size={pcp_world_size}) is not served by kvcore; run with both 1"
        )
        raise InvalidConfigError(msg)
    if metrics_collector is not None:
        msg = (
            "vLLM's KV cache residency metrics (kv_cache_metrics) are not served by kvcore; "
            "turn observability_config.kv_cache_metrics off"
        )
        raise InvalidConfigError(msg)
    if hash_algorithm not in HASH_ALGORITHMS:
        msg = (
            f"prefix_caching_hash_algo {hash_algorithm!r} is unknown; kvcore maps "
            f"{', '.join(HASH_ALGORITHMS)}"
        )
        raise InvalidConfigError(msg)
