"""The hidden-state cache reference kernel: store each position's hidden state, read them back."""

from __future__ import annotations

import torch

from kvcore.reference import Params, TokenRowKernel, attend, init_weight, project
from kvcore.specs import AttentionSpec, KVCacheSpec
from kvcore_plugins.hidden_state.spec import HiddenStateCacheSpec

__all__ = ["HiddenStateCacheKernel"]


def _hidden_spec(spec: KVCacheSpec) -> AttentionSpec:
    if not isinstance(spec, HiddenStateCacheSpec):
        msg = f"HiddenStateCacheKernel serves HiddenStateCacheSpec, got {type(spec).__name__}"
        raise TypeError(msg)
    return spec


class HiddenStateCacheKernel(TokenRowKernel):
    """Stores ``num_kv_heads`` hidden-state vectors per position and reads all of them back.

    The layer keeps what a consumer of hidden states (a draft model, a
    connector) would be shipped: a projection of the layer's input at every
    position, in the group's own block table. Its output is what such a
    consumer computes from them: the query at ``t`` attends over the stored
    vectors of positions ``[0, t]``, used as keys and as values.
    """

    def init_params(
        self, spec: KVCacheSpec, hidden_size: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Projection to the stored vectors, a query projection, an output projection."""
        stored = _hidden_spec(spec)
        width = stored.num_kv_heads * stored.head_size
        return {
            "wh": init_weight(generator, hidden_size, width),
            "wq": init_weight(generator, hidden_size, width),
            "wo": init_weight(generator, width, hidden_size),
        }

    def token_row(self, spec: KVCacheSpec, params: Params, x: torch.Tensor) -> torch.Tensor:
        """The stored vectors, ``(num_kv_heads, head_size)``."""
        stored = _hidden_spec(spec)
        return project(x, params["wh"]).reshape(stored.num_kv_heads, stored.head_size)

    def read_out(
        self, spec: KVCacheSpec, params: Params, x: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Attention over the stored vectors (keys and values alike)."""
        stored = _hidden_spec(spec)
        query = project(x, params["wq"]).reshape(stored.num_kv_heads, stored.head_size)
        return project(attend(query, rows, rows).reshape(-1), params["wo"])
