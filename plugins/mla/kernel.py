"""The multi-head latent attention reference kernel: queries read the latent vectors."""

from __future__ import annotations

import torch

from kvcore.reference import Params, TokenRowKernel, attend, init_weight, project
from kvcore.specs import KVCacheSpec
from kvcore_plugins.mla.spec import MLAAttentionSpec

__all__ = ["MLAAttentionKernel"]

#: Query heads of the reference layer (the cache holds one latent per token
#: whatever the number of query heads).
QUERY_HEADS = 2


def _mla_spec(spec: KVCacheSpec) -> MLAAttentionSpec:
    if not isinstance(spec, MLAAttentionSpec):
        msg = f"MLAAttentionKernel serves MLAAttentionSpec, got {type(spec).__name__}"
        raise TypeError(msg)
    if spec.cache_dtype_str is not None:
        msg = (
            f"MLAAttentionKernel reads plain {spec.dtype} latents; the packed cache format "
            f"{spec.cache_dtype_str!r} has no reference kernel"
        )
        raise NotImplementedError(msg)
    return spec


class MLAAttentionKernel(TokenRowKernel):
    """Attention in latent space (MLA's absorbed form) over positions ``[0, t]``.

    Each position stores one latent vector (``num_kv_heads × head_size``
    elements, no value part), projected from the layer's input. Every query
    head scores the latents directly and takes their weighted sum as its
    value: the up-projections of keys and values are folded into the query
    and output projections, as MLA kernels do at decode time.
    """

    def init_params(
        self, spec: KVCacheSpec, hidden_size: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Latent down-projection, query heads in latent space, output projection."""
        mla = _mla_spec(spec)
        latent = mla.num_kv_heads * mla.head_size
        return {
            "wkv": init_weight(generator, hidden_size, latent),
            "wq": init_weight(generator, hidden_size, QUERY_HEADS * latent),
            "wo": init_weight(generator, QUERY_HEADS * latent, hidden_size),
        }

    def token_row(self, spec: KVCacheSpec, params: Params, x: torch.Tensor) -> torch.Tensor:
        """The latent vector, ``(num_kv_heads, head_size)``."""
        mla = _mla_spec(spec)
        return project(x, params["wkv"]).reshape(mla.num_kv_heads, mla.head_size)

    def read_out(
        self, spec: KVCacheSpec, params: Params, x: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """Every query head attends over the latents, used as keys and as values."""
        latents = rows.reshape(len(rows), 1, -1).expand(len(rows), QUERY_HEADS, -1)
        query = project(x, params["wq"]).reshape(QUERY_HEADS, -1)
        return project(attend(query, latents, latents).reshape(-1), params["wo"])
