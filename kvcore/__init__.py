"""kvcore: the paged KV cache of hybrid LLMs, one plugin per attention type.

Importing kvcore loads no plugin and does not import torch or numpy; plugins
are loaded when a registry is built (:func:`load_registry`).
"""

from __future__ import annotations

from kvcore import errors, eviction, hookspecs, managers, specs
from kvcore._block_pool import NULL_BLOCK, BlockPool, Transaction
from kvcore._config import KVCacheConfig, KVCacheGroupSpec, KVCacheLayout, KVCacheTensor
from kvcore._events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from kvcore._eviction.registry import available_eviction_policies
from kvcore._hashing import HASH_ALGORITHMS, BlockHasher
from kvcore._kv_cache_manager import KVCacheBlocks, KVCacheManager, PrefixCacheStats
from kvcore._planning.allocate import KVCacheBuffers, allocate_kv_cache
from kvcore._planning.fields import ConfigFields
from kvcore._planning.grouping import get_kv_cache_groups
from kvcore._planning.layer_config import LayerConfig, LayerKind, PlanOption
from kvcore._planning.memory import parse_memory
from kvcore._planning.model_config import (
    ModelConfig,
    ModelFields,
    ModelLayer,
    build_layer_specs,
    list_models,
    load_model_config,
)
from kvcore._planning.plan import KVCachePlan, plan, print_plan
from kvcore._planning.report import GroupReport
from kvcore._planning.sizing import (
    estimate_max_model_len,
    fit_max_model_len,
    get_kv_cache_config,
    get_kv_cache_configs,
    max_concurrency,
)
from kvcore._plugin_loader import (
    ENTRY_POINT_GROUP,
    ENV_DISABLE_PLUGINS,
    ENV_PLUGINS,
    PluginSelection,
    load_registry,
    load_selection,
)
from kvcore._registry import (
    Claim,
    HookCall,
    LayerType,
    PluginInfo,
    Registry,
    registry_from_layer_types,
)
from kvcore._request import MultiModalFeature, Request
from kvcore._utils import format_bytes
from kvcore.errors import (
    DoubleFreeError,
    HookImplementationError,
    InsufficientMemoryError,
    InvalidBlockError,
    InvalidCacheHitError,
    InvalidConfigError,
    InvalidRequestError,
    InvalidSpecError,
    KVCoreError,
    OutOfBlocksError,
    PluginConflictError,
    PluginError,
    PluginLoadError,
    PluginNotFoundError,
    PoolTooLargeError,
    PrefixCachingNotSupportedError,
    RequestStateError,
    RequestTooLongError,
    TraceFormatError,
    UnknownEvictionPolicyError,
    UnknownSpecError,
)
from kvcore.hookspecs import hookimpl

#: The version of this kvcore (PEP 440).
__version__ = "0.1.0.dev0"

__all__ = [
    # engine-facing
    "KVCacheManager",
    "KVCacheBlocks",
    "PrefixCacheStats",
    "Request",
    "MultiModalFeature",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheTensor",
    "KVCacheLayout",
    # planning
    "plan",
    "print_plan",
    "KVCachePlan",
    "GroupReport",
    "get_kv_cache_groups",
    "get_kv_cache_config",
    "get_kv_cache_configs",
    "estimate_max_model_len",
    "fit_max_model_len",
    "max_concurrency",
    "allocate_kv_cache",
    "KVCacheBuffers",
    "list_models",
    "load_model_config",
    "ModelConfig",
    "ModelFields",
    "ConfigFields",
    "ModelLayer",
    "LayerConfig",
    "LayerKind",
    "PlanOption",
    "build_layer_specs",
    "parse_memory",
    "format_bytes",
    "BlockPool",
    "NULL_BLOCK",
    "Transaction",
    "available_eviction_policies",
    "BlockHasher",
    "HASH_ALGORITHMS",
    # events
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVCacheEvent",
    # plugins
    "hookimpl",
    "LayerType",
    "PluginInfo",
    "Claim",
    "HookCall",
    "Registry",
    "PluginSelection",
    "load_registry",
    "load_selection",
    "registry_from_layer_types",
    "ENTRY_POINT_GROUP",
    "ENV_PLUGINS",
    "ENV_DISABLE_PLUGINS",
    # errors
    "errors",
    "eviction",
    "hookspecs",
    "managers",
    "specs",
    "KVCoreError",
    "PluginError",
    "PluginLoadError",
    "PluginNotFoundError",
    "PluginConflictError",
    "HookImplementationError",
    "UnknownSpecError",
    "UnknownEvictionPolicyError",
    "InvalidSpecError",
    "InvalidConfigError",
    "InsufficientMemoryError",
    "PoolTooLargeError",
    "InvalidRequestError",
    "RequestTooLongError",
    "RequestStateError",
    "InvalidCacheHitError",
    "InvalidBlockError",
    "DoubleFreeError",
    "OutOfBlocksError",
    "PrefixCachingNotSupportedError",
    "TraceFormatError",
    "__version__",
]
