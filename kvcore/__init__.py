"""kvcore: the paged KV cache of hybrid LLMs, one plugin per attention type.

The names here are what most users need: the engine-facing manager and its
requests, the cache it manages, one call to plan it, and the plugins serving
it. Everything else lives in the module it belongs to: :mod:`kvcore.planning`
(every step of planning), :mod:`kvcore.registry` (plugin selection),
:mod:`kvcore.errors`, :mod:`kvcore.events`, :mod:`kvcore.hashing`,
:mod:`kvcore.specs` and :mod:`kvcore.managers` (for plugin authors),
:mod:`kvcore.eviction`, :mod:`kvcore.hookspecs`, and :mod:`kvcore.testing`,
:mod:`kvcore.cluster`, :mod:`kvcore.paging`, :mod:`kvcore.reference`,
:mod:`kvcore.executor` and :mod:`kvcore.integrations`, imported on demand.

Importing kvcore loads no plugin and does not import torch or numpy; plugins
are loaded when a registry is built (:func:`load_registry`).
"""

from __future__ import annotations

from kvcore import errors as errors
from kvcore import events as events
from kvcore import eviction as eviction
from kvcore import hashing as hashing
from kvcore import hookspecs as hookspecs
from kvcore import managers as managers
from kvcore import planning as planning
from kvcore import registry as registry
from kvcore import specs as specs
from kvcore._backend import backend
from kvcore._config import (
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheLayout,
    KVCacheTensor,
    PagePool,
)
from kvcore._eviction.registry import available_eviction_policies
from kvcore._kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from kvcore._planning.allocate import KVCacheBuffers, allocate_kv_cache
from kvcore._planning.plan import KVCachePlan, plan
from kvcore._plugin_loader import load_registry
from kvcore._plugin_types import LayerType
from kvcore._registry import Registry
from kvcore._request import MultiModalFeature, Request
from kvcore.hookspecs import hookimpl

#: The version of this kvcore (PEP 440).
__version__ = "0.1.0.dev0"

__all__ = [
    # the engine-facing manager and what it serves
    "KVCacheManager",
    "KVCacheBlocks",
    "PrefixCacheStats",
    "Request",
    "MultiModalFeature",
    # the cache it manages
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheTensor",
    "KVCacheLayout",
    "PagePool",
    # planning one (the rest: kvcore.planning)
    "plan",
    "KVCachePlan",
    "allocate_kv_cache",
    "KVCacheBuffers",
    # plugins (the rest: kvcore.registry)
    "load_registry",
    "Registry",
    "LayerType",
    "hookimpl",
    "available_eviction_policies",
    # which block pool implementation serves
    "backend",
    "__version__",
]
