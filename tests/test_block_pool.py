"""The block pool: null block, cache map with duplicates, eviction, reset, errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pool_state import pool_state
from protocol_adapters import rolled_back

import kvcore
from kvcore import Request
from kvcore._events import BlockRemoved
from kvcore.errors import DoubleFreeError, InvalidConfigError, OutOfBlocksError
from kvcore.managers import BlockPool


def cached_request(tokens: list[int], block_size: int) -> Request:
    request = Request("r", tokens)
    kvcore.hashing.BlockHasher(block_size).update(request)
    return request


def test_new_pool_reserves_the_null_block():
    pool = BlockPool(10)
    assert pool.null_block == 0
    assert pool.get_num_free_blocks() == 9
    assert pool.get_usage() == 0.0
    assert pool.get_new_blocks(3) == [1, 2, 3]
    assert pool.get_usage() == pytest.approx(3 / 9)
    pool.check_invariants()


def test_a_pool_of_only_the_null_block_has_zero_usage():
    pool = BlockPool(1)
    assert pool.get_num_free_blocks() == 0
    assert pool.get_usage() == 0.0


@pytest.mark.parametrize("num_blocks", [0, -3, 2.5, True])
def test_invalid_pool_sizes_are_rejected(num_blocks):
    with pytest.raises(InvalidConfigError, match="num_blocks must be an integer >= 1"):
        BlockPool(num_blocks)


def test_cache_full_blocks_skips_null_blocks_and_counts_entries():
    # Scenario 28: block size 4, 14 tokens; cache blocks 0-1, then block 2.
    pool = BlockPool(10)
    request = cached_request(list(range(14)), 4)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    assert pool.num_cached_blocks() == 2
    pool.cache_full_blocks(request, blocks, 2, 3, 4, 0)
    assert pool.num_cached_blocks() == 3
    # A null block in the range is not cached.
    other = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, [other[0], 0, other[1]], 0, 3, 4, 0)
    assert pool.block_hash(other[0]) == request.block_hashes[0]
    assert pool.block_hash(other[1]) == request.block_hashes[2]
    assert pool.block_hash(0) is None
    pool.check_invariants()


def test_lookups_need_every_group():
    # Scenario 29: group 0 caches 2 blocks, group 1 caches 3.
    pool = BlockPool(10, num_groups=2)
    request = cached_request(list(range(14)), 4)
    h = request.block_hashes
    group0 = pool.get_new_blocks(3)
    group1 = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, group0, 0, 2, 4, 0)
    pool.cache_full_blocks(request, group1, 0, 3, 4, 1)
    assert pool.num_cached_blocks() == 5
    assert pool.get_cached_block(h[2], [0]) is None
    assert pool.get_cached_block(h[2], [1]) == [group1[2]]
    assert pool.get_cached_block(h[0], [0, 1]) == [group0[0], group1[0]]
    assert pool.get_cached_block(h[2], [0, 1]) is None
    assert pool.match_prefix(h, 0, 3, [0, 1]) == ([group0[0], group0[1]], [group1[0], group1[1]])


def test_identical_blocks_are_not_deduplicated_and_the_first_wins():
    pool = BlockPool(10)
    request = cached_request(list(range(8)), 4)
    first = pool.get_new_blocks(2)
    second = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, first, 0, 2, 4, 0)
    pool.cache_full_blocks(request, second, 0, 2, 4, 0)
    h0 = request.block_hashes[0]
    assert pool.get_cached_block(h0, [0]) == [first[0]]
    # Evicting the first copy promotes the second.
    pool.evict_blocks([first[0]])
    assert pool.get_cached_block(h0, [0]) == [second[0]]
    pool.evict_blocks([second[0]])
    assert pool.get_cached_block(h0, [0]) is None
    # Evicting a duplicate that is not the primary leaves the primary alone.
    pool.evict_blocks([second[1]])
    assert pool.get_cached_block(request.block_hashes[1], [0]) == [first[1]]
    pool.check_invariants()


def test_taking_a_free_cached_block_evicts_it():
    # Scenario 23: 2 blocks; cache a 16-token request, free it; a new request gets
    # block 1 back with its hash reset.
    pool = BlockPool(2)
    request = cached_request([7] * 16, 16)
    (block,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(request, [block], 0, 1, 16, 0)
    pool.free_blocks([block])
    assert pool.get_cached_block(request.block_hashes[0], [0]) == [block]
    assert pool.get_new_blocks(1) == [block]
    assert pool.block_hash(block) is None
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None


def test_touch_revives_free_blocks_and_skips_the_null_block():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks[::-1])
    assert pool.free_block_ids() == [4, 5, 3, 2, 1]
    pool.touch([0, 2, 2])
    assert pool.ref_count(2) == 2
    assert pool.free_block_ids() == [4, 5, 3, 1]
    pool.check_invariants()


def test_double_free_is_refused_and_changes_nothing():
    pool = BlockPool(6)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks([blocks[2]])
    order = pool.free_block_ids()
    with pytest.raises(DoubleFreeError, match="block 3 was freed more often than it was"):
        pool.free_blocks([blocks[0], blocks[1], blocks[2]])
    assert [pool.ref_count(b) for b in blocks] == [1, 1, 0]
    assert pool.free_block_ids() == order
    pool.check_invariants()


def test_asking_for_too_many_blocks_raises():
    pool = BlockPool(4)
    with pytest.raises(OutOfBlocksError, match="cannot take 4 blocks: only 3 are free"):
        pool.get_new_blocks(4)
    assert pool.get_num_free_blocks() == 3


def test_reserved_blocks_leave_circulation():
    pool = BlockPool(6)
    assert pool.reserve_blocks(2) == [1, 2]
    assert pool.num_reserved_blocks == 2
    assert pool.get_num_free_blocks() == 3
    pool.check_invariants()
    # The cache can be reset although reserved blocks are "in use".
    assert pool.reset_prefix_cache()


def test_reset_prefix_cache_only_when_nothing_is_in_use():
    pool = BlockPool(6, enable_kv_cache_events=True)
    request = cached_request(list(range(8)), 4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    pool.take_events()
    assert not pool.reset_prefix_cache()
    assert pool.num_cached_blocks() == 2
    assert pool.take_events() == []
    pool.free_blocks(blocks[::-1])
    assert pool.reset_prefix_cache()
    assert pool.num_cached_blocks() == 0
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None
    assert pool.take_events() == [kvcore.events.AllBlocksCleared()]
    pool.check_invariants()


def test_evict_blocks_rejects_foreign_ids():
    pool = BlockPool(4)
    with pytest.raises(
        kvcore.errors.InvalidBlockError, match=r"block 9 is not a block of this pool"
    ):
        pool.evict_blocks([9])


def test_evict_blocks_drops_an_id_given_twice_once():
    pool = BlockPool(6)
    request = cached_request(list(range(9)), 4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    pool.evict_blocks([blocks[0], blocks[0]])  # raised KeyError: the hash was gone
    assert pool.block_hash(blocks[0]) is None
    assert pool.block_hash(blocks[1]) == request.block_hashes[1]
    assert pool.num_cached_blocks() == 1
    pool.check_invariants()


def test_count_evictable_counts_free_blocks_but_not_nulls():
    pool = BlockPool(8)
    blocks = pool.get_new_blocks(4)
    pool.free_blocks([blocks[1], blocks[3]])
    assert pool.count_evictable([0, *blocks, 0]) == 2
    assert pool.count_evictable([]) == 0
    assert pool.count_evictable((blocks[0], 0)) == 0


# -- the public methods guard their arguments (issue 8) ---------------------------------


def test_touching_a_never_allocated_block_takes_it_out_of_the_queue():
    """It stayed in the never-used run and was handed out a second time."""
    pool = BlockPool(10)
    pool.touch([1])
    assert pool.ref_count(1) == 1
    assert pool.get_new_blocks(1) == [2]
    pool.check_invariants()


def test_touching_a_never_allocated_block_deep_in_the_queue():
    pool = BlockPool(10)
    pool.touch([5])
    assert pool.free_block_ids() == [1, 2, 3, 4, 6, 7, 8, 9]
    assert pool.get_new_blocks(5) == [1, 2, 3, 4, 6]
    pool.free_blocks([5])
    assert pool.free_block_ids() == [7, 8, 9, 5]
    pool.check_invariants()


def test_touching_a_never_allocated_block_with_freed_blocks_queued():
    """The queue lost blocks and a later allocation raised IndexError."""
    pool = BlockPool(6)
    assert pool.get_new_blocks(2) == [1, 2]
    pool.free_blocks([2, 1])
    assert pool.free_block_ids() == [3, 4, 5, 2, 1]
    pool.touch([4])
    assert pool.free_block_ids() == [3, 5, 2, 1]
    assert pool.get_new_blocks(4) == [3, 5, 2, 1]
    pool.check_invariants()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: p.get_new_blocks(-1), r"num_blocks must be an integer >= 0, got -1"),
        (lambda p: p.get_new_blocks(2.0), r"num_blocks must be an integer >= 0, got 2\.0"),
        (lambda p: p.touch([2, -1]), r"block -1 is not a block of this pool \(ids 0\.\.9\)"),
        (lambda p: p.touch([10]), r"block 10 is not a block of this pool \(ids 0\.\.9\)"),
        (lambda p: p.touch(["3"]), r"block '3' is not a block of this pool"),
        (lambda p: p.free_blocks([1, -2]), r"block -2 is not a block of this pool"),
        (lambda p: p.free_blocks([12]), r"block 12 is not a block of this pool"),
        (lambda p: p.evict_blocks([9, 1.5]), r"block 1\.5 is not a block of this pool"),
        (lambda p: p.evict_blocks([-1]), r"block -1 is not a block of this pool"),
        (lambda p: p.reserve_blocks(-2), r"num_blocks must be an integer >= 0, got -2"),
        (lambda p: p.ref_count(-1), r"block -1 is not a block of this pool"),
        (lambda p: p.block_hash(10), r"block 10 is not a block of this pool"),
        (lambda p: p.block_group(10), r"block 10 is not a block of this pool \(ids 0\.\.9\)"),
        (lambda p: p.block_group(2.0), r"block 2\.0 is not a block of this pool"),
        (lambda p: p.is_cached(b"h", 1), r"kv_cache_group_id 1 is not a group of this pool"),
        (lambda p: p.cached_block(b"h", -1), r"kv_cache_group_id -1 is not a group"),
        (
            lambda p: p.cached_blocks(b"h", 0.0),
            r"kv_cache_group_id 0\.0 is not a group of this pool \(ids 0\.\.0\)",
        ),
    ],
)
def test_bad_block_ids_and_counts_are_refused_and_change_nothing(call, match):
    pool = BlockPool(10)
    held = pool.get_new_blocks(3)
    pool.free_blocks([held[0]])
    before = pool_state(pool)
    with pytest.raises(kvcore.errors.InvalidBlockError, match=match):
        call(pool)
    assert pool_state(pool) == before
    pool.check_invariants()


def test_caching_past_the_requests_hashes_is_a_request_error():
    pool = BlockPool(10)
    request = cached_request(list(range(9)), 4)
    blocks = pool.get_new_blocks(3)
    with pytest.raises(
        kvcore.errors.InvalidRequestError,
        match="request 'r' has hashes for 2 blocks, cannot cache 3",
    ):
        pool.cache_full_blocks(request, blocks, 0, 3, 4, 0)
    assert pool.num_cached_blocks() == 0


def test_a_pool_too_large_for_int32_block_ids_is_refused():
    """1000 TiB built per-block lists of billions of entries and took the machine down."""
    with pytest.raises(
        kvcore.errors.PoolTooLargeError,
        match=r"num_blocks=2147483648 is more than a pool can address: block tables hold "
        r"int32 ids \(at most 2147483647 blocks\)",
    ):
        BlockPool(2**31)


def test_a_pool_whose_bookkeeping_exceeds_host_memory_is_refused(monkeypatch):
    from kvcore import _block_pool

    monkeypatch.setattr(_block_pool, "available_host_memory", lambda: 2**30)
    with pytest.raises(
        kvcore.errors.PoolTooLargeError,
        match=r"a pool of 100000000 blocks needs about 3\.73 GiB of host memory for its "
        r"bookkeeping \(40 bytes a block\), but only 1\.00 GiB is available",
    ):
        BlockPool(100_000_000)
    assert BlockPool(1000).get_num_free_blocks() == 999


# -- transactions: rollback restores everything, free-queue order included -------------


def random_operation(
    pool: BlockPool, rng, held: list[int], request: Request, num_groups: int = 2
) -> None:
    """One public pool operation with valid arguments (held: blocks this test holds)."""
    roll = rng.random()
    free = pool.free_block_ids()
    if roll < 0.3 and free:
        held += pool.get_new_blocks(rng.randint(0, min(len(free), 4)))
    elif roll < 0.45 and free:
        # A free block anywhere in the queue, never-allocated ones included.
        block = rng.choice(free)
        pool.touch([block, 0, block])
        held += [block, block]
    elif roll < 0.65 and held:
        rng.shuffle(held)
        count = rng.randint(1, len(held))
        pool.free_blocks(held[:count])
        del held[:count]
    elif roll < 0.8 and held:
        uncached = [b for b in dict.fromkeys(held) if pool.block_hash(b) is None]
        if uncached:
            table = uncached[: len(request.block_hashes)]
            pool.cache_full_blocks(request, table, 0, len(table), 4, rng.randrange(num_groups))
    elif roll < 0.9:
        pool.evict_blocks(rng.sample(range(pool.num_blocks), 3))
    elif free:
        held += [b for b in pool.reserve_blocks(1)]
        held.pop()  # reserved for good: never freed


@pytest.mark.parametrize("num_groups", [1, 2])
@pytest.mark.parametrize("seed", range(100))
def test_rollback_restores_the_pool_exactly(seed, num_groups):
    # One group: the group ids are a bytearray and eviction skips them.
    import random

    rng = random.Random(seed)
    pool = BlockPool(16, num_groups=num_groups, enable_kv_cache_events=seed % 2 == 0)
    held: list[int] = []
    request = cached_request(list(range(40)), 4)
    for _ in range(rng.randint(0, 30)):  # some history: freed, cached, evicted blocks
        random_operation(pool, rng, held, request, num_groups)
    before = pool_state(pool)
    saved = list(held)
    with rolled_back(pool):
        # A transaction inside a running one joins it: the outer one undoes both.
        with pool.transaction():
            for _ in range(rng.randint(1, 6)):
                random_operation(pool, rng, held, request, num_groups)
        for _ in range(rng.randint(0, 6)):
            random_operation(pool, rng, held, request, num_groups)
    assert pool_state(pool) == before
    pool.check_invariants()
    # The pool goes on as if the transaction never ran.
    held[:] = saved
    for _ in range(20):
        random_operation(pool, rng, held, request, num_groups)
    pool.check_invariants()


def test_commit_keeps_the_changes_and_stops_recording():
    pool = BlockPool(8)
    with pool.transaction():
        blocks = pool.get_new_blocks(2)
    # Committed: a later transaction that fails undoes only its own changes.
    with rolled_back(pool):
        pool.get_new_blocks(1)
    assert [pool.ref_count(b) for b in blocks] == [1, 1]
    assert pool.get_num_free_blocks() == 5


def test_an_inner_failure_caught_inside_leaves_the_decision_to_the_outer_block():
    pool = BlockPool(8)
    with pool.transaction():
        first = pool.get_new_blocks(1)
        try:
            with pool.transaction():
                second = pool.get_new_blocks(2)
                raise RuntimeError("caught below, inside the outer block")
        except RuntimeError:
            pass
        # The inner block joined the outer one: nothing was undone yet.
        assert pool.get_num_free_blocks() == 4
    # The outer block succeeded: all three blocks stay taken.
    assert [pool.ref_count(b) for b in first + second] == [1, 1, 1]
    # And a failing outer block undoes an inner block that succeeded.
    with rolled_back(pool), pool.transaction():
        pool.get_new_blocks(2)
    assert pool.get_num_free_blocks() == 4
    # Each new outermost block records afresh, after a failure as after a success.
    with rolled_back(pool):
        pool.get_new_blocks(4)
    assert pool.get_num_free_blocks() == 4


def test_a_public_method_that_fails_changes_nothing():
    pool = BlockPool(8)
    blocks = pool.get_new_blocks(3)
    before = pool.free_block_ids()
    with pytest.raises(kvcore.errors.DoubleFreeError):
        pool.free_blocks([blocks[0], blocks[1], blocks[0]])
    assert pool.free_block_ids() == before
    assert [pool.ref_count(b) for b in blocks] == [1, 1, 1]


def test_cached_blocks_lists_duplicates_first_found_first():
    """Two requests that computed the same block both cache it; the later one waits."""
    pool = BlockPool(6)
    first, second = (cached_request(list(range(4)), 4) for _ in range(2))
    [a] = pool.get_new_blocks(1)
    [b] = pool.get_new_blocks(1)
    pool.cache_full_blocks(first, [a], 0, 1, 4, 0)
    pool.cache_full_blocks(second, [b], 0, 1, 4, 0)
    block_hash = first.block_hashes[0]
    assert pool.cached_block(block_hash, 0) == a
    assert pool.cached_blocks(block_hash, 0) == [a, b]
    assert pool.cached_blocks(b"no such hash", 0) == []
    # Evicting the first promotes the duplicate.
    pool.evict_blocks([a])
    assert pool.cached_blocks(block_hash, 0) == [b]
    pool.check_invariants()


# -- three copies of one hash: the oldest waiting copy is found next ----------------------
#
# Worked by hand: a fresh 4-block pool hands out blocks 1, 2, 3 in id order; each is
# cached, in that order, under the hash of the same four tokens. A lookup finds the
# copy cached first; the others wait in caching order. When the found copy loses its
# hash, the copy that has waited longest (cached earliest) is found next, whatever
# the free-queue order.


def three_copies(**pool_options: object) -> tuple[BlockPool, object]:
    """A 4-block pool whose blocks 1, 2, 3 are cached, in that order, under one hash."""
    pool = BlockPool(4, **pool_options)  # type: ignore[arg-type]
    for _ in range(3):
        request = cached_request([5, 6, 7, 8], 4)
        pool.cache_full_blocks(request, pool.get_new_blocks(1), 0, 1, 4, 0)
    return pool, request.block_hashes[0]


def found(pool: BlockPool, block_hash: object) -> tuple[object, ...]:
    """What each public lookup finds for ``block_hash`` in group 0."""
    return (
        pool.cached_block(block_hash, 0),
        pool.get_cached_block(block_hash, [0]),
        pool.match_prefix([block_hash], 0, 1, [0]),
    )


def test_three_copies_are_listed_in_caching_order():
    pool, h = three_copies()
    assert pool.cached_blocks(h, 0) == [1, 2, 3]
    assert found(pool, h) == (1, [1], ([1],))


def test_evicting_the_found_copy_promotes_the_oldest_waiting_copy():
    pool, h = three_copies()
    pool.evict_blocks([1])
    assert pool.cached_blocks(h, 0) == [2, 3]
    assert found(pool, h) == (2, [2], ([2],))
    pool.evict_blocks([2])
    assert pool.cached_blocks(h, 0) == [3]
    assert found(pool, h) == (3, [3], ([3],))
    pool.evict_blocks([3])
    assert found(pool, h) == (None, None, ([],))
    pool.check_invariants()


def test_evicting_a_waiting_copy_keeps_the_others_in_order():
    pool, h = three_copies()
    pool.evict_blocks([2])
    assert pool.cached_blocks(h, 0) == [1, 3]
    pool.evict_blocks([1])
    assert pool.cached_blocks(h, 0) == [3]
    pool.check_invariants()


@pytest.mark.parametrize("events", [False, True], ids=["no_events", "events"])
def test_allocation_evicts_in_queue_order_and_promotes_the_oldest_copy(events):
    # Freed 1, 3, 2: the queue hands out 1 first, then 3, then 2. Taking 1 (the
    # found copy) promotes 2, the oldest waiting copy, although 3 is evicted next.
    pool, h = three_copies(enable_kv_cache_events=events)
    pool.free_blocks([1, 3, 2])
    assert pool.free_block_ids() == [1, 3, 2]
    pool.take_events()
    assert pool.get_new_blocks(1) == [1]
    assert pool.cached_blocks(h, 0) == [2, 3]
    assert found(pool, h) == (2, [2], ([2],))
    assert pool.get_new_blocks(1) == [3]
    assert pool.cached_blocks(h, 0) == [2]
    assert pool.get_new_blocks(1) == [2]
    assert pool.cached_blocks(h, 0) == []
    expected_events = [BlockRemoved(block_hashes=(h,), group_idx=0)] * 3
    assert pool.take_events() == (expected_events if events else [])
    pool.check_invariants()


@pytest.mark.parametrize("events", [False, True], ids=["no_events", "events"])
def test_rolling_back_an_eviction_of_copies_restores_their_order(events):
    pool, h = three_copies(enable_kv_cache_events=events)
    pool.free_blocks([1, 3, 2])
    with rolled_back(pool):
        pool.evict_blocks([1])  # promotes 2
        pool.evict_blocks([3])  # a waiting copy leaves
        assert pool.cached_blocks(h, 0) == [2]
    assert pool.cached_blocks(h, 0) == [1, 2, 3]
    with rolled_back(pool):
        assert pool.get_new_blocks(2) == [1, 3]  # the allocation path: 1 promotes 2, 3 leaves
        assert pool.cached_blocks(h, 0) == [2]
    assert pool.cached_blocks(h, 0) == [1, 2, 3]
    assert pool.free_block_ids() == [1, 3, 2]
    pool.check_invariants()
    # The restored order is the live one: evicting the found copy promotes 2 again.
    pool.evict_blocks([1])
    assert found(pool, h) == (2, [2], ([2],))


@settings(max_examples=150, deadline=None)
@given(
    copies=st.integers(3, 6),
    order=st.randoms(use_true_random=False),
    rollback_after=st.integers(0, 6),
)
def test_copies_are_found_oldest_first_under_any_evictions(copies, order, rollback_after):
    """Model: a list in caching order; a lookup finds its head; eviction removes one entry.

    Evictions after ``rollback_after`` of them run in a transaction that is
    rolled back: the list is as it was before the transaction.
    """
    pool = BlockPool(copies + 1)
    for _ in range(copies):
        request = cached_request([5, 6, 7, 8], 4)
        pool.cache_full_blocks(request, pool.get_new_blocks(1), 0, 1, 4, 0)
    h = request.block_hashes[0]
    model = list(range(1, copies + 1))
    victims = list(model)
    order.shuffle(victims)

    def evict(victims: list[int]) -> None:
        for victim in victims:
            pool.evict_blocks([victim])
            model.remove(victim)
            assert pool.cached_blocks(h, 0) == model
            assert pool.cached_block(h, 0) == (model[0] if model else None)

    evict(victims[:rollback_after])
    saved = list(model)
    with rolled_back(pool):
        evict(victims[rollback_after:])
    assert pool.cached_blocks(h, 0) == saved
    pool.check_invariants()
