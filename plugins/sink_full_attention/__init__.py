"""Full attention with attention sinks: full attention plus ``sink_len`` learned tokens.

Keeps
    Every block of a request until it ends (as full attention), and, for the
    whole life of the pool, ``sink_len / block_size`` sink blocks reserved
    when the manager is built (ids ``1 … k`` on a fresh pool), shared by every
    request and counted once in the pool's size
    (:attr:`~kvcore.specs.KVCacheSpec.pool_reserved_blocks`).
Frees
    Nothing before the request ends; the sink blocks never.
Hits
    As full attention: any cached prefix, found left to right.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import kvcore
from kvcore_plugins.sink_full_attention.manager import SinkFullAttentionManager
from kvcore_plugins.sink_full_attention.model_config import kvcore_layer_kinds
from kvcore_plugins.sink_full_attention.spec import SinkFullAttentionSpec

if TYPE_CHECKING:
    from kvcore.reference import ReferenceKernel

__all__ = [
    "SinkFullAttentionManager",
    "SinkFullAttentionSpec",
    "kvcore_layer_types",
    "kvcore_reference_kernels",
    "kvcore_layer_kinds",
]


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register full attention with attention sinks."""
    return [kvcore.LayerType(SinkFullAttentionSpec, SinkFullAttentionManager)]


@kvcore.hookimpl
def kvcore_reference_kernels() -> dict[type[SinkFullAttentionSpec], ReferenceKernel]:
    """The reference kernel of full attention with sinks (imports torch, so only when asked)."""
    from kvcore_plugins.sink_full_attention.kernel import SinkFullAttentionKernel

    return {SinkFullAttentionSpec: SinkFullAttentionKernel()}
