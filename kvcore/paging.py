"""From block tables to tensors: what every engine's model runner computes.

A :class:`~kvcore.KVCacheManager` answers with block tables, one list of block
ids per request and KV cache group. A model runner turns them into the
addresses its kernels use. Position ``p`` of a request lives in slot
``p % block_size`` of block ``table[p // block_size]`` of every layer of the
group; these helpers do that arithmetic on tensors, for a whole batch, and
check it:

* :func:`block_table_tensor`: a batch's tables of one group as one padded
  ``int32`` tensor (padding is the null block, which nothing may read).
* :func:`slot_mapping`: the flat slot ``block * block_size + offset`` of each
  position, for kernels that take a slot mapping.
* :func:`block_ids`: the block holding each position (states are stored per
  block: a Mamba layer's state after ``n`` tokens lives in the block of
  position ``n - 1``).
* :func:`gather` / :func:`scatter`: read or write one layer's rows at some
  positions through the tables, on the layer's view as
  :func:`kvcore.allocate_kv_cache` makes it (strided views of padded pages
  included: nothing is flattened or copied but the rows themselves).
* :func:`positions_tensor`: the positions of a spec's
  :meth:`~kvcore.specs.KVCacheSpec.positions_read` ranges as a tensor.
* :func:`layer_groups`: which group holds each of a model's layers, under the
  model's own module names.

Every check raises :class:`~kvcore.errors.PagedAccessError` naming the row,
the position and the block: a position past its table, a null block (freed
by the manager, never kept, or padding) or a block outside the pool. The
checks read the tensors' values, which synchronises a GPU; pass
``check=False`` on a hot path whose tables are known good.

This module imports torch; importing :mod:`kvcore` does not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

import torch

from kvcore._config import KVCacheConfig
from kvcore.errors import InvalidConfigError, InvalidRequestError, PagedAccessError
from kvcore.managers import NULL_BLOCK

__all__ = [
    "BlockTableSource",
    "block_table_tensor",
    "slot_mapping",
    "block_ids",
    "gather",
    "scatter",
    "positions_tensor",
    "layer_groups",
]


class BlockTableSource(Protocol):
    """Anything that hands out a request's block tables (a :class:`~kvcore.KVCacheManager`)."""

    def get_block_ids(self, request_id: str) -> Sequence[Sequence[int]]:
        """The request's block ids, one list per KV cache group."""
        ...


