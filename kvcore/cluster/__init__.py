"""kvcore beyond one engine: KV events on the wire, a cluster prefix index, a router.

* :class:`ClusterIndex` follows every engine's KV events (block hash → the
  engines holding it, per KV cache group) and answers *how many tokens of this
  request would engine E hit?* with each group's own hit rule, so hybrid models
  are scored right. Backends: :class:`EmbeddedBackend` (in-process, the
  default) and :class:`RedisBackend` (shared, bounded, expiring with engines).
* :class:`Router` picks an engine from the index's estimate and the engines'
  load (policies ``prefix``, ``round_robin``, ``least_loaded``, ``random``).
* :func:`encode_batch` / :func:`decode_batch` put events on the wire in vLLM's
  msgspec format (kvcore's extra fields are ignored by vLLM-format consumers);
  :class:`EventPublisher` / :class:`EventSubscriber` carry them over ZMQ
  (PUB with sequence numbers, and a replay endpoint), as vLLM does.

The index and the router need nothing beyond kvcore. The wire format, ZMQ and
Redis need the ``fleet`` extra (``pip install 'kvcore[fleet]'``: msgspec,
pyzmq, redis); they are imported when first used, and a missing package raises
:class:`MissingExtraError` naming the extra.
"""

from __future__ import annotations

from typing import Any

from kvcore.cluster._backend import ApplyResult, Backend, NotFetchedError, ReadyBatch, Snapshot
from kvcore.cluster._embedded import EmbeddedBackend
from kvcore.cluster._errors import (
    EngineConflictError,
    EventFormatError,
    IndexUnavailableError,
    InvalidEventError,
    MissingExtraError,
)
from kvcore.cluster._hit_rule import EngineView, FleetLayout
from kvcore.cluster._index import ClusterIndex, IndexStats, SubmitResult
from kvcore.cluster._router import ROUTER_POLICIES, EngineLoad, Route, Router

__all__ = [
    "ROUTER_POLICIES",
    "ApplyResult",
    "Backend",
    "ClusterIndex",
    "EmbeddedBackend",
    "EngineConflictError",
    "EngineLoad",
    "EngineView",
    "EventBatch",
    "EventFormatError",
    "EventPublisher",
    "EventSubscriber",
    "FleetLayout",
    "IndexStats",
    "IndexUnavailableError",
    "InvalidEventError",
    "MissingExtraError",
    "NotFetchedError",
    "ReadyBatch",
    "RedisBackend",
    "Route",
    "Router",
    "Snapshot",
    "SubmitResult",
    "decode_batch",
    "encode_batch",
]

_LAZY = {
    "EventBatch": "kvcore.cluster._wire",
    "encode_batch": "kvcore.cluster._wire",
    "decode_batch": "kvcore.cluster._wire",
    "EventPublisher": "kvcore.cluster._zmq",
    "EventSubscriber": "kvcore.cluster._zmq",
    "RedisBackend": "kvcore.cluster._redis",
}


def __getattr__(name: str) -> Any:
    """Import the parts that need the ``fleet`` extra when they are first used."""
    module = _LAZY.get(name)
    if module is None:
        msg = f"module 'kvcore.cluster' has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    return getattr(importlib.import_module(module), name)
