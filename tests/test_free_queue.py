"""The LRU free queue: order of allocation, frees and revivals (vllm-notes §9.1)."""

from __future__ import annotations

from kvcore._eviction.lru import LRUFreeQueue


def test_starts_in_id_order_and_pops_from_the_head():
    queue = LRUFreeQueue(5)
    assert list(queue) == [0, 1, 2, 3, 4]
    assert queue.take(1) == [0]
    assert queue.take(2) == [1, 2]
    assert list(queue) == [3, 4]


def test_freed_blocks_go_to_the_tail_in_the_given_order():
    queue = LRUFreeQueue(6)
    assert queue.take(6) == [0, 1, 2, 3, 4, 5]
    queue.release([])
    queue.release([0])
    queue.release([4, 5])
    queue.release([1, 2, 3])
    assert list(queue) == [0, 4, 5, 1, 2, 3]


def test_never_allocated_blocks_precede_freed_ones():
    queue = LRUFreeQueue(6)
    taken = queue.take(3)
    queue.release(taken[::-1])
    assert list(queue) == [3, 4, 5, 2, 1, 0]
    # A pop spanning the fresh run and the linked part keeps the order.
    assert queue.take(4) == [3, 4, 5, 2]
    assert list(queue) == [1, 0]


def test_remove_takes_a_block_out_of_the_middle():
    queue = LRUFreeQueue(5)
    queue.take(5)
    queue.release([0, 1, 2, 3, 4])
    queue.revive([2])
    assert list(queue) == [0, 1, 3, 4]
    queue.release([2])
    assert list(queue) == [0, 1, 3, 4, 2]
    queue.revive([0])
    queue.revive([2])
    assert list(queue) == [1, 3, 4]
    assert queue.take(3) == [1, 3, 4]
    assert list(queue) == []


def test_taking_none_changes_nothing():
    queue = LRUFreeQueue(3)
    queue.take(1)
    assert queue.take(0) == []
    assert list(queue) == [1, 2]


def test_popleft_n_sequence():
    # Scenario 4: queue [b1,b3,b5,b4,b0,b2]; popleft_n(0),(1),(2),(3).
    queue = LRUFreeQueue(6)
    queue.take(6)
    queue.release([1, 3, 5, 4, 0, 2])
    assert queue.take(0) == []
    assert queue.take(1) == [1]
    assert queue.take(2) == [3, 5]
    assert queue.take(3) == [4, 0, 2]
    assert list(queue) == []


def test_a_block_revived_and_freed_again_is_taken_from_its_newest_place():
    queue = LRUFreeQueue(5)
    queue.take(5)
    queue.release([0, 1, 2, 3, 4])
    queue.revive([2])  # 2's entry stays in the list, stale
    queue.release([2])
    assert list(queue) == [0, 1, 3, 4, 2]
    assert queue.take(3) == [0, 1, 3]  # passes (and drops) the stale entry of 2
    assert queue.take(2) == [4, 2]
    assert list(queue) == []


def test_a_block_revived_twice_skips_both_old_entries():
    queue = LRUFreeQueue(3)
    queue.take(3)
    queue.release([0, 1, 2])
    for _ in range(2):
        queue.revive([1])
        queue.release([1])
    assert list(queue) == [0, 2, 1]
    assert queue.take(3) == [0, 2, 1]


def test_hits_on_free_blocks_without_allocations_keep_the_list_near_the_pool_size():
    """Stale entries are compacted away: a lightly loaded server must not grow its queue."""
    queue = LRUFreeQueue(4)
    queue.take(4)
    queue.release([0, 1, 2, 3])
    for _ in range(5_000):
        queue.revive([1])
        queue.release([1])
    assert list(queue) == [0, 2, 3, 1]
    # A compaction sweeps the list a step per revive: the list and the part
    # swept so far hold at most the pool, the stale entries allowed and one
    # step's worth.
    swept = len(queue._swept) - queue._swept_head if queue._swept is not None else 0
    entries = swept + len(queue._queue) - queue._head
    assert entries <= 2 * (4 + LRUFreeQueue.COMPACTION_SLACK) + LRUFreeQueue.SWEEP_STEP + 8


def test_allocating_and_freeing_forever_keeps_the_list_near_the_pool_size():
    queue = LRUFreeQueue(8)
    for _ in range(5_000):
        queue.release(queue.take(3)[::-1])
    assert len(queue._queue) <= 2 * (8 + LRUFreeQueue.TRIM_AFTER) + 1
    assert sorted(queue) == list(range(8))


def test_a_long_hit_waiting_as_one_run_is_cut_out_of_the_list():
    """No stale entries are left: the list loses exactly the hit's entries."""
    queue = LRUFreeQueue(40)
    table = queue.take(40)
    queue.release(table[:20][::-1])  # queued 19, 18, ..., 0
    queue.release(table[20:][::-1])  # then 39, 38, ..., 20
    hit = list(range(10))  # a prefix of the first request: 9..0 in the list
    queue.revive(hit)
    assert queue._num_stale == 0
    assert queue._queue[queue._head :] == [*range(19, 9, -1), *range(39, 19, -1)]
    assert list(queue) == [*range(19, 9, -1), *range(39, 19, -1)]


