"""The two-level pool: large pages carved into small pages per class, worked out by hand.

The layout used throughout (``layout()``): large pages of 64 bytes, four of
them (large page 0 holds the null blocks and is never handed out). Class 0
has 32-byte pages (2 per large page: large page ``p`` holds small pages
``2p`` and ``2p + 1``), class 1 16-byte pages (4 per large page: ``4p`` to
``4p + 3``). Group 0 is of class 0, group 1 of class 1. Free large pages are
handed out lowest first; a page that comes back is handed out next.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from protocol_adapters import ContractCheckedLRU, ReferenceLRU

import kvcore
from kvcore import PagePool, Request
from kvcore._block_pool import BlockPool
from kvcore._events import BlockRemoved, BlockStored
from kvcore._large_pages import FREE, RESERVED
from kvcore._two_level_pool import TwoLevelBlockPool
from kvcore.errors import HookImplementationError, InvalidConfigError, OutOfBlocksError


def layout(num_large_pages: int = 4) -> PagePool:
    return PagePool(
        large_page_bytes=64,
        num_large_pages=num_large_pages,
        class_page_bytes=(32, 16),
        group_classes=(0, 1),
    )


def pool_of(num_large_pages: int = 4, **options: object) -> TwoLevelBlockPool:
    return TwoLevelBlockPool(layout(num_large_pages), hash_block_size=2, **options)  # type: ignore[arg-type]


def hashed(request_id: str, tokens: list[int]) -> Request:
    request = Request(request_id, tokens)
    kvcore.hashing.BlockHasher(2).update(request)
    return request


def test_the_layout_is_checked():
    with pytest.raises(InvalidConfigError, match="not a positive divisor of the 64-byte"):
        PagePool(large_page_bytes=64, num_large_pages=4, class_page_bytes=(24,), group_classes=(0,))
    with pytest.raises(InvalidConfigError, match="group_classes: 2 is not a class"):
        PagePool(
            large_page_bytes=64, num_large_pages=4, class_page_bytes=(32, 16), group_classes=(2,)
        )


def test_a_new_pool_owns_nothing_and_reserves_large_page_0():
    pool = pool_of()
    assert pool.pages.owner == [RESERVED, FREE, FREE, FREE]
    assert pool.pages.free == [3, 2, 1]
    assert pool.num_free == 3
    assert [p.num_blocks for p in pool.pools] == [8, 16]
    assert [p.own_free() for p in pool.pools] == [0, 0]
    assert pool.get_usage() == 0.0
    pool.check_invariants()


def test_taking_blocks_carves_large_pages_lowest_first():
    pool = pool_of()
    first = pool.pool_of(0)
    # Three 32-byte blocks: large pages 1 (small pages 2, 3) and 2 (4, 5).
    assert first.get_new_blocks(3) == [2, 3, 4]
    assert pool.pages.owner == [RESERVED, 0, 0, FREE]
    assert pool.pages.in_use == [0, 2, 1, 0]
    assert first.free_block_ids() == [5]  # the spare of large page 2
    # Four 16-byte blocks: large page 3 (small pages 12 to 15).
    assert pool.pool_of(1).get_new_blocks(4) == [12, 13, 14, 15]
    assert pool.pages.owner == [RESERVED, 0, 0, 1]
    # In use: 3 of class 0's 2-page large pages, 4 of class 1's 4: 1.5 + 1 of 3.
    assert pool.get_usage() == pytest.approx(2.5 / 3)
    pool.check_invariants()


def test_no_memory_left_is_refused_and_changes_nothing():
    pool = pool_of()
    pool.pool_of(0).get_new_blocks(4)  # large pages 1 and 2
    pool.pool_of(1).get_new_blocks(4)  # large page 3
    before = (list(pool.pages.owner), list(pool.pages.in_use), pool.pool_of(1).free_block_ids())
    with pytest.raises(OutOfBlocksError, match="page class 1"):
        pool.pool_of(1).get_new_blocks(1)
    assert (list(pool.pages.owner), list(pool.pages.in_use), pool.pool_of(1).free_block_ids()) == (
        before
    )
    pool.check_invariants()


def test_a_page_left_holding_nothing_goes_back_and_is_handed_out_next():
    pool = pool_of()
    first = pool.pool_of(0)
    assert first.get_new_blocks(3) == [2, 3, 4]
    # Block 4 is uncached: once free, large page 2 holds nothing (5 is a spare).
    first.free_blocks([4])
    assert pool.pages.owner == [RESERVED, 0, FREE, FREE]
    assert pool.pages.free == [3, 2]
    assert first.free_block_ids() == []
    # Class 1 gets large page 2 back first: small pages 8 to 11.
    assert pool.pool_of(1).get_new_blocks(2) == [8, 9]
    assert pool.pages.owner == [RESERVED, 0, 1, FREE]
    pool.check_invariants()


def test_a_fully_free_page_stays_with_its_class_and_its_blocks_hit():
    pool = pool_of()
    first = pool.pool_of(0)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1: small pages 2, 3
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    assert pool.pages.owner[1] == 0
    assert pool.pages.fully_free[0] == {1: pool.pages.clock}
    assert pool.num_free == 3  # two free large pages and one fully free
    assert pool.get_cached_block(request.block_hashes[0], [0]) == [2]
    first.touch([2])
    assert pool.pages.fully_free[0] == {}
    assert pool.pages.in_use[1] == 1
    pool.check_invariants()


def test_a_class_short_of_memory_takes_another_class_s_fully_free_page():
    events: list[object] = []
    pool = pool_of(enable_kv_cache_events=True)
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    assert second.get_new_blocks(8) == [8, 9, 10, 11, 12, 13, 14, 15]  # large pages 2, 3
    events.extend(pool.take_events())
    # No free large page: class 1 takes class 0's fully free page 1, evicting
    # both cached blocks (the class keeps nothing else of its own).
    assert second.get_new_blocks(1) == [4]
    assert pool.pages.owner == [RESERVED, 1, 1, 1]
    assert pool.num_cached_blocks() == 0
    removed = [e for e in pool.take_events() if isinstance(e, BlockRemoved)]
    assert sorted(h for e in removed for h in e.block_hashes) == sorted(request.block_hashes[:2])
    assert any(isinstance(e, BlockStored) for e in events)
    assert first.num_evicted == 2
    pool.check_invariants()


def test_a_page_leaving_its_class_withdraws_its_free_blocks_from_the_policy():
    """Free blocks of a page given away are withdrawn, cached or not; revive is only for hits."""
    policies: list[ContractCheckedLRU] = []

    def checked(info: kvcore.eviction.PoolInfo) -> ContractCheckedLRU:
        policies.append(ContractCheckedLRU(info))
        return policies[-1]

    pool = pool_of(eviction=checked)
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1: small pages 2, 3
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    first.evict_blocks([3])  # block 3 stays queued, caching nothing
    assert list(policies[0]) == [3, 2]
    second.get_new_blocks(8)  # large pages 2 and 3
    # Class 1 takes class 0's fully free page 1: both its free blocks leave
    # class 0's policy, the uncached one too, and neither as a hit.
    assert second.get_new_blocks(1) == [4]
    assert policies[0].left == [("withdraw", 2, True), ("withdraw", 3, False)]
    assert list(policies[0]) == []
    assert first.num_cached_blocks() == 0
    # A hit still revives: class 1's cached block, freed, then adopted.
    again = hashed("b", [7, 8, 9])
    (block,) = second.get_new_blocks(1)
    second.cache_full_blocks(again, [block], 0, 1, 2, 1)
    second.free_blocks([block])
    second.touch([block])
    assert policies[1].left == [("revive", block, True)]
    pool.check_invariants()


def test_a_block_freed_caching_nothing_is_taken_before_the_cached_ones():
    """Block 3 is freed uncached: it becomes a spare, so the next block taken is 3, not 2.

    Block 2, freed cached, stays in the policy's queue and keeps its hash.
    """
    pool = pool_of()
    first = pool.pool_of(0)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1: small pages 2, 3
    first.cache_full_blocks(request, blocks, 0, 1, 2, 0)  # block 2 cached, block 3 not
    first.free_blocks(blocks[::-1])
    assert first.free_block_ids() == [3, 2]  # in the order they are taken
    assert first.num_spares() == 1
    assert first.get_new_blocks(1) == [3]
    assert first.block_hash(2) is not None
    pool.check_invariants()


def test_a_rolled_back_release_takes_the_spared_block_back():
    pool = pool_of()
    first = pool.pool_of(0)
    (block,) = first.get_new_blocks(1)
    with pytest.raises(kvcore.errors.DoubleFreeError), pool.transaction():
        first._release([block, block])
    assert first.ref_count(block) == 1
    assert first.num_spares() == 1  # the other small page of its large page
    pool.check_invariants()


class _WithoutWithdraw(ReferenceLRU):
    withdraw = None  # type: ignore[assignment]


def test_a_policy_without_withdraw_is_refused_for_a_two_level_pool_only():
    def factory(info: kvcore.eviction.PoolInfo) -> _WithoutWithdraw:
        return _WithoutWithdraw(info.num_blocks, free_at_start=info.free_at_start)

    BlockPool(4, eviction=factory).get_new_blocks(2)  # a shared pool never withdraws
    with pytest.raises(HookImplementationError, match="two-level pool without withdraw"):
        pool_of(eviction=factory)


def test_the_index_of_fully_free_pages_sheds_its_stale_entries():
    """A page made fully free, then used, again and again leaves the index bounded."""
    pool = pool_of()
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    for _ in range(200):
        first.free_blocks(blocks[::-1])  # page 1 fully free: one index entry more
        first.touch(blocks)  # in use again: that entry is stale
    first.free_blocks(blocks[::-1])
    # One live entry; stale ones at most twice that plus the allowance.
    assert len(pool.pages._heaps[0]) <= 2 + 64 + 1
    second.get_new_blocks(8)  # large pages 2 and 3
    assert second.get_new_blocks(1) == [4]  # the fully free page 1 is still found
    pool.check_invariants()


class _NewestFirst(ReferenceLRU):
    """Hands out the most recently freed block first (a policy whose order is not by age)."""

    def take(self, n: int) -> list[int]:
        taken = self.free[len(self.free) - n :][::-1]
        del self.free[len(self.free) - n :]
        self._record(self._put_back_end, taken)
        return taken

    def _put_back_end(self, blocks: list[int]) -> None:
        self.free.extend(reversed(blocks))

    def __iter__(self) -> Iterator[int]:
        return iter(self.free[::-1])


def _stale_and_young(eviction: object) -> tuple[TwoLevelBlockPool, list[int]]:
    """Class 1 holds a stale and a young cached free block, class 0 a fully free page between."""
    pool = pool_of(eviction=eviction)
    first, second = pool.pool_of(0), pool.pool_of(1)
    held = second.get_new_blocks(4)  # large page 1: small pages 4 to 7
    second.cache_full_blocks(hashed("x", [1, 2, 3]), [4], 0, 1, 2, 1)
    second.free_blocks([4])  # stale: release 1
    blocks = first.get_new_blocks(2)  # large page 2: small pages 4, 5 of class 0
    first.cache_full_blocks(hashed("y", [4, 5, 6, 7, 8]), blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])  # class 0's page fully free: release 2
    second.cache_full_blocks(hashed("z", [9, 10, 11]), [5], 0, 1, 2, 1)
    second.free_blocks([5])  # young: release 3
    second.get_new_blocks(4)  # large page 3: no free large page is left
    assert pool.pages.free == []
    return pool, held


def test_a_class_holding_staler_cache_evicts_its_own_whatever_its_policy_hands_out():
    """Its policy's next victim is young, but the class holds older cache than the other's page."""
    pool, _ = _stale_and_young(lambda info: _NewestFirst(info.num_blocks, free_at_start=False))
    # The policy's choice stands: the young block 5 goes, class 0's page stays.
    assert pool.pool_of(1).get_new_blocks(1) == [5]
    assert pool.pages.owner[2] == 0
    assert pool.pool_of(0).num_cached_blocks() == 2
    assert pool.pool_of(1).block_hash(4) is not None
    pool.check_invariants()
    # With lru the stale block is the policy's next victim anyway.
    pool, _ = _stale_and_young("lru")
    assert pool.pool_of(1).get_new_blocks(1) == [4]
    assert pool.pages.owner[2] == 0
    pool.check_invariants()


def test_after_a_reset_no_block_counts_as_cached_free_memory():
    """A reset forgets every hash: the stalest cached free block is then none."""
    pool = pool_of()
    first = pool.pool_of(0)
    blocks = first.get_new_blocks(2)  # large page 1
    first.cache_full_blocks(hashed("a", [1, 2, 3, 4, 5]), blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    assert next(first._ages.stalest(set())) == pool.pages.clock
    assert pool.reset_prefix_cache()
    assert next(first._ages.stalest(set())) is None
    pool.check_invariants()


def test_the_stalest_cache_goes_first_whatever_its_class():
    pool = pool_of(5)
    first, second = pool.pool_of(0), pool.pool_of(1)
    old = hashed("old", [1, 2, 3])
    new = hashed("new", list(range(7, 16)))
    a = first.get_new_blocks(2)  # large page 1
    first.cache_full_blocks(old, a, 0, 1, 2, 0)
    b = second.get_new_blocks(4)  # large page 2: small pages 8 to 11
    second.cache_full_blocks(new, b, 0, 4, 2, 1)
    second.get_new_blocks(8)  # large pages 3 and 4: nothing free is left
    first.free_blocks(a[::-1])  # class 0's page becomes fully free first (older)...
    second.free_blocks(b[::-1])  # ...then class 1's 8 to 11, its queue's only blocks
    # Class 1 needs one block: its own queue head (cached, freed later) is
    # younger than class 0's fully free page, so that page goes and class 1's
    # cache stays.
    assert second.get_new_blocks(1) == [4]
    assert pool.pages.owner[1] == 1
    assert second.block_hash(8) == new.block_hashes[0]
    assert first.num_cached_blocks() == 0
    pool.check_invariants()


def test_a_class_keeps_what_it_needs_for_its_own_part_of_an_allocation():
    pool = pool_of()
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    second.get_new_blocks(8)
    # One allocation: 1 block of class 0 and 1 of class 1. Class 0 cannot give
    # its only page away and still take its block: the allocation does not fit.
    with pool.transaction():
        assert not pool.make_room([1, 1], [[], []])
    assert pool.pages.owner == [RESERVED, 0, 1, 1]
    # Alone, class 1's block fits by taking that page.
    with pool.transaction():
        assert pool.make_room([0, 1], [[], []])
        assert second.get_new_blocks(1) == [4]
    assert pool.pages.owner == [RESERVED, 1, 1, 1]
    pool.check_invariants()


def test_a_page_holding_a_hit_being_adopted_is_never_taken():
    pool = pool_of()
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    second.get_new_blocks(8)
    with pool.transaction():
        assert not pool.make_room([1, 1], [[2], []])  # block 2 is adopted: page 1 stays
        assert pool.make_room([1, 0], [[2], []])  # the hit itself is the block it takes
    assert pool.pages.owner == [RESERVED, 0, 1, 1]
    pool.check_invariants()


def test_a_rolled_back_operation_restores_every_class_and_page():
    pool = pool_of(enable_kv_cache_events=True)
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    second.get_new_blocks(4)

    def state() -> tuple[object, ...]:
        pages = pool.pages
        return (
            [(list(p._ref), p.free_block_ids(), list(p._hash)) for p in pool.pools],
            list(pages.owner),
            list(pages.free),
            list(pages.in_use),
            list(pages.owned),
            [dict(f) for f in pages.fully_free],
            pages.clock,
            pool.peek_events(),
        )

    def fail_half_way() -> None:
        with pool.transaction():
            second.get_new_blocks(5)  # large page 3, then class 0's page 1
            second.free_blocks([12])
            raise RuntimeError

    before = state()
    with pytest.raises(RuntimeError):
        fail_half_way()
    assert state() == before
    pool.check_invariants()
    # After the rollback the same operation gives the same blocks.
    assert second.get_new_blocks(5) == [12, 13, 14, 15, 4]


def test_reset_empties_every_class_and_returns_the_pages():
    pool = pool_of(enable_kv_cache_events=True)
    first = pool.pool_of(0)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    assert not pool.reset_prefix_cache()  # blocks in use
    first.free_blocks(blocks)
    pool.take_events()
    assert pool.reset_prefix_cache()
    assert pool.pages.owner == [RESERVED, FREE, FREE, FREE]
    assert [type(e).__name__ for e in pool.take_events()] == ["AllBlocksCleared"]
    pool.check_invariants()


def test_evicting_a_fully_free_page_s_blocks_returns_the_page():
    pool = pool_of()
    first = pool.pool_of(0)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks)
    pool.evict_blocks([2])
    assert pool.pages.owner[1] == 0  # block 3 still cached
    pool.evict_blocks([3])
    assert pool.pages.owner[1] == FREE
    pool.check_invariants()


def test_lookups_go_to_each_group_s_class():
    pool = TwoLevelBlockPool(
        PagePool(
            large_page_bytes=64,
            num_large_pages=4,
            class_page_bytes=(32, 16),
            group_classes=(0, 1, 0),
        ),
        hash_block_size=2,
    )
    request = hashed("a", [1, 2, 3, 4, 5])
    a = pool.pool_of(0).get_new_blocks(2)
    b = pool.pool_of(1).get_new_blocks(2)
    c = pool.pool_of(2).get_new_blocks(2)
    pool.pool_of(0).cache_full_blocks(request, a, 0, 2, 2, 0)
    pool.pool_of(1).cache_full_blocks(request, b, 0, 2, 2, 1)
    pool.pool_of(2).cache_full_blocks(request, c, 0, 1, 2, 2)
    first = request.block_hashes[0]
    # Group 2 shares class 0 with group 0: its blocks come from large page 3.
    assert (a, b, c) == ([2, 3], [8, 9], [6, 7])
    assert pool.get_cached_block(first, [0, 2]) == [2, 6]
    assert pool.get_cached_block(first, [0, 1, 2]) == [2, 8, 6]
    assert pool.match_prefix(request.block_hashes, 0, 2, [0, 1]) == ([2, 3], [8, 9])
    assert pool.match_prefix(request.block_hashes, 0, 2, [1, 2]) == ([8], [6])
    assert pool.holds_cached([9], [request.block_hashes[1]], 1)
    assert not pool.holds_cached([3], [request.block_hashes[1]], 1)
    pool.check_invariants()


# -- classes confined to a number of large pages (a static split) -----------------------


def test_a_limited_class_counts_free_large_pages_only_up_to_its_limit():
    pool = pool_of()
    pool.limit_classes([1, None])
    # Class 0: one large page of two small pages; class 1: all three free pages.
    assert [p.num_free for p in pool.pools] == [2, 12]
    assert pool.pool_of(0).get_new_blocks(2) == [2, 3]  # large page 1
    assert [p.num_free for p in pool.pools] == [0, 8]
    with pytest.raises(OutOfBlocksError, match="page class 0"):
        pool.pool_of(0).get_new_blocks(1)
    assert pool.pages.owner == [RESERVED, 0, FREE, FREE]
    # Class 1 is not limited: large pages 2 and 3.
    assert pool.pool_of(1).get_new_blocks(8) == list(range(8, 16))
    pool.check_invariants()


def test_a_class_at_its_limit_evicts_its_own_cache_instead_of_carving():
    pool = pool_of()
    first = pool.pool_of(0)
    pool.limit_classes([1, None])
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1: small pages 2, 3
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    # Two free large pages are there, but class 0 owns its one page: it takes
    # its own two cached blocks back, evicting them.
    assert sorted(first.get_new_blocks(2)) == [2, 3]
    assert pool.pages.owner == [RESERVED, 0, FREE, FREE]
    assert first.num_evicted == 2
    assert pool.num_cached_blocks() == 0
    pool.check_invariants()


def test_a_class_at_its_limit_takes_no_page_of_another_class():
    pool = pool_of()
    first, second = pool.pool_of(0), pool.pool_of(1)
    request = hashed("a", [1, 2, 3, 4, 5])
    blocks = first.get_new_blocks(2)  # large page 1
    first.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    first.free_blocks(blocks[::-1])
    pool.limit_classes([None, 2])
    assert second.get_new_blocks(8) == list(range(8, 16))  # large pages 2, 3: at its limit
    # Unlimited, class 1 would take class 0's fully free page 1 (see above).
    with pytest.raises(OutOfBlocksError, match="page class 1"):
        second.get_new_blocks(1)
    assert pool.pages.owner == [RESERVED, 0, 1, 1]
    assert pool.num_cached_blocks() == 2
    # Raising the limit lets the page move.
    pool.limit_classes([None, 3])
    assert second.get_new_blocks(1) == [4]
    assert pool.pages.owner == [RESERVED, 1, 1, 1]
    pool.check_invariants()


def test_an_allocation_over_two_classes_respects_each_limit():
    pool = pool_of()
    pool.limit_classes([1, 1])
    # Class 0 needs 3 blocks (two large pages), over its limit of one: refused.
    assert not pool.make_room([3, 1], [[], []])
    assert pool.pages.owner == [RESERVED, FREE, FREE, FREE]
    with pool.transaction():
        assert pool.make_room([2, 4], [[], []])
        assert pool.pool_of(0).get_new_blocks(2) == [2, 3]  # large page 1
        assert pool.pool_of(1).get_new_blocks(4) == [8, 9, 10, 11]  # large page 2
    assert pool.pages.owner == [RESERVED, 0, 1, FREE]
    pool.check_invariants()


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ([1], r"one entry per page class \(2\), got 1"),
        ([-1, None], r"limits\[0\]: a number of large pages >= 0 or None, got -1"),
        ([None, 1.5], r"limits\[1\]: a number of large pages >= 0 or None, got 1.5"),
        ([True, None], r"limits\[0\]: a number of large pages >= 0 or None, got True"),
        ([0, None], r"limits\[0\]: class 0 owns 2 large pages now, more than 0"),
    ],
)
def test_bad_limits_are_refused_and_change_nothing(limits: list[object], message: str):
    pool = pool_of()
    pool.limit_classes([2, None])
    pool.pool_of(0).get_new_blocks(3)  # large pages 1 and 2
    with pytest.raises(InvalidConfigError, match=message):
        pool.limit_classes(limits)  # type: ignore[arg-type]
    assert pool.pages.limits == (2, None)
