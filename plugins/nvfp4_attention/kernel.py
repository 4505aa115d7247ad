"""The NVFP4 attention reference kernel: full attention over rows stored in NVFP4."""

from __future__ import annotations

import torch

from kvcore.reference import CacheLayer, StepInput, TokenRowKernel
from kvcore.specs import KVCacheSpec
from kvcore_plugins.nvfp4_attention.codec import decode, encode, quantize

__all__ = ["NVFP4AttentionKernel"]

_CODES, _SCALES = 0, 1  # the page parts: packed values, then their scales


class NVFP4AttentionKernel(TokenRowKernel):
    """Attention over positions ``[0, t]``; rows quantized on write, dequantized on read.

    A row (per head, the key then the value) is encoded into the page's
    ``"kv"`` part (packed codes) and ``"kv_scale"`` part (one E4M3 scale per
    16 values) when its position is computed, and decoded when a query reads
    it. The dense path computes with ``decode(encode(rows))`` of the same
    rows (:func:`~kvcore_plugins.nvfp4_attention.codec.quantize`), so both
    paths attend over identical float64 values.
    """

    def store_rows(
        self, spec: KVCacheSpec, layer: CacheLayer, step: StepInput, rows: torch.Tensor
    ) -> None:
        """Encode the rows and write codes and scales into their parts."""
        codes, scales = encode(rows)
        layer.write(step.block_table, step.start, codes, who=step.who, part=_CODES)
        layer.write(step.block_table, step.start, scales, who=step.who, part=_SCALES)

    def load_rows(
        self, spec: KVCacheSpec, layer: CacheLayer, step: StepInput, start: int, stop: int
    ) -> torch.Tensor:
        """Read codes and scales of ``[start, stop)`` back and decode them."""
        codes = layer.read(step.block_table, start, stop, who=step.who, part=_CODES)
        scales = layer.read(step.block_table, start, stop, who=step.who, part=_SCALES)
        return decode(codes, scales)

    def stored(self, spec: KVCacheSpec, rows: torch.Tensor) -> torch.Tensor:
        """The rows as the cache gives them back: quantized and dequantized."""
        return quantize(rows)
