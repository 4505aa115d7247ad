"""A ``transformers.Cache`` whose keys, values and states live in kvcore's blocks.

One :class:`KVCoreCache` serves one forward pass of a batch of requests
(:class:`StepRow`): each row computes ``num_tokens`` positions from ``start``.
transformers calls ``update`` once per attention layer; the cache writes the
new keys and values into the slots the manager's block tables give, then
reads back, through the same tables, exactly the positions the layer reads
(its spec's :meth:`~kvcore.specs.KVCacheSpec.positions_read`, plus the new
ones). Recurrent layers (conv and recurrent states) read the state after the
row's computed tokens from its block and write the new state into the block
of the step's last position.

transformers sizes a layer's attention mask from the cache
(``get_mask_sizes``: one key length and offset for the whole batch) and its
position ids from ``get_seq_length`` (one past length), and a recurrent layer
asks whether *the layer* has a previous state, not each row. So a forward of
more than one row needs rows of the same length, all continuing (decode),
and the caller passes the position ids and per-layer-type masks itself
(:func:`~kvcore.integrations.transformers.generate` does, for decode steps);
a single row needs nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DummyLayer,
    LinearAttentionCacheLayerMixin,
)

from kvcore import paging
from kvcore.errors import InvalidConfigError, InvalidRequestError
from kvcore.integrations.transformers._paged import LayerSlot, PagedModelCache
from kvcore.specs import KVCacheSpec

__all__ = ["KVCoreCache", "KVCoreCrossCache", "StepRow"]


@attrs.frozen(kw_only=True)
class StepRow:
    """One request's share of a forward pass.

    Attributes:
        request_id: The request (its block tables are the manager's).
        start: Positions already computed (the request's
            ``num_computed_tokens`` before the step).
        num_tokens: Positions this forward computes, from ``start``.
        num_encoder_tokens: Encoder positions (encoder-decoder models).
    """

    request_id: str
    start: int
    num_tokens: int
    num_encoder_tokens: int = 0


@attrs.frozen
class _Addresses:
    """Where a layer's rows go and come from in one forward, checked once per group."""

    write_blocks: torch.Tensor
    write_offsets: torch.Tensor
    read_blocks: torch.Tensor
    read_offsets: torch.Tensor
    dest_rows: torch.Tensor
    dest_cols: torch.Tensor
    lengths: tuple[int, ...]
    firsts: tuple[int, ...]


def _contiguous_first(reads: Sequence[range], start: int) -> int:
    if len(reads) > 1:
        msg = (
            f"the layer reads {len(reads)} separate spans before position {start} "
            f"({reads!r}); transformers' cache interface gives a layer one contiguous span "
            "of keys (get_mask_sizes: one length and offset), so this type cannot run here"
        )
        raise InvalidConfigError(msg)
    return reads[0].start if reads else start


class _Rows:
    """The per-forward addressing shared by a cache's layers (one table per group)."""

    def __init__(self, paged: PagedModelCache, rows: Sequence[StepRow]) -> None:
        if not rows:
            msg = "a forward needs at least one StepRow"
            raise InvalidRequestError(msg)
        self.paged = paged
        self.rows = tuple(rows)
        self.ids = [row.request_id for row in rows]
        self.device = paged.device
        self._tables: dict[int, torch.Tensor] = {}
        self._attention: dict[tuple[int, KVCacheSpec], _Addresses] = {}
        self._states: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self._cross: dict[int, _Addresses] = {}

    def table(self, group_id: int) -> torch.Tensor:
        if group_id not in self._tables:
            manager = self.paged.manager
            self._tables[group_id] = paging.block_table_tensor(
                manager, self.ids, group_id, device=self.device
            )
        return self._tables[group_id]

    def _blocks(self, group_id: int, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        block_size = self.paged.block_sizes[group_id]
        num_blocks = self.paged.plan.kv_cache_config.num_blocks
        return paging.block_ids(
            self.table(group_id),
            positions.to(self.device),
            block_size,
            rows=rows.to(self.device),
            num_blocks=num_blocks,
        )

    def _addresses(self, group_id: int, spans: Sequence[tuple[range, range]]) -> _Addresses:
        """Addresses for rows writing ``spans[r][0]`` and reading ``spans[r][1]``."""
        block_size = self.paged.block_sizes[group_id]
        writes, reads, write_rows, read_rows, cols = [], [], [], [], []
        for index, (written, read) in enumerate(spans):
            writes.append(paging.positions_tensor((written,)))
            reads.append(paging.positions_tensor((read,)))
            write_rows.append(torch.full((len(written),), index, dtype=torch.int64))
            read_rows.append(torch.full((len(read),), index, dtype=torch.int64))
            cols.append(torch.arange(len(read), dtype=torch.int64))
        write_pos, read_pos = torch.cat(writes), torch.cat(reads)
        write_row, read_row = torch.cat(write_rows), torch.cat(read_rows)
        device = self.device
        return _Addresses(
            write_blocks=self._blocks(group_id, write_pos, write_row),
            write_offsets=torch.remainder(write_pos, block_size).to(device),
            read_blocks=self._blocks(group_id, read_pos, read_row),
            read_offsets=torch.remainder(read_pos, block_size).to(device),
            dest_rows=read_row.to(device),
            dest_cols=torch.cat(cols).to(device),
            lengths=tuple(len(read) for _, read in spans),
            firsts=tuple(read.start for _, read in spans),
        )

    def attention(self, slot: LayerSlot) -> _Addresses:
        key = (slot.group_id, slot.computes)
        if key not in self._attention:
            spans = []
            for row in self.rows:
                stop = row.start + row.num_tokens
                first = _contiguous_first(slot.computes.positions_read(row.start, stop), row.start)
                spans.append((range(row.start, stop), range(first, stop)))
            self._attention[key] = self._addresses(slot.group_id, spans)
        return self._attention[key]

    def cross(self, slot: LayerSlot) -> _Addresses:
        if slot.group_id not in self._cross:
            spans = []
            for row in self.rows:
                if row.num_encoder_tokens < 1:
                    msg = (
                        f"request {row.request_id!r} reaches a cross-attention layer with no "
                        "encoder tokens; give StepRow.num_encoder_tokens"
                    )
                    raise InvalidRequestError(msg)
                encoder = range(row.num_encoder_tokens)
                spans.append((encoder, encoder))
            self._cross[slot.group_id] = self._addresses(slot.group_id, spans)
        return self._cross[slot.group_id]

    def states(self, slot: LayerSlot) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The blocks holding each row's state before the step (``None``: fresh) and after."""
        group_id = slot.group_id
        if group_id not in self._states:
            rows = torch.arange(len(self.rows), dtype=torch.int64)
            starts = torch.tensor([row.start for row in self.rows], dtype=torch.int64)
            stops = starts + torch.tensor([row.num_tokens for row in self.rows])
            after = self._blocks(group_id, stops - 1, rows)
            before = None if int(starts[0]) == 0 else self._blocks(group_id, starts - 1, rows)
            self._states[group_id] = (before, after)
        return self._states[group_id]


def _check_row_shape(
    slot: LayerSlot, view: torch.Tensor, shape: tuple[int, ...], what: str
) -> None:
    if tuple(view.shape[2:]) != shape:
        msg = (
            f"layer {slot.name!r}: transformers hands over {what} rows of shape {shape}, but "
            f"the plan gives the layer rows of {tuple(view.shape[2:])}; the model's config "
            "and its modules disagree (plan from this model: plan_model(model, ...))"
        )
        raise InvalidConfigError(msg)


class _AttentionLayer(CacheLayerMixin):
    """An attention layer's keys and values, in its group's blocks."""

    is_croppable = False

    def __init__(self, rows: _Rows, slot: LayerSlot) -> None:
        super().__init__()
        self._rows = rows
        self.slot = slot
        self.is_sliding = not type(slot.computes).attends_to_all_tokens
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the blocks exist."""

    def _gather(self, addresses: _Addresses, key_width: int) -> tuple[torch.Tensor, torch.Tensor]:
        view = self.slot.views[0]
        got = view[addresses.read_blocks, addresses.read_offsets]
        if len(addresses.lengths) == 1:
            out = got[None]
        else:
            out = got.new_zeros((len(addresses.lengths), max(addresses.lengths), *got.shape[1:]))
            out[addresses.dest_rows, addresses.dest_cols] = got
        out = out.transpose(1, 2)
        return out[..., :key_width].contiguous(), out[..., key_width:].contiguous()

    def _store(self, addresses: _Addresses, key: torch.Tensor, value: torch.Tensor) -> None:
        batch, heads, count, _ = key.shape
        if batch != len(addresses.lengths) or count * batch != len(addresses.write_blocks):
            msg = (
                f"layer {self.slot.name!r}: transformers hands over {batch} rows of {count} "
                f"positions, but the forward was set up for {len(addresses.lengths)} rows and "
                f"{len(addresses.write_blocks)} positions in all"
            )
            raise InvalidRequestError(msg)
        rows = torch.cat([key, value], dim=-1).transpose(1, 2).reshape(batch * count, heads, -1)
        view = self.slot.views[0]
        _check_row_shape(self.slot, view, tuple(rows.shape[1:]), "key and value")
        view[addresses.write_blocks, addresses.write_offsets] = rows.to(view.dtype)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions, return every position the layer reads, in order."""
        addresses = self._rows.attention(self.slot)
        self._store(addresses, key_states, value_states)
        return self._gather(addresses, key_states.shape[-1])

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(keys returned, first position)`` of the one row (a batch passes its own masks)."""
        addresses = self._rows.attention(self.slot)
        if len(addresses.lengths) != 1:
            msg = (
                "a forward of several rows cannot size its mask from the cache (each row has "
                "its own length): pass the attention masks and position ids explicitly"
            )
            raise InvalidRequestError(msg)
        return addresses.lengths[0], addresses.firsts[0]

    def get_seq_length(self) -> int:
        """Positions computed before this forward (the same for every row)."""
        return _common_start(self._rows)

    def get_max_length(self) -> int:
        """-1: the cache holds whatever the manager allocates."""
        return -1


def _common_start(rows: _Rows) -> int:
    starts = {row.start for row in rows.rows}
    if len(starts) != 1:
        msg = (
            f"the rows of this forward start at different positions ({sorted(starts)}); "
            "pass position ids and masks explicitly instead of asking the cache"
        )
        raise InvalidRequestError(msg)
    return starts.pop()


class _StateLayer(LinearAttentionCacheLayerMixin):
    """A recurrent layer's conv and recurrent states, one per block of its group.

    kvcore keeps the last ``K - 1`` convolution inputs (what the next output
    needs); transformers hands a window of ``K``, whose oldest column no kept
    output reads, so it is given back as zeros.
    """

    def __init__(self, rows: _Rows, slot: LayerSlot) -> None:
        super().__init__(number_of_states=1)
        self._rows = rows
        self.slot = slot
        self._conv: torch.Tensor | None = None
        self._conv_out: torch.Tensor | None = None
        before, _ = rows.states(slot)
        self.previous = before is not None
        self.has_previous_state = {0: self.previous}

    def lazy_initialization(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to allocate: the blocks exist."""

    def update_conv_state(
        self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """As :meth:`conv_update` (the mixin's name for it)."""
        return self.conv_update(conv_states, kwargs.get("conv_kernel_size"))

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """As :meth:`recurrent_update` (the mixin's name for it)."""
        return self.recurrent_update(recurrent_states)

    def conv_state(self) -> torch.Tensor | None:
        """The stored inputs, ``(rows, channels, K)``, or ``None`` before the first token."""
        before, _ = self._rows.states(self.slot)
        if before is None:
            return None
        stored = self.slot.views[0][before]  # (rows, K - 1, channels)
        window = torch.nn.functional.pad(stored.transpose(1, 2), (1, 0))
        self._conv = window
        return window

    def conv_update(self, conv_states: torch.Tensor, kernel_size: int | None) -> torch.Tensor:
        """What the convolution reads: the stored inputs, then the new ones."""
        view = self.slot.views[0]
        taps = view.shape[1] + 1
        if kernel_size is not None and kernel_size != taps:
            msg = (
                f"layer {self.slot.name!r}: the model's convolution has {kernel_size} taps, the "
                f"plan keeps {taps - 1} inputs for {taps}"
            )
            raise InvalidConfigError(msg)
        if view.shape[2] != conv_states.shape[1]:
            msg = (
                f"layer {self.slot.name!r}: transformers hands over a convolution of "
                f"{conv_states.shape[1]} channels, the plan keeps {view.shape[2]}; the model's "
                "config and its modules disagree (plan from this model: plan_model(model, ...))"
            )
            raise InvalidConfigError(msg)
        if self.previous:
            window = self._conv if self._conv is not None else self.conv_state()
            assert window is not None
            full = torch.cat([window, conv_states], dim=-1)
        else:
            full = conv_states
            if full.shape[-1] < taps:
                full = torch.nn.functional.pad(full, (taps - full.shape[-1], 0))
        self._conv_out = full[..., -(taps - 1) :]
        return full

    def recurrent_state(self) -> torch.Tensor | None:
        """The stored state, ``(rows, *shape)``, or ``None`` before the first token."""
        before, _ = self._rows.states(self.slot)
        return None if before is None else self.slot.views[1][before].clone()

    def recurrent_update(self, state: torch.Tensor) -> torch.Tensor:
        """Store the state after the step, and the convolution inputs with it."""
        _, after = self._rows.states(self.slot)
        views = self.slot.views
        if tuple(views[1].shape[1:]) != tuple(state.shape[1:]):
            msg = (
                f"layer {self.slot.name!r}: transformers hands over a recurrent state of shape "
                f"{tuple(state.shape[1:])}, the plan keeps {tuple(views[1].shape[1:])}; the "
                "model's config and its modules disagree"
            )
            raise InvalidConfigError(msg)
        views[1][after] = state.to(views[1].dtype)
        tail = self._conv_out
        if tail is None and self._conv is not None:  # updated in place by a decode kernel
            tail = self._conv[..., 1:]
        if tail is not None:
            views[0][after] = tail.transpose(1, 2).to(views[0].dtype)
        self._conv = self._conv_out = None
        return state


class _CrossLayer(CacheLayerMixin):
    """A cross-attention layer's encoder keys and values, in its group's blocks."""

    is_croppable = False
    is_sliding = False

    def __init__(self, rows: _Rows, slot: LayerSlot, written: bool) -> None:
        super().__init__()
        self._rows = rows
        self.slot = slot
        self.written = written
        self.is_initialized = True
        self._attention = _AttentionLayer(rows, slot)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the blocks exist."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the encoder's keys and values once; return them read back."""
        addresses = self._rows.cross(self.slot)
        self._attention._store(addresses, key_states, value_states)
        self.written = True
        return self._attention._gather(addresses, key_states.shape[-1])

    def _read(self) -> tuple[torch.Tensor, torch.Tensor]:
        width = self.slot.spec.head_size  # type: ignore[attr-defined]
        return self._attention._gather(self._rows.cross(self.slot), width)

    @property
    def keys(self) -> torch.Tensor:
        """The encoder keys, read back from the blocks (transformers reuses them)."""
        return self._read()[0]

    @keys.setter
    def keys(self, value: object) -> None:
        pass  # the base class initialises it; the blocks are the storage

    @property
    def values(self) -> torch.Tensor:
        """The encoder values, read back from the blocks."""
        return self._read()[1]

    @values.setter
    def values(self, value: object) -> None:
        pass

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """Every encoder position."""
        return self._rows.rows[0].num_encoder_tokens, 0

    def get_seq_length(self) -> int:
        """The encoder positions once written, else 0."""
        return self._rows.rows[0].num_encoder_tokens if self.written else 0

    def get_max_length(self) -> int:
        """-1: no limit of its own."""
        return -1


class KVCoreCache(Cache):
    """The self-attention and state cache of one forward pass, in kvcore's blocks.

    Args:
        paged: The model's paged cache.
        rows: The requests of the forward and their positions. Their slots
            must be allocated (``allocate_slots``) before the forward.

    Raises:
        PagedAccessError: a position the forward writes or a layer reads has
            no block (not allocated, freed, or padding).
        InvalidRequestError: rows that a model with recurrent layers cannot
            run together (some fresh, some continuing).
    """

    def __init__(self, paged: PagedModelCache, rows: Sequence[StepRow]) -> None:
        self._rows = _Rows(paged, rows)
        if paged.state_group_ids and len({row.start == 0 for row in rows}) > 1:
            msg = (
                "a recurrent layer has one previous-state flag for all rows: run requests "
                "starting fresh and requests continuing in separate forwards"
            )
            raise InvalidRequestError(msg)
        layers: list[Any] = []
        for index in range(paged.num_layers):
            slot = paged.self_layers.get(index)
            if slot is None:
                layers.append(DummyLayer())
            elif slot.state:
                layers.append(_StateLayer(self._rows, slot))
            else:
                layers.append(_AttentionLayer(self._rows, slot))
        super().__init__(layers=layers)

    @property
    def rows(self) -> tuple[StepRow, ...]:
        """The forward's rows."""
        return self._rows.rows

    def _state_layer(self, layer_idx: int) -> _StateLayer:
        layer = self.layers[layer_idx]
        if not isinstance(layer, _StateLayer):
            msg = f"layer {layer_idx} holds no recurrent state in the plan"
            raise InvalidConfigError(msg)
        return layer

    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """The convolution inputs kept for each row, or ``None`` when the rows start fresh."""
        return self._state_layer(layer_idx).conv_state()

    def update_conv_state(
        self, conv_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """What the convolution reads for the new inputs; their tail is stored with the state."""
        return self._state_layer(layer_idx).conv_update(conv_states, kwargs.get("conv_kernel_size"))

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        """The recurrent state after each row's computed tokens, or ``None`` when fresh."""
        return self._state_layer(layer_idx).recurrent_state()

    def update_recurrent_state(
        self, recurrent_states: torch.Tensor, layer_idx: int, state_idx: int = 0, **kwargs: Any
    ) -> torch.Tensor:
        """Store each row's state after the step in the block of its last position."""
        return self._state_layer(layer_idx).recurrent_update(recurrent_states)

    def has_previous_state(
        self, layer_idx: int | None = None, state_idx: int | None = None
    ) -> bool:
        """Whether the rows continue (a state is stored) or start fresh."""
        return not any(row.start == 0 for row in self.rows)


class KVCoreCrossCache(Cache):
    """The cross-attention cache of one forward pass (encoder keys and values) in kvcore.

    Pair it with a :class:`KVCoreCache` in a transformers
    ``EncoderDecoderCache(self_cache, cross_cache)``.

    Args:
        paged: The model's paged cache.
        rows: The forward's rows (one; with ``num_encoder_tokens``).
        written: The encoder's keys and values were stored by an earlier
            forward of the request (transformers then reuses them).
    """

    def __init__(self, paged: PagedModelCache, rows: Sequence[StepRow], *, written: bool) -> None:
        self._rows = _Rows(paged, rows)
        layers: list[Any] = []
        for index in range(paged.num_layers):
            slot = paged.cross_layers.get(index)
            layers.append(DummyLayer() if slot is None else _CrossLayer(self._rows, slot, written))
        super().__init__(layers=layers)
