"""The cross-attention reference kernel: a query reads the request's encoder output."""

from __future__ import annotations

from typing import Any

import torch

from kvcore.reference import (
    CacheLayer,
    PagedAccessError,
    Params,
    StepInput,
    TokenRowKernel,
    round_to,
)
from kvcore.specs import KVCacheSpec

__all__ = ["CrossAttentionKernel"]


def _encoder_states(step: StepInput) -> torch.Tensor:
    if step.encoder_states is None or not len(step.encoder_states):
        msg = (
            f"request {step.request_id!r} has no encoder output, but a cross-attention layer "
            "reads it; schedule the request with its num_encoder_tokens"
        )
        raise PagedAccessError(msg)
    return step.encoder_states


class CrossAttentionKernel(TokenRowKernel):
    """Attention from decoder positions over every encoder position.

    The rows are the keys and values of the encoder output, one per encoder
    token, in the cross-attention group's blocks (``ceil(encoder tokens /
    block_size)`` of them, allocated with the request's first step). They are
    written when the request's decoding starts from position 0 (its first
    step, or its first step after a preemption, since these blocks are never
    cached) and read back, all of them, by every query.
    """

    def begin(self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput) -> None:
        """At the request's first position, store the encoder's keys and values."""
        states = _encoder_states(step)
        if step.start == 0:
            rows = torch.stack([self.token_row(spec, params, x) for x in states])
            layer.write(step.block_table, 0, rows, who=step.who)

    def finish(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput, carry: Any
    ) -> torch.Tensor:
        """Every position attends to all encoder rows, read back from the cache."""
        num_encoder = len(_encoder_states(step))
        rows = layer.read(step.block_table, 0, num_encoder, who=step.who)
        return torch.stack([self.read_out(spec, params, x, rows) for x in step.x])

    def dense(
        self,
        spec: KVCacheSpec,
        params: Params,
        x: torch.Tensor,
        encoder_states: torch.Tensor | None,
    ) -> torch.Tensor:
        """Every position attends to all encoder rows, computed without a cache."""
        if encoder_states is None or not len(encoder_states):
            msg = "a cross-attention layer needs the request's encoder output"
            raise PagedAccessError(msg)
        rows = torch.stack([self.token_row(spec, params, e) for e in encoder_states])
        rows = round_to(rows, spec.page_parts()[0].dtype)
        return torch.stack([self.read_out(spec, params, xt, rows) for xt in x])
