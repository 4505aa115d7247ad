"""The LRU free queue: order of allocation, frees and revivals (vllm-notes §9.1)."""

from __future__ import annotations

import pytest

from kvcore._free_queue import LRUFreeQueue
from kvcore.errors import OutOfBlocksError


def test_starts_in_id_order_and_pops_from_the_head():
    queue = LRUFreeQueue(5)
    assert list(queue) == [0, 1, 2, 3, 4]
    assert queue.pop_n(1) == [0]
    assert queue.pop_n(2) == [1, 2]
    assert len(queue) == 2


def test_freed_blocks_go_to_the_tail_in_the_given_order():
    queue = LRUFreeQueue(6)
    assert queue.pop_n(6) == [0, 1, 2, 3, 4, 5]
    queue.push([])
    queue.push([0])
    queue.push([4, 5])
    queue.push([1, 2, 3])
    assert list(queue) == [0, 4, 5, 1, 2, 3]
    assert queue.num_free == 6


def test_never_allocated_blocks_precede_freed_ones():
    queue = LRUFreeQueue(6)
    taken = queue.pop_n(3)
    queue.push(taken[::-1])
    assert list(queue) == [3, 4, 5, 2, 1, 0]
    # A pop spanning the fresh run and the linked part keeps the order.
    assert queue.pop_n(4) == [3, 4, 5, 2]
    assert list(queue) == [1, 0]


def test_remove_takes_a_block_out_of_the_middle():
    queue = LRUFreeQueue(5)
    queue.pop_n(5)
    queue.push([0, 1, 2, 3, 4])
    queue.remove(2)
    assert list(queue) == [0, 1, 3, 4]
    assert queue.num_free == 4
    queue.push([2])
    assert list(queue) == [0, 1, 3, 4, 2]
    queue.remove(0)
    queue.remove(2)
    assert list(queue) == [1, 3, 4]
    assert queue.pop_n(3) == [1, 3, 4]
    assert list(queue) == []


def test_taking_more_than_free_raises_and_changes_nothing():
    queue = LRUFreeQueue(3)
    queue.pop_n(1)
    with pytest.raises(OutOfBlocksError, match="cannot take 3 blocks: only 2 are free"):
        queue.pop_n(3)
    assert list(queue) == [1, 2]
    assert queue.pop_n(0) == []


def test_popleft_n_sequence():
    # Scenario 4: queue [b1,b3,b5,b4,b0,b2]; popleft_n(0),(1),(2),(3).
    queue = LRUFreeQueue(6)
    queue.pop_n(6)
    queue.push([1, 3, 5, 4, 0, 2])
    assert queue.pop_n(0) == []
    assert queue.pop_n(1) == [1]
    assert queue.pop_n(2) == [3, 5]
    assert queue.pop_n(3) == [4, 0, 2]
    assert queue.num_free == 0