def block_table_tensor(
    manager: BlockTableSource,
    request_ids: Sequence[str],
    group_id: int,
    *,
    width: int | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The block tables of ``request_ids`` in one group, as one ``(rows, width)`` ``int32`` tensor.

    Row ``i`` is ``manager.get_block_ids(request_ids[i])[group_id]``, padded on
    the right with the null block (id 0), which :func:`gather`,
    :func:`scatter`, :func:`slot_mapping` and :func:`block_ids` refuse to
    address. The tensor is built on the CPU and moved to ``device`` once.

    Args:
        manager: Where the tables come from.
        request_ids: The batch, one row each, in order (may be empty).
        group_id: The KV cache group.
        width: Columns; default the longest table (at least 1).
        device: Where the tensor goes (default the CPU).

    Raises:
        InvalidRequestError: ``group_id`` is not a group of the tables, or a
            table is longer than ``width``.
    """
    rows = []
    for request_id in request_ids:
        tables = manager.get_block_ids(request_id)
        if not 0 <= group_id < len(tables):
            msg = (
                f"group_id {group_id} is not a KV cache group of request {request_id!r}, "
                f"which has {len(tables)} block tables"
            )
            raise InvalidRequestError(msg)
        rows.append(tables[group_id])
    longest = max((len(row) for row in rows), default=0)
    columns = max(longest, 1) if width is None else width
    if longest > columns:
        msg = (
            f"width={columns} is shorter than a block table of the batch ({longest} blocks); "
            "give a larger width or leave it unset"
        )
        raise InvalidRequestError(msg)
    table = torch.full((len(rows), columns), NULL_BLOCK, dtype=torch.int32)
    for index, row in enumerate(rows):
        if row:
            table[index, : len(row)] = torch.as_tensor(row, dtype=torch.int32)
    return table if device is None else table.to(device)


def _as_rows(
    block_table: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(tables, rows)`` with a 2-D table and one row index per position."""
    if positions.dim() != 1 or positions.dtype.is_floating_point:
        msg = (
            "positions must be a 1-D integer tensor, got shape "
            f"{tuple(positions.shape)} of {positions.dtype}"
        )
        raise InvalidRequestError(msg)
    if block_table.dim() == 1:
        if rows is not None:
            msg = "rows is given for a 1-D block table (one request); pass a 2-D batch table"
            raise InvalidRequestError(msg)
        return block_table[None], torch.zeros_like(positions)
    if block_table.dim() != 2:
        msg = f"block_table must be 1-D (one request) or 2-D (a batch), got {block_table.dim()}-D"
        raise InvalidRequestError(msg)
    if rows is None:
        if block_table.shape[0] != 1:
            msg = (
                f"a batch table of {block_table.shape[0]} rows needs rows= (the row of each "
                "position)"
            )
            raise InvalidRequestError(msg)
        return block_table, torch.zeros_like(positions)
    if rows.shape != positions.shape:
        msg = (
            f"rows has shape {tuple(rows.shape)}, positions {tuple(positions.shape)}; give "
            "one row per position"
        )
        raise InvalidRequestError(msg)
    return block_table, rows


def block_ids(
    block_table: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    *,
    rows: torch.Tensor | None = None,
    num_blocks: int | None = None,
    check: bool = True,
) -> torch.Tensor:
    """The block holding each position: ``table[row, position // block_size]``, ``int64``.

    Args:
        block_table: One request's table (1-D) or a batch's
            (:func:`block_table_tensor`, 2-D).
        positions: Token positions, 1-D integers.
        block_size: Tokens per block of the table's group.
        rows: With a batch table, the row of each position.
        num_blocks: Blocks in the pool; with it, ids at or past it are refused.
        check: Check every position (see the module documentation).

    Raises:
        PagedAccessError: a position is negative or past its table, or its
            block is the null block or outside the pool.
        InvalidRequestError: the arguments' shapes do not fit together.
    """
    tables, row_ids = _as_rows(block_table, positions, rows)
    positions = positions.to(torch.int64)
    index = torch.div(positions, block_size, rounding_mode="floor")
    row_ids = row_ids.to(device=tables.device, dtype=torch.int64)
    index = index.to(tables.device)
    batch = block_table.dim() == 2
    if check:
        _check_index(tables, row_ids, index, positions, batch)
    blocks = tables[row_ids, index].to(torch.int64)
    if check:
        _check_blocks(blocks, row_ids, positions, num_blocks, batch)
    return blocks


def _where(rows: torch.Tensor, positions: torch.Tensor, at: int, batch: bool) -> str:
    row = f"row {int(rows[at])}: " if batch else ""
    return f"{row}position {int(positions[at])}"


def _check_index(
    tables: torch.Tensor,
    rows: torch.Tensor,
    index: torch.Tensor,
    positions: torch.Tensor,
    batch: bool,
) -> None:
    bad = (index < 0) | (index >= tables.shape[1])
    if bool(bad.any()):
        at = int(torch.nonzero(bad)[0])
        msg = (
            f"{_where(rows, positions, at, batch)} is in block "
            f"{int(index[at])} of its block table, which has {tables.shape[1]} entries: "
            "allocate slots for it first"
        )
        raise PagedAccessError(msg)


def _check_blocks(
    blocks: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    num_blocks: int | None,
    batch: bool,
) -> None:
    null = blocks == NULL_BLOCK
    if bool(null.any()):
        at = int(torch.nonzero(null)[0])
        msg = (
            f"{_where(rows, positions, at, batch)} is in the null block: the "
            "manager freed it (outside the layer's window or chunk), never kept it, or the "
            "row is padding; read only what the layer's spec reads (positions_read)"
        )
        raise PagedAccessError(msg)
    if num_blocks is not None:
        outside = blocks >= num_blocks
        if bool(outside.any()):
            at = int(torch.nonzero(outside)[0])
            msg = (
                f"{_where(rows, positions, at, batch)} is in block "
                f"{int(blocks[at])}, outside the pool's {num_blocks} blocks"
            )
            raise PagedAccessError(msg)


def slot_mapping(
    block_table: torch.Tensor,
    positions: torch.Tensor,
    block_size: int,
    *,
    rows: torch.Tensor | None = None,
    num_blocks: int | None = None,
    check: bool = True,
) -> torch.Tensor:
    """The flat slot of each position, ``block * block_size + position % block_size``, ``int64``.

    The addresses of kernels that take a slot mapping (the row of a cache
    viewed as ``(num_blocks * block_size, ...)``). Arguments and errors as
    :func:`block_ids`.
    """
    blocks = block_ids(
        block_table, positions, block_size, rows=rows, num_blocks=num_blocks, check=check
    )
    offsets = torch.remainder(positions.to(torch.int64), block_size).to(blocks.device)
    return blocks * block_size + offsets


def _split(
    view: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor | None,
    check: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    if view.dim() < 2:
        msg = f"view must be (num_blocks, block_size, ...), got shape {tuple(view.shape)}"
        raise InvalidRequestError(msg)
    block_size = view.shape[1]
    blocks = block_ids(
        block_table, positions, block_size, rows=rows, num_blocks=view.shape[0], check=check
    ).to(view.device)
    offsets = torch.remainder(positions.to(torch.int64), block_size).to(view.device)
    return blocks, offsets


def gather(
    view: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    check: bool = True,
) -> torch.Tensor:
    """The rows of ``positions`` in one layer's view, as a new ``(len(positions), ...)`` tensor.

    Args:
        view: The layer's view, ``(num_blocks, block_size, ...)`` (one page
            part of :func:`kvcore.allocate_kv_cache`'s views); its second
            axis is the block size.
        block_table: One request's table (1-D) or a batch's (2-D).
        positions: The positions to read, 1-D integers, in the order wanted.
        rows: With a batch table, the row of each position.
        check: Check every position (see the module documentation).

    Raises:
        PagedAccessError: as :func:`block_ids`.
    """
    blocks, offsets = _split(view, block_table, positions, rows, check)
    return view[blocks, offsets]


def scatter(
    view: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    values: torch.Tensor,
    *,
    rows: torch.Tensor | None = None,
    check: bool = True,
) -> None:
    """Store ``values[i]`` at ``positions[i]`` of one layer's view (cast to the view's dtype).

    Arguments as :func:`gather`; ``values`` is ``(len(positions), ...)`` with
    the view's row shape.

    Raises:
        PagedAccessError: as :func:`block_ids`; nothing is written then.
        InvalidRequestError: ``values`` does not have one row per position.
    """
    if values.shape[:1] != positions.shape:
        msg = (
            f"values has {values.shape[0] if values.dim() else 0} rows for "
            f"{positions.numel()} positions; give one row per position"
        )
        raise InvalidRequestError(msg)
    blocks, offsets = _split(view, block_table, positions, rows, check)
    view[blocks, offsets] = values.to(device=view.device, dtype=view.dtype)


def positions_tensor(
    ranges: Iterable[range], *, device: torch.device | str | None = None
) -> torch.Tensor:
    """The positions of ``ranges``, in order, as one ``int64`` tensor.

    For :meth:`~kvcore.specs.KVCacheSpec.positions_read` plus a step's own
    positions: ``positions_tensor((*spec.positions_read(start, stop),
    range(start, stop)))``.
    """
    pieces = [torch.arange(r.start, r.stop, dtype=torch.int64) for r in ranges if len(r)]
    if not pieces:
        return torch.empty(0, dtype=torch.int64, device=device)
    joined = torch.cat(pieces)
    return joined if device is None else joined.to(device)


#: The prefix kvcore's planned layer names start with: planning names a layer
#: after its module in a Hugging Face model (``model.layers.3.self_attn``).
PLANNED_PREFIX = "model."


def layer_groups(
    config: KVCacheConfig,
    *,
    prefix: str = PLANNED_PREFIX,
    model_prefix: str | None = None,
) -> dict[str, int]:
    """Every planned layer, renamed for the model, and the KV cache group holding it.

    Planning names layers after their modules in a Hugging Face model
    (``model.layers.3.self_attn``, ``model.decoder.layers.0.encoder_attn``).
    A model whose decoder sits under another path (a multimodal wrapper:
    ``model.language_model.layers.3.self_attn``) gets its own names by
    replacing ``prefix`` with ``model_prefix``.

    Args:
        config: The planned config (``plan.kv_cache_config``).
        prefix: What every planned name starts with.
        model_prefix: What it is replaced with; default ``prefix`` (unchanged).

    Returns:
        Layer name (the model's) → group id, in the config's group order.

    Raises:
        InvalidConfigError: a planned name does not start with ``prefix``.
    """
    target = prefix if model_prefix is None else model_prefix
    groups: dict[str, int] = {}
    for group_id, group in enumerate(config.kv_cache_groups):
        for name in group.layer_names:
            if not name.startswith(prefix):
                msg = (
                    f"planned layer {name!r} does not start with prefix {prefix!r}; give the "
                    "prefix the planned names share"
                )
                raise InvalidConfigError(msg)
            groups[target + name.removeprefix(prefix)] = group_id
    return groups
