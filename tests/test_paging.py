"""kvcore.paging: block tables to tensors, and the positions each spec's layer reads."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import kvcore
from kvcore import paging
from kvcore.errors import InvalidConfigError, InvalidRequestError, PagedAccessError
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

ATTENTION = {"num_kv_heads": 1, "head_size": 2, "dtype": "float32"}


def test_slot_mapping_by_hand():
    # Block size 4, table [3, 0, 5]: position 1 is slot 3*4+1, position 9 slot 5*4+1.
    table = torch.tensor([3, 0, 5], dtype=torch.int32)
    slots = paging.slot_mapping(table, torch.tensor([0, 1, 3, 8, 9]), 4)
    assert slots.tolist() == [12, 13, 15, 20, 21]
    assert slots.dtype == torch.int64


def test_a_batch_table_is_padded_with_the_null_block_and_indexed_by_row():
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(11, [FullAttentionSpec(block_size=4, **ATTENTION)]), 64
    )
    a, b = kvcore.Request("a", list(range(9))), kvcore.Request("b", list(range(3)))
    manager.allocate_slots(a, 9)
    manager.allocate_slots(b, 3)
    table = paging.block_table_tensor(manager, ["a", "b"], 0)
    assert table.dtype == torch.int32
    assert table.tolist() == [manager.get_block_ids("a")[0], manager.get_block_ids("b")[0] + [0, 0]]
    positions, rows = torch.tensor([8, 2]), torch.tensor([0, 1])
    slots = paging.slot_mapping(table, positions, 4, rows=rows)
    assert slots.tolist() == [table[0, 2] * 4 + 0, table[1, 0] * 4 + 2]
    with pytest.raises(PagedAccessError, match="row 1: position 4 is in the null block"):
        paging.slot_mapping(table, torch.tensor([4]), 4, rows=torch.tensor([1]))
    with pytest.raises(InvalidRequestError, match="width=2 is shorter than a block table"):
        paging.block_table_tensor(manager, ["a"], 0, width=2)
    with pytest.raises(InvalidRequestError, match="group_id 1 is not a KV cache group"):
        paging.block_table_tensor(manager, ["a"], 1)


def test_positions_past_the_table_or_outside_the_pool_are_refused():
    table = torch.tensor([3, 5], dtype=torch.int32)
    with pytest.raises(PagedAccessError, match="position 8 is in block 2 of its block table"):
        paging.block_ids(table, torch.tensor([8]), 4)
    with pytest.raises(PagedAccessError, match="outside the pool's 4 blocks"):
        paging.block_ids(table, torch.tensor([5]), 4, num_blocks=4)
    with pytest.raises(InvalidRequestError, match="needs rows="):
        paging.block_ids(torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0]), 4)


def test_gather_and_scatter_go_through_the_table_on_a_strided_view():
    # A padded page: each block is 12 floats, the layer's rows use 8 of them (4 x 2).
    buffer = torch.full((6, 12), float("nan"))
    view = buffer.as_strided((6, 4, 2), (12, 2, 1))
    table = torch.tensor([4, 1], dtype=torch.int32)
    values = torch.arange(10.0).reshape(5, 2)
    paging.scatter(view, table, torch.arange(2, 7), values)
    assert torch.equal(buffer[4, 4:8], torch.tensor([0.0, 1, 2, 3]))
    assert torch.equal(buffer[1, 0:6], torch.tensor([4.0, 5, 6, 7, 8, 9]))
    assert torch.isnan(buffer[4, 8:]).all()  # the padding is untouched
    assert torch.equal(paging.gather(view, table, torch.tensor([6, 2])), values[[4, 0]])


def test_layer_groups_rename_the_planned_prefix():
    plan = kvcore.plan("gemma-3-27b", memory="1GiB", max_model_len=1024)
    groups = paging.layer_groups(plan.kv_cache_config)
    assert groups["model.layers.5.self_attn"] == plan.kv_cache_config.group_of(
        "model.layers.5.self_attn"
    )
    renamed = paging.layer_groups(plan.kv_cache_config, model_prefix="model.language_model.")
    assert renamed["model.language_model.layers.5.self_attn"] == groups["model.layers.5.self_attn"]
    assert len(renamed) == len(groups) == 62
    with pytest.raises(InvalidConfigError, match=r"does not start with prefix 'decoder\.'"):
        paging.layer_groups(plan.kv_cache_config, prefix="decoder.")


def test_positions_read_by_hand():
    window = SlidingWindowSpec(block_size=4, sliding_window=5, **ATTENTION)
    # A step computing [10, 13): the query at 10 reads 6..9, later ones read less before 10.
    assert window.positions_read(10, 13) == (range(6, 10),)
    assert window.positions_read(2) == (range(2),)
    assert window.positions_read(0, 4) == ()
    chunk = ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=8, **ATTENTION)
    assert chunk.positions_read(11, 20) == (range(8, 11),)
    assert chunk.positions_read(16, 20) == ()
    full = FullAttentionSpec(block_size=4, **ATTENTION)
    assert full.positions_read(7, 9) == (range(7),)
    state = MambaSpec(block_size=4, shapes=((3, 2), (2, 2)), dtypes=("float32",) * 2)
    assert state.positions_read(9, 12) == (range(8, 9),)
    assert state.positions_read(0, 3) == ()


def test_a_window_allocated_as_full_attention_reads_its_window():
    # hybrid=False: the layer keeps every block (tokens_read, the rule its hits follow)
    # but computes its window (positions_read).
    window = SlidingWindowSpec(block_size=4, sliding_window=5, **ATTENTION)
    promoted = FullAttentionSpec.allocating_for(window, 4)
    assert promoted.tokens_read(10) == (range(10),)
    assert promoted.positions_read(10, 13) == (range(6, 10),)
    plan = kvcore.plan("gpt-oss-20b", memory="1GiB", max_model_len=1024, hybrid=False)
    own = plan.layer_specs["model.layers.0.self_attn"]
    assert own.positions_read(500) == (range(373, 500),)  # its 128-token window
    assert plan.layer_specs["model.layers.1.self_attn"].positions_read(500) == (range(500),)


@given(
    start=st.integers(0, 80),
    length=st.integers(1, 40),
    window=st.integers(1, 30),
    chunk=st.sampled_from([4, 8, 12]),
)
def test_closed_forms_equal_the_union_of_each_querys_reads(start, length, window, chunk):
    specs = [
        SlidingWindowSpec(block_size=4, sliding_window=window, **ATTENTION),
        ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=chunk, **ATTENTION),
        FullAttentionSpec(block_size=4, **ATTENTION),
        MambaSpec(block_size=4, shapes=((3, 2),), dtypes=("float32",)),
    ]
    stop = start + length
    for spec in specs:
        union = sorted(
            {t for p in range(start, stop) for r in spec.tokens_read(p) for t in r if t < start}
        )
        assert [t for r in spec.positions_read(start, stop) for t in r] == union


def test_positions_read_refuses_a_step_that_is_not_one():
    full = FullAttentionSpec(block_size=4, **ATTENTION)
    with pytest.raises(ValueError, match="stop must be an integer above start"):
        full.positions_read(5, 5)
    with pytest.raises(ValueError, match="start must be an integer >= 0"):
        full.positions_read(-1)
