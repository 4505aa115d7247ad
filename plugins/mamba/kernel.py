"""The Mamba / linear-attention reference kernel: a gated recurrence with a conv window.

The layer keeps, per request, a *convolution window* (the last ``K - 1``
inputs of a causal depthwise convolution of width ``K``) and a *recurrent
state*; these are the two tensors of the spec (``shapes[0] = (K - 1,
channels)``, ``shapes[1]`` = the state, any shape). For each token ``t``,
with input ``x``::

    u      = x W_in                                   (channels)
    y      = tanh(Σ_k conv[k] ⊙ [window; u][k])       (depthwise causal conv)
    window = [window; u][1:]
    state  = sigmoid(y W_a) ⊙ state + y W_b            (gated linear recurrence)
    out    = (state ⊙ y W_c) W_o

Both tensors are rounded to their dtypes after every token, in the paged
and the dense path alike.

Where the state lives follows kvcore's Mamba manager: block ``i`` of a
request's table holds the state after ``(i + 1) × block_size`` tokens, so
the state after ``n`` tokens is read from entry ``(n - 1) // block_size``
(a block-boundary checkpoint when ``n`` is a multiple of the block size, the
running state of a partly computed block otherwise). A step starting at
position ``n > 0`` reads its initial state there; every block boundary it
crosses writes a checkpoint into that block (unless the table holds the
null block there: the manager keeps no state at that boundary), and its last
position writes the running state into its block. A prefix hit of ``(i + 1) × block_size``
tokens therefore resumes from checkpoint ``i``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kvcore.reference import (
    CacheLayer,
    Params,
    ReferenceKernel,
    StepInput,
    init_weight,
    project,
    round_to,
)
from kvcore.specs import KVCacheSpec
from kvcore_plugins.mamba.spec import MambaSpec

__all__ = ["MambaKernel"]

_State = tuple[torch.Tensor, torch.Tensor]  # (window (K - 1, channels), flat state)


def _mamba_spec(spec: KVCacheSpec) -> MambaSpec:
    if not isinstance(spec, MambaSpec):
        msg = f"MambaKernel serves MambaSpec, got {type(spec).__name__}"
        raise TypeError(msg)
    if len(spec.shapes) != 2 or len(spec.shapes[0]) != 2:
        msg = (
            "MambaKernel needs two state tensors, a convolution window (K - 1, channels) "
            f"and a recurrent state; got shapes {spec.shapes}"
        )
        raise NotImplementedError(msg)
    return spec


class MambaKernel(ReferenceKernel):
    """A causal conv window and a gated linear recurrence, stored in the Mamba group's blocks."""

    def init_params(
        self, spec: KVCacheSpec, hidden_size: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Input, convolution, gate, update, readout and output weights."""
        mamba = _mamba_spec(spec)
        (taps, channels), state_shape = mamba.shapes[0], mamba.shapes[1]
        size = math.prod(state_shape)
        return {
            "w_in": init_weight(generator, hidden_size, channels),
            "conv": init_weight(generator, taps + 1, channels),
            "w_a": init_weight(generator, channels, size),
            "w_b": init_weight(generator, channels, size),
            "w_c": init_weight(generator, channels, size),
            "w_o": init_weight(generator, size, hidden_size),
        }

    def _token(
        self, spec: MambaSpec, params: Params, x: torch.Tensor, state: _State
    ) -> tuple[torch.Tensor, _State]:
        window, recurrent = state
        taps = torch.cat([window, project(x, params["w_in"])[None]])
        y = torch.tanh((taps * params["conv"]).sum(0))
        gate = torch.sigmoid(project(y, params["w_a"]))
        recurrent = round_to(gate * recurrent + project(y, params["w_b"]), spec.dtypes[1])
        window = round_to(taps[1:], spec.dtypes[0])
        out = project(recurrent * project(y, params["w_c"]), params["w_o"])
        return out, (window, recurrent)

    @staticmethod
    def _zeros(spec: MambaSpec, device: torch.device) -> _State:
        window = torch.zeros(spec.shapes[0], dtype=torch.float64, device=device)
        return window, torch.zeros(math.prod(spec.shapes[1]), dtype=torch.float64, device=device)

    def begin(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput
    ) -> _State:
        """Read the state after ``step.start`` tokens (zeros at position 0)."""
        mamba = _mamba_spec(spec)
        if step.start == 0:
            return self._zeros(mamba, step.x.device)
        index = (step.start - 1) // layer.block_size
        window, recurrent = layer.read_block(step.block_table, index, who=step.who)
        return window, recurrent.reshape(-1)

    @staticmethod
    def _store(
        spec: MambaSpec, layer: CacheLayer, step: StepInput, index: int, state: _State
    ) -> None:
        window, recurrent = state
        layer.write_block(
            step.block_table, index, (window, recurrent.reshape(spec.shapes[1])), who=step.who
        )

    def finish(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput, carry: Any
    ) -> torch.Tensor:
        """Run the recurrence; checkpoint at every block boundary and after the last position."""
        mamba = _mamba_spec(spec)
        size = layer.block_size
        state: _State = carry
        outputs = []
        for offset, x in enumerate(step.x):
            out, state = self._token(mamba, params, x, state)
            outputs.append(out)
            done = step.start + offset + 1
            # A boundary whose block is null keeps no state (selective prefill states).
            if done % size == 0 and step.block_table[done // size - 1]:
                self._store(mamba, layer, step, done // size - 1, state)
        end = step.start + step.num_tokens
        if end % size:
            self._store(mamba, layer, step, (end - 1) // size, state)
        return torch.stack(outputs)

    def dense(
        self,
        spec: KVCacheSpec,
        params: Params,
        x: torch.Tensor,
        encoder_states: torch.Tensor | None,
    ) -> torch.Tensor:
        """The recurrence over the whole sequence from a zero state."""
        mamba = _mamba_spec(spec)
        state = self._zeros(mamba, x.device)
        outputs = []
        for xt in x:
            out, state = self._token(mamba, params, xt, state)
            outputs.append(out)
        return torch.stack(outputs)