class CutsShortHits(LRUFreeQueue):
    __slots__ = ()
    CUT_MIN_BLOCKS = 2


def two_blocks_queued_and_1_revived() -> CutsShortHits:
    """A two-block queue whose list reads 1 (stale: 1 is in use again), 0."""
    queue = CutsShortHits(2)
    queue.take(2)
    queue.release([1, 0])  # queued 1, 0
    queue.revive([1])
    return queue


def test_a_run_cut_through_a_stale_entry_keeps_the_counts_right():
    """The list reads 1 (stale), 0, 1: [0, 1] is cut at its first two entries."""
    queue = two_blocks_queued_and_1_revived()
    queue.release([1])  # the list: 1 (stale), 0, 1
    queue.revive([0, 1])
    assert list(queue) == []
    # 1's entry left in the list is counted stale: 1 is in use.
    assert queue._queue[queue._head :] == [1]
    assert queue._stale == [0, 1]
    queue.release([0, 1])
    assert list(queue) == [0, 1]
    assert queue.take(2) == [0, 1]


def test_a_hit_on_part_of_a_run_leaves_the_rest_queued():
    """The list reads 1 (stale: 1 is in use), 0; a hit that revives 0 empties the queue."""
    queue = two_blocks_queued_and_1_revived()
    queue.revive([0])
    assert list(queue) == []


class SweepsTwoEntriesACall(LRUFreeQueue):
    __slots__ = ()
    COMPACTION_SLACK = 0
    SWEEP_STEP = 2
    SWEEP_PER_BLOCK = 0


def test_allocations_during_a_compaction_take_the_swept_part_first_and_roll_back():
    """A compaction sweeping two entries per call, with allocations and a rollback in between."""
    queue = SweepsTwoEntriesACall(4)
    model = list(range(4))

    def free(block: int) -> None:
        queue.release([block])
        model.append(block)

    def hit(block: int) -> None:
        queue.revive([block])
        model.remove(block)

    queue.take(4)
    model.clear()
    for block in (0, 1, 2, 3):
        free(block)
    for _ in range(5):  # five stale entries of 3: the sweep starts (it swept 0 and 1)
        hit(3)
        free(3)
    assert queue._swept == [0, 1]
    hit(0)  # 0's live entry is in the swept part: it turns stale there
    free(0)
    assert list(queue) == model == [1, 2, 3, 0]
    # An allocation passes the stale 0 in the swept part, inside a transaction
    # that is rolled back, then for good.
    snapshot = (list(queue), list(queue._stale), queue._num_stale)
    queue.journal = log = []
    assert queue.take(2) == [1, 2]
    queue.journal = None
    for undo, arguments in reversed(log):
        undo(*arguments)
    assert (list(queue), list(queue._stale), queue._num_stale) == snapshot
    assert queue.take(2) == [1, 2]
    del model[:2]
    assert list(queue) == model == [3, 0]
    assert sum(queue._stale) == queue._num_stale
    ended = 0
    for _ in range(20):  # sweeps end (the swept list takes over) and start again
        was_sweeping = queue._swept is not None
        hit(3)
        ended += was_sweeping and queue._swept is None
        free(3)
    assert ended > 0
    assert list(queue) == model == [0, 3]
    assert sum(queue._stale) == queue._num_stale
    assert queue.take(2) == [0, 3]


def test_a_block_revived_from_the_swept_part_and_freed_again_keeps_its_new_place():
    """Its stale entry is in the swept part; the sweep must not drop its new, live one.

    The sweep kept 0 and 1 (the swept part comes first); 0 is then hit and
    freed again, so its live entry is at the tail of the list. Sweeping on
    (more hits of 3) reaches that entry: it is 0's live one, and the order
    stays that of a plain list (found by the model test below; the queue used
    to drop the entry and hand 0 out from the head).
    """
    queue = SweepsTwoEntriesACall(4)
    model = [0, 1, 2, 3]
    queue.take(4)
    queue.release([0, 1, 2, 3])
    for _ in range(5):  # five stale entries of 3: the sweep starts and keeps 0 and 1
        queue.revive([3])
        queue.release([3])
    model = [0, 1, 2, 3]
    assert queue._swept == [0, 1]
    queue.revive([0])
    queue.release([0])
    model = [1, 2, 3, 0]
    assert list(queue) == model
    for _ in range(6):  # the sweep goes on to the tail, past 0's live entry
        queue.revive([3])
        queue.release([3])
        model = [*[b for b in model if b != 3], 3]
        assert list(queue) == model
    assert queue._swept is None  # the sweep ended
    assert queue.take(4) == model
