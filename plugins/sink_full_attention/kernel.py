"""The attention-sink reference kernel: full attention plus the sink tokens."""

from __future__ import annotations

from typing import cast

import torch

from kvcore.reference import CacheLayer, Params, StepInput, TokenRowKernel, round_to
from kvcore.specs import KVCacheSpec
from kvcore_plugins.sink_full_attention.manager import SinkFullAttentionManager
from kvcore_plugins.sink_full_attention.spec import SinkFullAttentionSpec

__all__ = ["SinkFullAttentionKernel"]


def _sink_spec(spec: KVCacheSpec) -> SinkFullAttentionSpec:
    if not isinstance(spec, SinkFullAttentionSpec):
        msg = f"SinkFullAttentionKernel serves SinkFullAttentionSpec, got {type(spec).__name__}"
        raise TypeError(msg)
    return spec


class SinkFullAttentionKernel(TokenRowKernel):
    """Attention over the ``sink_len`` learned sink rows, then positions ``[0, t]``.

    The sink keys and values are weights of the layer, the same for every
    request. :meth:`setup` writes them once into the blocks the manager
    reserved for them (``manager.sink_blocks``); every query reads them back
    from there, so a sink block freed or handed to a request would be
    overwritten and change the output.
    """

    def init_params(
        self, spec: KVCacheSpec, hidden_size: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """The attention projections, and ``sink``: ``(sink_len, heads, key + value width)``."""
        sink = _sink_spec(spec)
        params = super().init_params(sink, hidden_size, generator)
        width = sink.head_size + sink.head_size_v
        params["sink"] = torch.randn(
            sink.sink_len, sink.num_kv_heads, width, generator=generator, dtype=torch.float64
        )
        return params

    def setup(self, spec: KVCacheSpec, params: Params, layer: CacheLayer) -> None:
        """Write the sink rows into the reserved sink blocks."""
        blocks = tuple(cast(SinkFullAttentionManager, layer.manager).sink_blocks)
        layer.write(blocks, 0, params["sink"], who="the sink blocks")

    def extra_rows(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput
    ) -> torch.Tensor:
        """The sink rows, read back from the reserved sink blocks."""
        blocks = tuple(cast(SinkFullAttentionManager, layer.manager).sink_blocks)
        return layer.read(blocks, 0, len(params["sink"]), who="the sink blocks")

    def dense_extra_rows(self, spec: KVCacheSpec, params: Params) -> torch.Tensor:
        """The sink rows, rounded to the cache's dtype (its page's one part's)."""
        return round_to(params["sink"], _sink_spec(spec).page_parts()[0].dtype)
