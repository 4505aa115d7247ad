"""The scheduler class vLLM loads by name: vLLM's own ``Scheduler`` on kvcore's manager."""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from kvcore.errors import InvalidConfigError
from kvcore.integrations.vllm._manager import KVCoreKVCacheManager

__all__ = ["KVCoreScheduler"]


class KVCoreScheduler(Scheduler):  # type: ignore[misc]  # vLLM ships no type stubs
    """vLLM's scheduler, unchanged, with kvcore's KV cache manager in place of vLLM's.

    Select it with ``scheduler_cls="kvcore.integrations.vllm.KVCoreScheduler"``
    (``--scheduler-cls`` on the command line). It takes the arguments of
    vLLM's ``Scheduler`` and builds a
    :class:`~kvcore.integrations.vllm.KVCoreKVCacheManager` from the same
    settings vLLM gives its own manager (the KV cache config, model length,
    prefix caching, EAGLE, statistics, KV events, hash algorithm). vLLM's
    manager is built by the base class first and dropped: a one-time cost at
    start-up, of vLLM's block objects for the pool.

    Raises:
        InvalidConfigError: async scheduling is on (vLLM's ``AsyncScheduler``
            counts output placeholders as computed tokens before they exist,
            which kvcore refuses), or a setting the manager does not serve
            (see :class:`~kvcore.integrations.vllm.KVCoreKVCacheManager`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scheduler_config.async_scheduling:
            msg = (
                "kvcore.integrations.vllm.KVCoreScheduler does not serve async scheduling "
                "(output placeholders counted as computed tokens); turn async_scheduling "
                "off (--no-async-scheduling)"
            )
            raise InvalidConfigError(msg)
        self.kv_cache_manager = KVCoreKVCacheManager(
            self.kv_cache_config,
            max_model_len=self.max_model_len,
            hash_block_size=self.block_size,
            enable_caching=bool(self.cache_config.enable_prefix_caching),
            use_eagle=self.use_eagle,
            log_stats=self.log_stats,
            enable_kv_cache_events=self.enable_kv_cache_events,
            dcp_world_size=self.dcp_world_size,
            pcp_world_size=self.pcp_world_size,
            metrics_collector=self.kv_metrics_collector,
            hash_algorithm=self.cache_config.prefix_caching_hash_algo,
        )
