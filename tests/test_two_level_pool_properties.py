"""The two-level pool under random operations: invariants after each, exact rollback.

Three classes (pages of 48, 32 and 16 bytes in 96-byte large pages: 2, 3 and
6 a large page), one group each. Requests take blocks of one class, cache
them, free them, adopt them again as hits; blocks are evicted by id, the
cache is reset, and operations are run in a transaction that fails at its
end. After every step the pool's invariants hold (a small page only in a
large page its class owns, a large page owned by at most one class, free
counts adding up, empty pages back in the common pool); a failed
transaction leaves every class and every large page as it was. Some runs
confine classes to a number of large pages: no class ever owns more.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_adapters import ContractCheckedLRU

import kvcore
from kvcore import PagePool, Request
from kvcore._two_level_pool import TwoLevelBlockPool
from kvcore.errors import OutOfBlocksError

LAYOUT = PagePool(
    large_page_bytes=96,
    num_large_pages=6,
    class_page_bytes=(48, 32, 16),
    group_classes=(0, 1, 2),
)


class Held:
    """The blocks one request holds in one group, and its tokens (for its hashes)."""

    def __init__(self, group: int, blocks: list[int], request: Request) -> None:
        self.group = group
        self.blocks = blocks
        self.request = request
        self.cached = 0


def state(pool: TwoLevelBlockPool, exact_order: bool = True) -> tuple[object, ...]:
    """Everything an operation may change; the free order only for a policy that undoes it.

    The value policies undo by compensating calls: the free set comes back,
    its order may not (as in a shared pool).
    """
    pages = pool.pages

    def free(p: Any) -> object:
        return p.free_block_ids() if exact_order else sorted(p.free_block_ids())

    return (
        [(list(p._ref), free(p), list(p._hash), p.num_evicted) for p in pool.pools],
        # When each block was freed, and the releases the class weighs its cache by.
        [(list(p._ages.freed_at), p._ages._order[p._ages._head :]) for p in pool.pools],
        list(pages.owner),
        list(pages.free),
        list(pages.in_use),
        list(pages.owned),
        [dict(f) for f in pages.fully_free],
        pages.clock,
        pages.moves,
        pool.peek_events(),
    )


#: A third party's policy (through the driver) asserting the protocol's guarantees.
CHECKED = "checked"


class Run:
    def __init__(self, policy: str, limits: tuple[int | None, ...] | None = None) -> None:
        self.pool = TwoLevelBlockPool(
            LAYOUT,
            hash_block_size=1,
            enable_kv_cache_events=True,
            eviction=ContractCheckedLRU if policy == CHECKED else policy,
        )
        if limits is not None:
            self.pool.limit_classes(limits)
        self.held: list[Held] = []
        self.done: list[Held] = []
        self.counter = 0

    def request(self, num_blocks: int) -> Request:
        self.counter += 1
        # Prompts share a prefix now and then, so that hashes repeat.
        prefix = [self.counter % 3] * (self.counter % 4)
        tokens = prefix + [1000 + self.counter * 10 + i for i in range(num_blocks + 1)]
        request = Request(f"r{self.counter}", tokens)
        kvcore.hashing.BlockHasher(1).update(request)
        return request

    def allocate(self, group: int, count: int) -> None:
        pool = self.pool.pool_of(group)
        request = self.request(count)
        try:
            blocks = pool.get_new_blocks(count)
        except OutOfBlocksError:
            return
        self.held.append(Held(group, blocks, request))

    def cache(self, index: int) -> None:
        if not self.held:
            return
        held = self.held[index % len(self.held)]
        pool = self.pool.pool_of(held.group)
        pool.cache_full_blocks(
            held.request, held.blocks, held.cached, len(held.blocks), 1, held.group
        )
        held.cached = len(held.blocks)

    def free(self, index: int) -> None:
        if not self.held:
            return
        held = self.held.pop(index % len(self.held))
        self.pool.pool_of(held.group).free_blocks(held.blocks[::-1])
        self.done.append(held)

    def hit(self, index: int) -> None:
        if not self.done:
            return
        old = self.done[index % len(self.done)]
        hashes = old.request.block_hashes
        (blocks,) = self.pool.match_prefix(hashes, 0, len(old.blocks), [old.group])
        if blocks:
            self.pool.pool_of(old.group).touch(blocks)
            self.held.append(Held(old.group, blocks, old.request))
            self.held[-1].cached = len(blocks)

    def evict(self, index: int) -> None:
        self.pool.evict_blocks([index % 12, (index * 7) % 18])

    def reset(self, _: int) -> None:
        if self.pool.reset_prefix_cache():
            for held in self.held:
                held.cached = 0

    def do(self, op: tuple[str, int, int]) -> None:
        name, a, b = op
        if name == "allocate":
            self.allocate(a % 3, 1 + b % 7)
        else:
            getattr(self, name)(a)


OPS = st.tuples(
    st.sampled_from(["allocate", "allocate", "cache", "free", "hit", "evict", "reset"]),
    st.integers(0, 50),
    st.integers(0, 50),
)


def failing(run: Run, op: tuple[str, int, int]) -> None:
    class Abort(Exception):
        pass

    held, done, counter = list(run.held), list(run.done), run.counter
    cached = [h.cached for h in run.held]
    try:
        with run.pool.transaction():
            run.do(op)
            raise Abort
    except Abort:
        pass
    run.held, run.done, run.counter = held, done, counter
    for h, c in zip(run.held, cached, strict=True):
        h.cached = c


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(st.tuples(OPS, st.booleans()), min_size=1, max_size=60),
    policy=st.sampled_from(["lru", "admit", "frequency", "cost", CHECKED]),
    limits=st.none() | st.tuples(*[st.none() | st.integers(0, 5)] * 3),
)
def test_random_operations_keep_every_invariant_and_roll_back_exactly(
    ops: Any, policy: str, limits: tuple[int | None, ...] | None
):
    run = Run(policy, limits)
    for op, fail in ops:
        if fail and op[0] != "reset":  # a reset runs outside transactions
            exact = policy in ("lru", CHECKED)
            before = state(run.pool, exact)
            failing(run, op)
            assert state(run.pool, exact) == before, op
        else:
            run.do(op)
        run.pool.check_invariants()
        for owned, limit in zip(run.pool.pages.owned, limits or (None,) * 3, strict=True):
            assert limit is None or owned <= limit
    for held in run.held:
        run.pool.pool_of(held.group).free_blocks(held.blocks)
    assert run.pool.num_in_use == 0
    assert run.pool.reset_prefix_cache()
    assert len(run.pool.pages.free) == LAYOUT.num_large_pages - 1
    run.pool.check_invariants()
