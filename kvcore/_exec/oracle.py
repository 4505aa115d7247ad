"""The dense oracle: the reference model over a whole sequence, with no cache at all."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvcore._exec.model import ReferenceModel

__all__ = ["dense_outputs"]


def dense_outputs(
    model: ReferenceModel, token_ids: Sequence[int], encoder_states: torch.Tensor | None
) -> torch.Tensor:
    """The hidden state after every layer at every position, ``(layers, T, hidden)``.

    Each layer runs its kernel's :meth:`~kvcore.reference.ReferenceKernel.dense`
    with the spec the model config built (not the planned one): no block
    table, no page, no allocation decision enters this computation.
    """
    hidden = model.embed(token_ids)
    outputs = []
    for layer in model.layers:
        hidden = hidden + layer.kernel.dense(layer.spec, layer.params, hidden, encoder_states)
        outputs.append(hidden)
    return torch.stack(outputs)
