"""Planning a model's KV cache: from a model and an amount of memory to tensors.

:func:`~kvcore.plan` reads a model (a shipped name or a ``config.json``), builds one
spec per cache-holding layer, groups the layers, unifies their pages (the
shared pool) or makes page classes of them (the two-level pool, with its
:class:`PageClasses`) and sizes the pool; :func:`~kvcore.allocate_kv_cache` turns the resulting
:class:`~kvcore.KVCacheConfig` into torch tensors with per-layer views. The
rest are the steps on their own, for engines that plan in their own way, and
the values plugins read and return while a model's layers are built
(:class:`LayerConfig`, :class:`LayerKind`, :class:`PlanOption`,
:class:`ModelFields`, :class:`ModelLayer`). See :doc:`/explanation/planning`.

Importing this module does not import torch (``allocate_kv_cache`` does, when
called).
"""

from __future__ import annotations

from kvcore._planning.allocate import KVCacheBuffers, allocate_kv_cache
from kvcore._planning.fields import ConfigFields
from kvcore._planning.grouping import get_kv_cache_groups
from kvcore._planning.layer_config import LayerConfig
from kvcore._planning.memory import parse_memory
from kvcore._planning.model_config import (
    ModelConfig,
    ModelFields,
    build_layer_specs,
    list_models,
    load_model_config,
    model_config_from_dict,
)
from kvcore._planning.page_classes import PageClasses
from kvcore._planning.plan import KVCachePlan, plan, print_plan
from kvcore._planning.pool_choice import DEFAULT_MAMBA_CHECKPOINT, POOLS, PoolChoice
from kvcore._planning.report import GroupReport
from kvcore._planning.sizing import (
    estimate_max_model_len,
    fit_max_model_len,
    get_kv_cache_config,
    get_kv_cache_configs,
    max_concurrency,
)
from kvcore._plugin_types import LayerBuilder, LayerKind, ModelLayer, PlanOption
from kvcore._utils import format_bytes

__all__ = [
    # the whole plan
    "plan",
    "print_plan",
    "KVCachePlan",
    "GroupReport",
    "allocate_kv_cache",
    "KVCacheBuffers",
    # two-level pools
    "POOLS",
    "PoolChoice",
    "PageClasses",
    "DEFAULT_MAMBA_CHECKPOINT",
    # models
    "list_models",
    "load_model_config",
    "model_config_from_dict",
    "ModelConfig",
    "ModelFields",
    "ConfigFields",
    "ModelLayer",
    "build_layer_specs",
    # what plugins are given and give back while layers are built
    "LayerConfig",
    "LayerKind",
    "LayerBuilder",
    "PlanOption",
    # the steps on their own
    "get_kv_cache_groups",
    "get_kv_cache_config",
    "get_kv_cache_configs",
    "estimate_max_model_len",
    "fit_max_model_len",
    "max_concurrency",
    # amounts of memory
    "parse_memory",
    "format_bytes",
]
