"""The compiled value queue against its specification, call by call.

``kvcore._native.ValueQueue`` is the compiled twin of
:class:`kvcore._eviction.policies.ValuePolicy` (the ``admit``, ``frequency``
and ``cost`` policies). The engine-level differential tests compare whole
pools; here both queues get the same free-queue calls directly (takes,
releases, revivals of never-used and freed blocks, hits, forgets, cached
prompt and decode ranges, in a suffix group and a prefix group), and every
answer and the whole free order must agree after every call. Joiners (whose
anchors come from a pool's prefix map) are covered by the pool-level tests.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from native_backend import require_native
from tiny_specs import full, sw

from kvcore._eviction.policies import BUILTIN_OPTIONS, ValuePolicy, ValueRules
from kvcore.errors import DoubleFreeError
from kvcore.eviction import GroupInfo, PoolInfo

#: A prefix group (full attention) and a suffix group (a window of 6 tokens) of
#: 4-token blocks, and a prefix group of 4,096-token blocks (its chains are
#: deep enough for the ``cost`` policy's depth classes).
GROUPS = (GroupInfo.of(full(), True), GroupInfo.of(sw(6), True), GroupInfo.of(full(4096), True))


def twin_pair(num_blocks: int, policy: str) -> tuple[ValuePolicy, Any]:
    """The specification and the compiled queue for the built-in ``policy``."""
    from kvcore import _native  # type: ignore[attr-defined]

    build = {name.__name__.removesuffix("_policy"): name for name in BUILTIN_OPTIONS}[policy]
    info = PoolInfo(num_blocks=num_blocks, groups=GROUPS, alignment_tokens=4, view=None)
    options = BUILTIN_OPTIONS[build]
    parts = ValueRules(info, **options).compiled_parts()
    core = _native.Core(num_blocks, DoubleFreeError, queue=False)
    core.bind([None] * num_blocks, [{}, {}, {}], [{}, {}, {}], bytearray(num_blocks))
    return ValuePolicy(info, **options), _native.ValueQueue(num_blocks, core=core, **parts)


class BothQueues(RuleBasedStateMachine):
    """The same calls on a ValuePolicy and a ValueQueue."""

    @initialize(
        num_blocks=st.integers(2, 16), policy=st.sampled_from(["admit", "frequency", "cost"])
    )
    def build(self, num_blocks: int, policy: str) -> None:
        self.queues = twin_pair(num_blocks, policy)
        self.free = set(range(num_blocks))
        self.journals: tuple[list[Any], list[Any]] = ([], [])
        for queue, journal in zip(self.queues, self.journals, strict=True):
            queue.journal = journal

    def both(self, name: str, *args: Any) -> Any:
        results = [getattr(queue, name)(*args) for queue in self.queues]
        assert results[0] == results[1], name
        return results[0]

    @precondition(lambda self: hasattr(self, "free") and self.free)
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        taken = self.both("take", data.draw(st.integers(1, len(self.free))))
        assert set(taken) <= self.free
        self.free.difference_update(taken)

    @precondition(lambda self: hasattr(self, "free") and len(self.free) < self.size())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        held = sorted(set(range(self.size())) - self.free)
        blocks = data.draw(st.lists(st.sampled_from(held), unique=True, min_size=1))
        self.both("release", blocks)
        self.free.update(blocks)

    @precondition(lambda self: hasattr(self, "free") and self.free)
    @rule(data=st.data())
    def revive(self, data: st.DataObject) -> None:
        blocks = data.draw(st.lists(st.sampled_from(sorted(self.free)), unique=True, min_size=1))
        self.both("revive", blocks)
        self.free.difference_update(blocks)

    @precondition(lambda self: hasattr(self, "free"))
    @rule(data=st.data(), group=st.integers(0, 2), prompt=st.sampled_from([1, 9, 40, 60, 50000]))
    def cached(self, data: st.DataObject, group: int, prompt: int) -> None:
        table = data.draw(st.lists(self.mostly_held(), min_size=1, max_size=12))
        start = data.draw(st.integers(0, len(table) - 1))
        stop = data.draw(st.integers(start + 1, len(table)))
        self.both("cached", group, table, start, stop, [None] * len(table), prompt)

    @precondition(lambda self: hasattr(self, "free"))
    @rule(data=st.data())
    def hit(self, data: st.DataObject) -> None:
        self.both("hit", data.draw(st.lists(self.mostly_held(), max_size=6)))

    @precondition(lambda self: hasattr(self, "free"))
    @rule(data=st.data(), everything=st.booleans())
    def forget(self, data: st.DataObject, everything: bool) -> None:
        blocks = data.draw(st.lists(st.integers(0, self.size() - 1), max_size=6))
        self.both("forget", None if everything else blocks)

    @precondition(lambda self: hasattr(self, "free"))
    @rule()
    def undo_the_last_steps(self) -> None:
        """Replay both journals newest first, as a rollback does: the same free set and order."""
        for journal in self.journals:
            for undo, arguments in reversed(journal):
                undo(*arguments)
            journal.clear()
        self.free = set(self.queues[0])

    def mostly_held(self) -> st.SearchStrategy[int]:
        """Block ids, mostly of held blocks (cached and hit, then released: valued classes)."""
        held = sorted(set(range(self.size())) - self.free)
        anything = st.integers(0, self.size() - 1)
        return (
            st.one_of(st.sampled_from(held), st.sampled_from(held), anything) if held else anything
        )

    def size(self) -> int:
        return len(self.queues[0]._state)

    @invariant()
    def agree(self) -> None:
        if hasattr(self, "queues"):
            orders = [list(queue) for queue in self.queues]
            assert orders[0] == orders[1]
            assert set(orders[0]) == self.free
            assert [self.queues[0].class_of(b) for b in range(self.size())] == [
                self.queues[1].class_of(b) for b in range(self.size())
            ]


def test_the_compiled_queue_answers_every_call_as_the_specification() -> None:
    require_native()
    BothQueues.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
    BothQueues.TestCase().runTest()


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda q: q.release([3]), ValueError, r"block 3 is already free"),
        (lambda q: q.release([1, 1]), ValueError, r"block 1 is listed twice"),
        (lambda q: q.release([1, 9]), IndexError, r"block 9 is not a block of this pool"),
        (lambda q: q.revive([1]), ValueError, r"block 1 is not free"),
        (lambda q: q.revive([3.0]), TypeError, r"integer"),
        (lambda q: q.take(-1), ValueError, r"take\(n\) needs 0 <= n <= 8, got -1"),
        (lambda q: q.take(1.5), TypeError, r"integer"),
        (lambda q: q.hit([-1]), IndexError, r"block -1 is not a block of this pool"),
        (lambda q: q.cached(3, [1], 0, 1, [None], 4), IndexError, r"group 3 is not a group"),
        (lambda q: q.cached(0, [1], 0, 2, [None], 4), IndexError, r"range \[0, 2\) is not in"),
    ],
)
def test_bad_calls_are_refused_and_change_nothing(call: Any, error: type, message: str) -> None:
    require_native()
    _, queue = twin_pair(8, "frequency")
    assert queue.take(3) == [0, 1, 2]
    queue.release([2])
    before = (list(queue), [queue.class_of(b) for b in range(8)])
    with pytest.raises(error, match=message):
        call(queue)
    assert (list(queue), [queue.class_of(b) for b in range(8)]) == before
