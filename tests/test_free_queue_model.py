"""The LRU free queue against a plain list model, with undo, under hypothesis.

The model is the reference order written the obvious way: take from the
front, free to the back, a hit removes its block wherever it is. The queue
under test compacts and trims on every chance it gets (thresholds of 0 and
1), so its lazy deletion, compaction, trimming and their undo all run. Every
step may run inside a transaction that is then rolled back: the queue's order
must come back exactly.
"""

from __future__ import annotations

from typing import Any, ClassVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvcore._eviction.lru import LRUFreeQueue

NUM_BLOCKS = 6


class EagerQueue(LRUFreeQueue):
    """Compacts as soon as stale entries outnumber the blocks, a few entries per call.

    Trims after one entry.
    A revive of two blocks or more looks for them as one run of the list
    (the cut that long hits take), whatever the list's length.
    """

    __slots__ = ()
    COMPACTION_SLACK: ClassVar[int] = 0
    SWEEP_STEP: ClassVar[int] = 0
    TRIM_AFTER: ClassVar[int] = 1
    CUT_MIN_BLOCKS: ClassVar[int] = 2
    CUT_SEARCH_PER_BLOCK: ClassVar[int] = 1_000_000


class SlowSweepQueue(EagerQueue):
    """Sweeps one entry per revive call: allocations take from the swept part."""

    __slots__ = ()
    SWEEP_STEP: ClassVar[int] = 1
    SWEEP_PER_BLOCK: ClassVar[int] = 0


class FreeQueueAgainstAModel(RuleBasedStateMachine):
    queue_class: ClassVar[type[LRUFreeQueue]] = EagerQueue

    def __init__(self) -> None:
        super().__init__()
        self.queue = self.queue_class(NUM_BLOCKS)
        self.model = list(range(NUM_BLOCKS))
        self.held: set[int] = set()
        self.log: list[Any] | None = None

    def _begin(self, transaction: bool) -> None:
        if transaction:
            self.saved = list(self.queue)
            self.log = self.queue.journal = []

    def _end(self) -> None:
        """Roll back the transaction, if one runs; the queue must be as before it."""
        if self.log is None:
            return
        self.queue.journal = None
        for undo, arguments in reversed(self.log):
            undo(*arguments)
        self.log = None
        assert list(self.queue) == self.saved

    @precondition(lambda self: self.model)
    @rule(n=st.integers(1, NUM_BLOCKS), transaction=st.booleans())
    def take(self, n: int, transaction: bool) -> None:
        n = min(n, len(self.model))
        self._begin(transaction)
        taken = self.queue.take(n)
        assert taken == self.model[:n]
        if self.log is not None:
            return self._end()
        del self.model[:n]
        self.held.update(taken)
        return None

    @precondition(lambda self: self.held)
    @rule(data=st.data(), transaction=st.booleans())
    def free(self, data: st.DataObject, transaction: bool) -> None:
        """Blocks in use become free, in the order given."""
        released = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        self._begin(transaction)
        self.queue.release(released)
        if self.log is not None:
            return self._end()
        self.model += released
        self.held.difference_update(released)
        return None

    @precondition(lambda self: self.model)
    @rule(data=st.data(), transaction=st.booleans())
    def hit(self, data: st.DataObject, transaction: bool) -> None:
        """Free blocks leave the queue, wherever they are."""
        blocks = data.draw(st.lists(st.sampled_from(self.model), min_size=1, unique=True))
        self._begin(transaction)
        self.queue.revive(blocks)
        if self.log is not None:
            return self._end()
        for block in blocks:
            self.model.remove(block)
        self.held.update(blocks)
        return None

    @precondition(lambda self: len(self.model) >= 2)
    @rule(data=st.data(), transaction=st.booleans())
    def hit_a_run(self, data: st.DataObject, transaction: bool) -> None:
        """A hit on consecutive free blocks, last first: how a freed request's prefix is hit."""
        start = data.draw(st.integers(0, len(self.model) - 2))
        stop = data.draw(st.integers(start + 2, len(self.model)))
        blocks = self.model[start:stop][::-1]
        self._begin(transaction)
        self.queue.revive(blocks)
        if self.log is not None:
            return self._end()
        del self.model[start:stop]
        self.held.update(blocks)
        return None

    @invariant()
    def same_order(self) -> None:
        assert list(self.queue) == self.model

    @invariant()
    def stale_counts_add_up(self) -> None:
        queue = self.queue
        swept = queue._swept[queue._swept_head :] if queue._swept is not None else []
        listed = queue._queue[queue._head :]
        stale_swept = sum(queue._swept_stale.values())
        assert sum(queue._stale) + stale_swept == queue._num_stale
        # A block's entries ahead of the head, in each part: its stale ones
        # there, plus its live one if it is free and waits there.
        for block in range(NUM_BLOCKS):
            live = block in self.model and queue.was_ever_taken(block)
            in_swept = block in queue._swept_live
            assert not in_swept or live
            assert swept.count(block) == queue._swept_stale[block] + in_swept
            assert listed.count(block) == queue._stale[block] + (live and not in_swept)


class SlowSweepAgainstAModel(FreeQueueAgainstAModel):
    queue_class = SlowSweepQueue


FreeQueueAgainstAModel.TestCase.settings = settings(max_examples=600, stateful_step_count=50)
SlowSweepAgainstAModel.TestCase.settings = settings(max_examples=600, stateful_step_count=50)
test_free_queue_against_a_model = FreeQueueAgainstAModel.TestCase
test_a_slowly_swept_queue_against_a_model = SlowSweepAgainstAModel.TestCase
