"""Mamba and linear-attention layers from a model config.

Three kinds, each with the state shapes of its recurrence (for one worker,
without tensor parallelism):

``"mamba"`` (Mamba-1, e.g. Jamba)
    convolution state ``(d_conv - 1, d_inner)`` and SSM state
    ``(d_inner, d_state)``, with ``d_inner = mamba_expand × hidden_size``.
``"mamba2"`` (e.g. Bamba, Nemotron-H)
    convolution state ``(d_conv - 1, d_inner + 2 × n_groups × d_state)`` and
    SSM state ``(n_heads, d_head, d_state)``.
``"linear_attention"`` (gated delta net, Qwen3-Next)
    convolution state ``(kernel - 1, 2 × k_heads × k_dim + v_heads × v_dim)``
    and recurrent state ``(v_heads, k_dim, v_dim)``.

States use the model's dtype. The plan option ``mamba.cache_mode``
chooses how they are cached: ``"align"`` (the default; the block size is the
attention block size, planning then raises it until an attention page holds
a state, and states at block boundaries can be prefix-cached) or ``"none"``
(the block size is the model length: one state per request, never cached).

Configs without ``layer_types`` are recognized by their fields: Jamba's
``attn_layer_period`` / ``attn_layer_offset`` (attention every period-th
layer, Mamba-1 otherwise) and Qwen3-Next's ``full_attention_interval`` (full
attention every interval-th layer, gated delta net otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import kvcore
from kvcore_plugins.mamba.spec import PREFILL_STATES, MambaSpec, PrefillStates

__all__ = [
    "build_gated_delta_net",
    "build_mamba1",
    "build_mamba2",
    "kvcore_layer_kinds",
    "kvcore_model_layers",
    "kvcore_plan_options",
]


def _state(
    layer: kvcore.planning.LayerConfig, shapes: tuple[tuple[int, ...], ...], mamba_type: str
) -> MambaSpec:
    align = layer.option("cache_mode") == "align"
    return MambaSpec(
        block_size=layer.block_size if align else layer.max_model_len,
        shapes=shapes,
        dtypes=(layer.state_dtype,) * len(shapes),
        mamba_type=mamba_type,
        mamba_cache_mode="align" if align else "none",
        # The plan option's choices are PREFILL_STATES; the spec checks again.
        prefill_states=cast("PrefillStates", layer.option("prefill_states")),
    )


def build_mamba1(layer: kvcore.planning.LayerConfig) -> MambaSpec:
    """A Mamba-1 layer (Jamba): ``mamba_expand``, ``mamba_d_conv``, ``mamba_d_state``."""
    inner = layer.require_int("mamba_expand") * layer.require_int("hidden_size")
    conv = layer.require_int("mamba_d_conv")
    state = layer.require_int("mamba_d_state")
    return _state(layer, ((conv - 1, inner), (inner, state)), "mamba1")


def build_mamba2(layer: kvcore.planning.LayerConfig) -> MambaSpec:
    """A Mamba-2 layer: ``mamba_n_heads``, ``mamba_d_head``, ``mamba_n_groups``, ..."""
    heads = layer.require_int("mamba_n_heads")
    head_dim = layer.require_int("mamba_d_head")
    groups = layer.get_int("mamba_n_groups", "n_groups", default=1)
    state = layer.require_int("mamba_d_state", "ssm_state_size")
    conv = layer.require_int("mamba_d_conv", "conv_kernel")
    inner = heads * head_dim
    return _state(
        layer, ((conv - 1, inner + 2 * groups * state), (heads, head_dim, state)), "mamba2"
    )


def build_gated_delta_net(layer: kvcore.planning.LayerConfig) -> MambaSpec:
    """A gated-delta-net linear-attention layer (Qwen3-Next ``linear_*`` fields)."""
    k_heads = layer.require_int("linear_num_key_heads")
    v_heads = layer.require_int("linear_num_value_heads")
    k_dim = layer.require_int("linear_key_head_dim")
    v_dim = layer.require_int("linear_value_head_dim")
    kernel = layer.require_int("linear_conv_kernel_dim")
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return _state(layer, ((kernel - 1, conv_dim), (v_heads, k_dim, v_dim)), "gated_delta_net")


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"mamba"``, ``"mamba2"`` and ``"linear_attention"`` layers."""
    return [
        kvcore.planning.LayerKind("mamba", build_mamba1, module_name="mamba"),
        kvcore.planning.LayerKind("mamba2", build_mamba2),
        kvcore.planning.LayerKind(
            "linear_attention", build_gated_delta_net, module_name="linear_attn"
        ),
    ]


@kvcore.hookimpl
def kvcore_plan_options() -> list[kvcore.planning.PlanOption]:
    """``cache_mode``: how states are cached; ``prefill_states``: which a prefill keeps."""
    return [
        kvcore.planning.PlanOption(
            name="cache_mode",
            default="align",
            choices=("align", "none"),
            help="align: states cached at block boundaries (prefix caching); "
            "none: one state per request, never cached",
        ),
        kvcore.planning.PlanOption(
            name="prefill_states",
            default="every",
            choices=PREFILL_STATES,
            help="every: a prefill keeps the state at every block boundary it crosses; "
            "selective: inside the prompt only at its last boundary and where an earlier "
            "prompt diverged (align mode)",
        ),
    ]


@kvcore.hookimpl
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """Jamba (``attn_layer_period``) and Qwen3-Next (``full_attention_interval``) layouts."""
    if model.layer_types is not None:
        return None
    if model.get("attn_layer_period") is not None:
        period = model.require_int("attn_layer_period")
        offset = model.require_int("attn_layer_offset", minimum=0)
        count = model.num_hidden_layers
        kinds = ["full_attention" if i % period == offset else "mamba" for i in range(count)]
    elif model.get("full_attention_interval") is not None:
        interval = model.require_int("full_attention_interval")
        count = model.num_hidden_layers
        kinds = [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(count)
        ]
    else:
        return None
    return model.decoder_layers(kinds)
