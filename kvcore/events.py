"""KV cache events: what a manager reports about blocks entering and leaving its cache.

A :class:`~kvcore.KVCacheManager` built with ``enable_kv_cache_events=True``
queues one event per change of its prefix cache; ``take_events()`` hands them
out, oldest first. A fleet's cluster index is built from them (see
:mod:`kvcore.cluster`, which also puts them on the wire).
"""

from __future__ import annotations

from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent

__all__ = ["KVCacheEvent", "BlockStored", "BlockRemoved", "AllBlocksCleared"]
