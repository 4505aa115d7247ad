"""Reference kernels: what a plugin implements so the executor can run its layers.

A *reference kernel* is a small pure-torch implementation of one attention
type's layer over kvcore's paged cache. It writes the KV (or state) of the
tokens being computed into the slots its block table names, reads back
exactly what its type is allowed to read, and computes the layer's output.
Plugins provide kernels through the
:func:`~kvcore.hookspecs.kvcore_reference_kernels` hook; the executor
(:mod:`kvcore.executor`) runs a tiny model made of them through a real
:class:`~kvcore.KVCacheManager` and compares every output with a dense run
of the same model that uses no cache at all.

Kernels are *strict*: every access goes through :class:`CacheLayer`, which
raises :class:`~kvcore.errors.PagedAccessError` when a position's block is the null block or
lies past the end of the table, so a bookkeeping bug shows up as an error or
a mismatch, never as a silently read zero.

Kernels compute in float64, one token position at a time, and the dense path
of a kernel (:meth:`ReferenceKernel.dense`) performs the same operations on
tensors of the same shapes as its paged path (:meth:`ReferenceKernel.begin`
and :meth:`ReferenceKernel.finish`): the paged path gathers what it reads
into a contiguous tensor, the dense path slices the same rows out of a
contiguous tensor, and both hand them to the same function. Values stored in
a cache of lower precision are rounded to its dtype in both paths. The two
paths therefore agree bit for bit.

This module imports torch; importing :mod:`kvcore` does not import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch

from kvcore import paging
from kvcore.errors import PagedAccessError
from kvcore.managers import SingleTypeManager
from kvcore.specs import AttentionSpec, KVCacheSpec

__all__ = [
    "COMPUTE_DTYPE",
    "PagedAccessError",
    "CacheLayer",
    "StepInput",
    "Params",
    "ReferenceKernel",
    "TokenRowKernel",
    "project",
    "attend",
    "round_to",
    "init_weight",
    "torch_dtype",
]

#: Every kernel computes in this dtype; caches of another dtype round to theirs.
COMPUTE_DTYPE = torch.float64

#: A layer's weights, by name (float64 tensors made by :meth:`ReferenceKernel.init_params`).
Params = Mapping[str, torch.Tensor]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a canonical dtype name (``"float64"`` → ``torch.float64``)."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        msg = f"torch has no dtype named {name!r}"
        raise ValueError(msg)
    return dtype


def round_to(values: torch.Tensor, dtype: str | torch.dtype) -> torch.Tensor:
    """``values`` rounded to ``dtype`` and back to float64 (what a cache of that dtype keeps).

    Exact, and a no-op, for float64. The dense path of a kernel rounds with it
    wherever the paged path stores into the cache.
    """
    target = torch_dtype(dtype) if isinstance(dtype, str) else dtype
    if target == COMPUTE_DTYPE:
        return values
    return values.to(target).to(COMPUTE_DTYPE)


def project(vector: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``vector @ weight`` for one position: ``(n,)`` times ``(n, m)`` gives ``(m,)``.

    Written as an element-wise product and a sum rather than a BLAS call: a
    BLAS routine may round differently depending on how its inputs are laid
    out in memory, and the paged and dense paths hold their inputs in
    different places.
    """
    return (vector[:, None] * weight).sum(0)


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention of one query position over ``S`` rows.

    Args:
        query: ``(heads, k)``.
        keys: ``(S, heads, k)``.
        values: ``(S, heads, v)``.

    Returns:
        ``(heads, v)``: per head, the softmax-weighted sum of the values.
    """
    scores = (keys * query).sum(-1) * (query.shape[-1] ** -0.5)
    weights = torch.softmax(scores, dim=0)
    return (weights[..., None] * values).sum(0)


def init_weight(generator: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """A ``(rows, cols)`` float64 weight with entries of variance ``1 / rows``."""
    weight = torch.randn(rows, cols, generator=generator, dtype=COMPUTE_DTYPE)
    scale: float = rows**-0.5
    return weight * scale


@attrs.frozen(kw_only=True)
class CacheLayer:
    """One layer of the allocated cache, as a kernel reads and writes it.

    Every access names the request it is made for and goes through the
    request's block table: position ``p`` lives in slot ``p % block_size`` of
    block ``table[p // block_size]``. A position past the table, or in the
    null block, raises :class:`~kvcore.errors.PagedAccessError`.

    Attributes:
        name: The layer's name.
        spec: The layer's *planned* spec: block size and page as allocated
            (what the layer computes is the kernel's ``spec`` argument).
        views: One tensor per page part of the spec, each
            ``(num_blocks, *part.shape)`` (see :func:`kvcore.allocate_kv_cache`).
        group_id: The KV cache group holding the layer.
        manager: That group's manager (for blocks a type keeps outside the
            tables, such as reserved sink blocks).
    """

    name: str
    spec: KVCacheSpec
    views: tuple[torch.Tensor, ...]
    group_id: int
    manager: SingleTypeManager[Any] = attrs.field(eq=False, repr=False)

    @property
    def block_size(self) -> int:
        """Tokens per block of the layer's group."""
        return self.spec.block_size

    def _positions(self, table: Sequence[int], positions: torch.Tensor, who: str) -> torch.Tensor:
        """The block of each position (:func:`kvcore.paging.block_ids`), checked."""
        view = self.views[0]
        try:
            return paging.block_ids(
                torch.as_tensor(table, dtype=torch.int64),
                positions,
                self.block_size,
                num_blocks=view.shape[0],
            )
        except PagedAccessError as exc:
            msg = f"layer {self.name!r} (group {self.group_id}), {who}: {exc}"
            raise PagedAccessError(msg) from None

    def read(
        self, table: Sequence[int], start: int, stop: int, *, who: str, part: int = 0
    ) -> torch.Tensor:
        """The rows of positions ``[start, stop)``, gathered into a new float64 tensor.

        Args:
            table: The block table to read through.
            start: First position.
            stop: One past the last position.
            who: The request (or other owner of ``table``), for error messages.
            part: Which page part to read.

        Returns:
            ``(stop - start, *part_shape[1:])``, contiguous, float64.

        Raises:
            PagedAccessError: a position is past the table or in the null block.
        """
        view = self.views[part]
        positions = torch.arange(start, max(start, stop), dtype=torch.int64)
        blocks = self._positions(table, positions, who).to(view.device)
        offsets = torch.remainder(positions, self.block_size).to(view.device)
        return view[blocks, offsets].to(COMPUTE_DTYPE)

    def write(
        self, table: Sequence[int], start: int, rows: torch.Tensor, *, who: str, part: int = 0
    ) -> None:
        """Store ``rows[j]`` at position ``start + j`` (rounded to the part's dtype).

        Raises:
            PagedAccessError: a position is past the table or in the null block.
        """
        view = self.views[part]
        positions = torch.arange(start, start + len(rows), dtype=torch.int64)
        blocks = self._positions(table, positions, who).to(view.device)
        offsets = torch.remainder(positions, self.block_size).to(view.device)
        view[blocks, offsets] = rows.to(view.dtype)

    def _block_at(self, table: Sequence[int], index: int, who: str) -> int:
        # Named by the block's last position: a state there is the state after it.
        position = torch.tensor([(index + 1) * self.block_size - 1], dtype=torch.int64)
        return int(self._positions(table, position, who)[0])

    def read_block(self, table: Sequence[int], index: int, *, who: str) -> tuple[torch.Tensor, ...]:
        """Every page part of block ``table[index]``, copied to float64 (for whole-block states).

        Raises:
            PagedAccessError: ``index`` is past the table or names the null block.
        """
        block = self._block_at(table, index, who)
        return tuple(view[block].to(COMPUTE_DTYPE, copy=True) for view in self.views)

    def write_block(
        self, table: Sequence[int], index: int, parts: Sequence[torch.Tensor], *, who: str
    ) -> None:
        """Store one tensor per page part into block ``table[index]``.

        Raises:
            PagedAccessError: ``index`` is past the table or names the null block.
        """
        block = self._block_at(table, index, who)
        for view, value in zip(self.views, parts, strict=True):
            view[block] = value.to(view.dtype)


@attrs.frozen(kw_only=True)
class StepInput:
    """One request's share of one step, as a layer sees it.

    Attributes:
        request_id: The request.
        start: Its first position computed in this step (its computed tokens
            before the step).
        x: The layer's input for positions ``[start, start + n)``, ``(n, hidden)``.
        block_table: The request's block table in the layer's group.
        encoder_states: The request's encoder output, ``(encoder tokens, hidden)``,
            or ``None`` (decoder-only requests).
    """

    request_id: str
    start: int
    x: torch.Tensor
    block_table: tuple[int, ...]
    encoder_states: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        """Positions computed in this step."""
        return len(self.x)

    @property
    def who(self) -> str:
        """The request, for error messages."""
        return f"request {self.request_id!r}"


class ReferenceKernel:
    """One attention type's layer, over the paged cache and densely.

    A step runs every layer over the whole batch in two phases, as a batched
    engine does: first :meth:`begin` for every request (attention writes the
    new tokens' keys and values; a recurrent layer reads its initial state),
    then :meth:`finish` for every request (reads what the type may read and
    computes the outputs). So one request can read what another wrote in the
    same layer of the same step, exactly when a real batched kernel could.

    Every method receives ``spec``, the layer's spec *as the model config
    built it*: it says what the layer computes (its window, its chunk, its
    shapes). Where the layer's data lives is the planner's business: the
    :class:`CacheLayer` carries the planned spec, block size and views, which
    may differ (a raised block size, a padded page, a window allocated as
    full attention). The paged and the dense path use the same ``spec``.

    Subclasses implement :meth:`init_params`, :meth:`begin`, :meth:`finish`
    and :meth:`dense`; :meth:`setup` is optional. A kernel holds no state of
    its own: everything it keeps lives in the cache.
    """

    def init_params(
        self, spec: KVCacheSpec, hidden_size: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Random weights of one layer of ``spec``, drawn from ``generator``.

        Args:
            spec: The layer's spec as the model config builds it.
            hidden_size: Width of the model's hidden state.
            generator: The layer's seeded generator.
        """
        msg = f"{type(self).__name__} must implement init_params"
        raise NotImplementedError(msg)

    def setup(self, spec: KVCacheSpec, params: Params, layer: CacheLayer) -> None:
        """Write what the layer keeps for every request (e.g. sink tokens), once.

        Called after the manager is built, before the first step. The default
        does nothing.
        """

    def begin(self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput) -> Any:
        """First phase of a step for one request; returns what :meth:`finish` needs."""
        msg = f"{type(self).__name__} must implement begin"
        raise NotImplementedError(msg)

    def finish(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput, carry: Any
    ) -> torch.Tensor:
        """Second phase: the layer's output for the step's positions, ``(n, hidden)``."""
        msg = f"{type(self).__name__} must implement finish"
        raise NotImplementedError(msg)

    def dense(
        self,
        spec: KVCacheSpec,
        params: Params,
        x: torch.Tensor,
        encoder_states: torch.Tensor | None,
    ) -> torch.Tensor:
        """The layer's output at every position of a whole sequence, with no cache.

        Args:
            spec: The layer's spec as the model config builds it.
            params: Its weights.
            x: The layer's input at every position, ``(T, hidden)``.
            encoder_states: The request's encoder output, or ``None``.

        Returns:
            ``(T, hidden)``, computed with the same operations, in the same
            order, as :meth:`begin` and :meth:`finish`.
        """
        msg = f"{type(self).__name__} must implement dense"
        raise NotImplementedError(msg)


class TokenRowKernel(ReferenceKernel):
    """A layer that stores one row per token and reads a contiguous range of rows back.

    The row of position ``t`` is :meth:`token_row` of the layer's input
    there, ``(heads, width)``, stored in the layer's single page part. The
    query at ``t`` reads the rows of positions ``[first_visible(t), t]``,
    preceded by :meth:`extra_rows` (if any), and :meth:`read_out` turns them
    into the output. Defaults: attention with keys and values side by side
    in the row (``head_size`` then ``head_size_v`` columns), every earlier
    position visible. Types override :meth:`first_visible` (windows,
    chunks), :meth:`extra_rows` (sinks), or the row and its reading (latent
    vectors, hidden states). A type whose cache holds the rows in a
    quantized format (:class:`~kvcore.specs.KVFormat`) overrides how rows
    are stored and loaded: :meth:`store_rows`, :meth:`load_rows` and, for
    the dense path, :meth:`stored`.
    """

    def first_visible(self, spec: KVCacheSpec, position: int) -> int:
        """The first position the query at ``position`` reads (never decreasing with it).

        The spec's :meth:`~kvcore.specs.KVCacheSpec.positions_read` for the
        query alone: 0 for full attention, the window's or the chunk's start,
        the recorded local spec's for a layer allocated as full attention.
        """
        reads = spec.positions_read(position)
        return reads[0].start if reads else position

    def init_params(
        self, spec: KVCacheSpec, hidden_size: int, generator: torch.Generator
    ) -> dict[str, torch.Tensor]:
        """Query, key-and-value and output projections, one query head per KV head.

        ``wkv`` maps the input to a whole row at once: per head, the key's
        ``head_size`` columns then the value's ``head_size_v``.
        """
        spec = _attention_spec(spec, self)
        heads, key, value = spec.num_kv_heads, spec.head_size, spec.head_size_v
        return {
            "wq": init_weight(generator, hidden_size, heads * key),
            "wkv": init_weight(generator, hidden_size, heads * (key + value)),
            "wo": init_weight(generator, heads * value, hidden_size),
        }

    def token_row(self, spec: KVCacheSpec, params: Params, x: torch.Tensor) -> torch.Tensor:
        """What position ``t`` stores, from the layer's input there: ``(heads, width)``."""
        spec = _attention_spec(spec, self)
        return project(x, params["wkv"]).reshape(spec.num_kv_heads, -1)

    def read_out(
        self, spec: KVCacheSpec, params: Params, x: torch.Tensor, rows: torch.Tensor
    ) -> torch.Tensor:
        """The output at one position from its input ``x`` and the rows it reads, ``(hidden,)``.

        ``rows`` is contiguous in both paths, so the key and value slices
        below have the same strides in both.
        """
        spec = _attention_spec(spec, self)
        key = spec.head_size
        query = project(x, params["wq"]).reshape(spec.num_kv_heads, key)
        output = attend(query, rows[..., :key], rows[..., key:])
        return project(output.reshape(-1), params["wo"])

    def store_rows(
        self, spec: KVCacheSpec, layer: CacheLayer, step: StepInput, rows: torch.Tensor
    ) -> None:
        """Store the rows of the step's positions (``rows[j]`` at ``step.start + j``).

        Default: the rows in the page's one part, rounded to its dtype.
        """
        layer.write(step.block_table, step.start, rows, who=step.who)

    def load_rows(
        self, spec: KVCacheSpec, layer: CacheLayer, step: StepInput, start: int, stop: int
    ) -> torch.Tensor:
        """The stored rows of positions ``[start, stop)``, as float64.

        Returns ``(stop - start, heads, width)``. Default: read back from the
        page's one part.
        """
        return layer.read(step.block_table, start, stop, who=step.who)

    def stored(self, spec: KVCacheSpec, rows: torch.Tensor) -> torch.Tensor:
        """What the cache gives back for ``rows``, computed without a cache (the dense path).

        Must equal, bit for bit, what :meth:`load_rows` returns after
        :meth:`store_rows` stored ``rows``. Default: ``rows`` rounded to the
        page's dtype (:func:`round_to`).
        """
        return round_to(rows, _dtype(spec))

    def extra_rows(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput
    ) -> torch.Tensor | None:
        """Rows read before the visible positions, from the cache (default: none)."""
        return None

    def dense_extra_rows(self, spec: KVCacheSpec, params: Params) -> torch.Tensor | None:
        """The same rows as :meth:`extra_rows`, without a cache (default: none)."""
        return None

    def begin(self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput) -> None:
        """Store the new positions' rows."""
        rows = torch.stack([self.token_row(spec, params, x) for x in step.x])
        self.store_rows(spec, layer, step, rows)

    def finish(
        self, spec: KVCacheSpec, params: Params, layer: CacheLayer, step: StepInput, carry: Any
    ) -> torch.Tensor:
        """Gather the visible rows once, then compute position by position."""
        start = step.start
        low = self.first_visible(spec, start)
        gathered = self.load_rows(spec, layer, step, low, start + step.num_tokens)
        extra = self.extra_rows(spec, params, layer, step)
        outputs = []
        for offset, x in enumerate(step.x):
            position = start + offset
            first = self.first_visible(spec, position)
            rows = gathered[first - low : position + 1 - low]
            if extra is not None:
                rows = torch.cat([extra, rows])
            outputs.append(self.read_out(spec, params, x, rows))
        return torch.stack(outputs)

    def dense(
        self,
        spec: KVCacheSpec,
        params: Params,
        x: torch.Tensor,
        encoder_states: torch.Tensor | None,
    ) -> torch.Tensor:
        """Every position's output from a contiguous tensor of all rows."""
        all_rows = self.stored(spec, torch.stack([self.token_row(spec, params, xt) for xt in x]))
        extra = self.dense_extra_rows(spec, params)
        outputs = []
        for position, xt in enumerate(x):
            rows = all_rows[self.first_visible(spec, position) : position + 1]
            if extra is not None:
                rows = torch.cat([extra, rows])
            outputs.append(self.read_out(spec, params, xt, rows))
        return torch.stack(outputs)


def _attention_spec(spec: KVCacheSpec, kernel: object) -> AttentionSpec:
    if not isinstance(spec, AttentionSpec):
        msg = f"{type(kernel).__name__} serves attention specs, got {type(spec).__name__}"
        raise TypeError(msg)
    return spec


def _dtype(spec: KVCacheSpec) -> str:
    parts = spec.page_parts()
    return parts[0].dtype
