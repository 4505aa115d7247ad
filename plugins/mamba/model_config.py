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

States use the model's dtype. In ``"align"`` cache mode the block size is
the attention block size (planning then raises it until an attention page
holds a state); in ``"none"`` mode it is the model length (one state per
request).
"""

from __future__ import annotations

from collections.abc import Callable

import kvcore
from kvcore_plugins.mamba.spec import MambaSpec

__all__ = ["build_gated_delta_net", "build_mamba1", "build_mamba2", "kvcore_layer_kinds"]


def _state(
    layer: kvcore.LayerConfig, shapes: tuple[tuple[int, ...], ...], mamba_type: str
) -> MambaSpec:
    align = layer.mamba_cache_mode == "align"
    return MambaSpec(
        block_size=layer.block_size if align else layer.max_model_len,
        shapes=shapes,
        dtypes=(layer.state_dtype,) * len(shapes),
        mamba_type=mamba_type,
        mamba_cache_mode="align" if align else "none",
    )


def build_mamba1(layer: kvcore.LayerConfig) -> MambaSpec:
    """A Mamba-1 layer (Jamba): ``mamba_expand``, ``mamba_d_conv``, ``mamba_d_state``."""
    inner = int(layer.require("mamba_expand")) * int(layer.require("hidden_size"))
    conv = int(layer.require("mamba_d_conv"))
    state = int(layer.require("mamba_d_state"))
    return _state(layer, ((conv - 1, inner), (inner, state)), "mamba1")


def build_mamba2(layer: kvcore.LayerConfig) -> MambaSpec:
    """A Mamba-2 layer: ``mamba_n_heads``, ``mamba_d_head``, ``mamba_n_groups``, ..."""
    heads = int(layer.require("mamba_n_heads"))
    head_dim = int(layer.require("mamba_d_head"))
    groups = int(layer.get("mamba_n_groups", "n_groups", default=1))
    state = int(layer.require("mamba_d_state", "ssm_state_size"))
    conv = int(layer.require("mamba_d_conv", "conv_kernel"))
    inner = heads * head_dim
    return _state(
        layer, ((conv - 1, inner + 2 * groups * state), (heads, head_dim, state)), "mamba2"
    )


def build_gated_delta_net(layer: kvcore.LayerConfig) -> MambaSpec:
    """A gated-delta-net linear-attention layer (Qwen3-Next ``linear_*`` fields)."""
    k_heads = int(layer.require("linear_num_key_heads"))
    v_heads = int(layer.require("linear_num_value_heads"))
    k_dim = int(layer.require("linear_key_head_dim"))
    v_dim = int(layer.require("linear_value_head_dim"))
    kernel = int(layer.require("linear_conv_kernel_dim"))
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return _state(layer, ((kernel - 1, conv_dim), (v_heads, k_dim, v_dim)), "gated_delta_net")


@kvcore.hookimpl
def kvcore_layer_kinds() -> dict[str, Callable[[kvcore.LayerConfig], MambaSpec]]:
    """Claim ``"mamba"``, ``"mamba2"`` and ``"linear_attention"`` layers."""
    return {
        "mamba": build_mamba1,
        "mamba2": build_mamba2,
        "linear_attention": build_gated_delta_net,
    }
