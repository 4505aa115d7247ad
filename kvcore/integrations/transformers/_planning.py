"""Plan a Hugging Face model's cache from the model itself: its config, its dtype."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from kvcore._planning.model_config import model_config_from_dict
from kvcore._planning.plan import KVCachePlan, plan
from kvcore._plugin_loader import load_registry
from kvcore._registry import Registry
from kvcore.errors import InvalidConfigError
from kvcore.specs import dtype_name

__all__ = ["model_dtype", "planning_fields", "plan_model"]


def model_dtype(model: torch.nn.Module) -> str:
    """The dtype of the model's floating-point parameters (canonical name).

    Raises:
        InvalidConfigError: the model has no floating-point parameter, or two
            dtypes (a cache holds one).
    """
    dtypes = {p.dtype for p in model.parameters() if p.dtype.is_floating_point}
    if len(dtypes) != 1:
        found = ", ".join(sorted(str(d) for d in dtypes)) or "none"
        msg = (
            f"the model's floating-point parameters have dtypes {found}; kvcore plans one "
            "cache dtype from them: cast the model to one dtype (model.to(torch.bfloat16))"
        )
        raise InvalidConfigError(msg)
    return dtype_name(dtypes.pop())


def planning_fields(config: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """The config fields kvcore plans with: the model's, with its parameters' dtype.

    transformers caches what kvcore's plugins plan for each type, from the
    same fields: keys and values per KV head, the last convolution inputs
    and the recurrent state of a linear-attention layer, and for multi-head
    latent attention (``kv_lora_rank``, DeepSeek-V3) the compressed latent
    and the shared rotary key, one row of ``kv_lora_rank +
    qk_rope_head_dim`` per token.
    """
    fields = dict(config)
    fields["torch_dtype"] = dtype
    fields.pop("dtype", None)
    return fields


def plan_model(
    model: torch.nn.Module,
    *,
    memory: int | str,
    max_model_len: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int | None = None,
    num_blocks: int | None = None,
    hybrid: bool = True,
    options: Mapping[str, str] | None = None,
    registry: Registry | None = None,
) -> KVCachePlan:
    """Plan the KV cache of a transformers model from its own config and dtype.

    The layers, windows, chunks and state shapes come from
    ``model.config`` through the plugins, as :func:`kvcore.plan` reads a
    ``config.json``; the cache dtype is the dtype of the model's parameters
    (not the config's, which a ``model.to(...)`` does not update). The plan
    is for the shared pool (``pool="shared"``): the cache hands a recurrent
    layer's states over at the attention block boundaries, where the shared
    pool keeps them.

    Args:
        model: A transformers model (``PreTrainedModel``).
        memory: Bytes for the cache (``"1GiB"``).
        max_model_len: Longest request; default the model's, lowered to fit.
        max_num_batched_tokens: Tokens per step (windows keep that many more).
        block_size: Tokens per attention block (default 16, raised for state
            layers until an attention page holds a state).
        num_blocks: Use this many blocks instead of what ``memory`` holds.
        hybrid: ``False``: windows and chunks allocated for every token.
        options: Plugins' plan options (``{"mamba.cache_mode": "align"}``).
        registry: The plugins; default every installed one.

    Raises:
        InvalidConfigError, InsufficientMemoryError, UnknownSpecError: as
            :func:`kvcore.plan`.
    """
    registry = load_registry() if registry is None else registry
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        msg = f"{type(model).__name__} has no transformers config (model.config); pass a model"
        raise InvalidConfigError(msg)
    name = getattr(config, "name_or_path", "") or type(model).__name__
    fields = planning_fields(config.to_dict(), model_dtype(model))
    cfg = model_config_from_dict(fields, name=name, source="model.config", registry=registry)
    return plan(
        cfg,
        memory=memory,
        max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        num_blocks=num_blocks,
        registry=registry,
        hybrid=hybrid,
        options=options,
        pool="shared",
    )
