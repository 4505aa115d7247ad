"""The full attention with attention sinks manager."""

from __future__ import annotations

from kvcore.errors import InvalidConfigError
from kvcore.managers import BlockPool, PrefixManager
from kvcore_plugins.sink_full_attention.spec import SinkFullAttentionSpec

__all__ = ["SinkFullAttentionManager"]


class SinkFullAttentionManager(PrefixManager[SinkFullAttentionSpec]):
    """Full attention, plus the sink blocks reserved from the pool for good.

    When the manager is built it takes ``sink_len / block_size`` blocks from
    the head of the free queue (on a fresh pool: ids ``1 … k``) and keeps
    them for the pool's lifetime: every request's attention reads the sink
    keys and values there, and the attention backend, not the block tables,
    refers to them. Requests are then served exactly as full attention.

    Args:
        spec: The group's spec.
        block_pool: The shared pool; must have ``spec.pool_reserved_blocks``
            free blocks.
        kv_cache_group_id: Index of the group.
        enable_caching: Whether prefix caching is on.

    Attributes:
        sink_blocks: The reserved block ids, in order.

    Raises:
        InvalidConfigError: the pool has too few free blocks for the sinks.
    """

    def __init__(
        self,
        spec: SinkFullAttentionSpec,
        block_pool: BlockPool,
        *,
        kv_cache_group_id: int = 0,
        enable_caching: bool = True,
    ) -> None:
        super().__init__(
            spec, block_pool, kv_cache_group_id=kv_cache_group_id, enable_caching=enable_caching
        )
        num_sink_blocks = spec.pool_reserved_blocks
        if block_pool.get_num_free_blocks() < num_sink_blocks:
            msg = (
                f"SinkFullAttentionSpec.sink_len={spec.sink_len} needs {num_sink_blocks} "
                f"reserved blocks of {spec.block_size} tokens, but the pool has only "
                f"{block_pool.get_num_free_blocks()} free; raise KVCacheConfig.num_blocks "
                "(planning counts the sink blocks in spec.pool_reserved_blocks)"
            )
            raise InvalidConfigError(msg)
        self.sink_blocks: list[int] = block_pool.reserve_blocks(num_sink_blocks)
