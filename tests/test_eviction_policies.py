"""The built-in eviction policies: the credit queues, admission, chains, frequency, cost.

Expected orders are worked out by hand from the rules in
``kvcore/_eviction/policies.py`` (quoted in each test).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from two_level import two_level_config

import kvcore
from kvcore import Request
from kvcore._eviction.credit import NOT_FREE, WORTHLESS, CreditQueues
from kvcore._eviction.policies import ValuePolicy
from kvcore.eviction import GroupInfo, PoolInfo
from kvcore.testing import RandomWorkload, admit
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec

# -- the credit queues -------------------------------------------------------------------


def test_fresh_blocks_then_worthless_then_earliest_deadline():
    queues = CreditQueues(8, credits=[0, 3])  # class 1: no credit, class 2: 3 releases
    assert queues.take(5) == [0, 1, 2, 3, 4]
    queues.push(1, 2)  # clock 1, due 4
    queues.push(2, 1)  # clock 2, due 2
    queues.push(3, WORTHLESS)  # no clock
    queues.push(4, 1)  # clock 3, due 3
    # Fresh 5..7, then the worthless 3, then by deadline: 2 (2), 4 (3), 1 (4).
    assert list(queues) == [5, 6, 7, 3, 2, 4, 1]
    assert queues.take(6) == [5, 6, 7, 3, 2, 4]
    assert queues.class_of(1) == 2
    assert queues.class_of(2) == NOT_FREE


def test_a_credit_outlives_later_releases_until_its_deadline():
    queues = CreditQueues(10, credits=[0, 4])
    queues.take(10)
    queues.push(9, 2)  # due 1 + 4 = 5
    for block in (1, 2, 3, 4, 5):  # due 2, 3, 4, 5, 6
        queues.push(block, 1)
    # Ties go to the lower class: 4 (due 5, class 1) before 9 (due 5, class 2).
    assert queues.take(6) == [1, 2, 3, 4, 9, 5]


def test_remove_and_move():
    queues = CreditQueues(6, credits=[0])
    queues.take(6)
    for block in (1, 2, 3):
        queues.push(block, 1)
    queues.remove(2)
    assert list(queues) == [1, 3]
    queues.move(1, WORTHLESS)
    queues.move(3, 1)  # to the tail of its class, deadline restarted (not a release)
    assert list(queues) == [1, 3]
    assert queues.is_free(3)
    assert not queues.is_free(2)


def test_take_fresh_then_worthless_then_earliest_deadline_lower_class_on_ties():
    queues = CreditQueues(5, credits=[0, 1])  # class 1: no credit, class 2: 1 release
    assert queues.take(1)[0] == 0  # fresh, in id order
    assert queues.take(4) == [1, 2, 3, 4]
    queues.push(0, 2)  # clock 1, due 2
    queues.push(1, 1)  # clock 2, due 2: ties with 0, and class 1 goes first
    queues.push(2, 1)  # clock 3, due 3
    queues.push(3, WORTHLESS)
    assert [queues.take(1)[0] for _ in range(4)] == [3, 1, 0, 2]
    assert queues.class_of(1) == NOT_FREE


def joiner_queues(num_blocks, credits, anchor_of):
    """Credit queues whose joiners' anchors are ``anchor_of[joiner]``."""
    queues = CreditQueues(num_blocks, credits)
    queues.anchors = lambda block: [anchor_of[block]] if block in anchor_of else []
    return queues


def test_a_joiner_whose_turn_comes_while_its_anchor_is_free_waits_behind_it():
    # Joiner 4 (a kept window block) belongs behind anchor 1 (its prefix
    # block). Freed first, it is due first: 4 (due 1), 2 (2), 1 (3), 3 (4).
    # At its turn its anchor is free, so it moves behind 1 with 1's deadline.
    queues = joiner_queues(6, [0], {4: 1})
    queues.take(6)
    queues.push_joiner(4, 1, None)  # its anchor is still in use
    queues.push(2, 1)
    queues.push(1, 1)
    queues.push(3, 1)
    assert list(queues) == [2, 1, 4, 3]
    assert queues.take(4) == [2, 1, 4, 3]


def test_joiners_that_wait_behind_one_anchor_go_last_moved_first():
    # Joiners 4 (due 1) and 5 (due 2) of anchor 1 (due 4): each, at its turn,
    # moves right behind the anchor, so 5 ends up between 1 and 4.
    queues = joiner_queues(6, [0], {4: 1, 5: 1})
    queues.take(6)
    queues.push_joiner(4, 1, None)
    queues.push_joiner(5, 1, None)
    queues.push(2, 1)
    queues.push(1, 1)
    queues.push(3, 1)
    assert list(queues) == [2, 1, 5, 4, 3]
    assert queues.take(5) == [2, 1, 5, 4, 3]


def test_a_joiner_whose_anchor_is_not_free_at_its_turn_goes_at_its_deadline():
    queues = joiner_queues(6, [0], {4: 1})
    queues.take(6)
    queues.push_joiner(4, 1, None)
    queues.push(2, 1)
    queues.push(1, 1)
    queues.remove(1)  # a hit took the anchor back
    assert list(queues) == [4, 2]
    assert [queues.take(1)[0], queues.take(1)[0]] == [4, 2]


def test_a_joiner_freed_after_its_anchor_goes_right_behind_it():
    # Anchor 1 due 1, 2 due 2; joiner 4 joins 1 at once (due 1 too), ahead of
    # 2; a later joiner of the same anchor goes right behind it, before 4.
    queues = joiner_queues(6, [0], {4: 1, 5: 1})
    queues.take(6)
    queues.push(1, 1)
    queues.push(2, 1)
    queues.push_joiner(4, 1, 1)
    queues.push_joiner(5, 1, 1)
    assert list(queues) == [1, 5, 4, 2]
    assert [queues.take(1)[0] for _ in range(4)] == [1, 5, 4, 2]


def test_a_joiner_due_after_its_anchor_is_not_pulled_forward():
    # Joiner 4 in class 2 (credit 10) is due after its anchor 1: the anchor
    # goes at its turn, the joiner at its own.
    queues = joiner_queues(6, [0, 10], {4: 1})
    queues.take(6)
    queues.push_joiner(4, 2, None)  # due 11
    queues.push(1, 1)  # due 2
    queues.push(2, 1)  # due 3
    assert list(queues) == [1, 2, 4]
    assert queues.take(3) == [1, 2, 4]


# take(2) once handed out 2, 3 instead of 2, 1: 2 is due at 2, then 1 and 3
# are both due at 3, and 1's class comes first.
@example(
    num_credits=2,
    num_used=12,
    ops=[("push", 2), ("push", 2), ("push", 1), ("take_many", 1)],
)
@settings(max_examples=500, deadline=None)
@given(
    num_credits=st.integers(1, 3),
    num_used=st.integers(0, 12),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["take", "take_many", "push", "join", "remove", "move"]),
            st.integers(0, 11),
        ),
        max_size=60,
    ),
)
def test_take_hands_out_the_iteration_order(num_credits, num_used, ops):
    # The iteration order is its own algorithm (a min over the class heads by
    # deadline, then class, simulating the joiners that wait behind a free
    # anchor at their turn); take(1) must hand out its first block, and
    # take(n) its first n blocks leaving the same order behind as n take(1).
    # Credits one release apart: equal deadlines across classes are common.
    # Blocks 6..11 are joiners of blocks 0..2, two each.
    credits = list(range(num_credits))
    anchor_of = {joiner: (joiner - 6) // 2 for joiner in range(6, 12)}
    queues = joiner_queues(12, credits, anchor_of)
    twin = joiner_queues(12, credits, anchor_of)
    # Blocks taken before the ops start (the fresh run used up, or not).
    taken = queues.take(num_used)
    twin.take(num_used)
    for op, arg in ops:
        order = list(queues)
        assert order == list(twin)
        if op == "take" and order:
            assert queues.take(1) == [order[0]] == twin.take(1)
            assert not queues.is_free(order[0])
            assert queues.class_of(order[0]) == NOT_FREE
            taken.append(order[0])
        elif op == "take_many" and order:
            k = 1 + arg % len(order)
            assert queues.take(k) == order[:k]
            for _ in range(k):
                twin.take(1)
            taken.extend(order[:k])
        elif op in ("push", "join") and taken:
            block = taken.pop(arg % len(taken))
            klass = arg % (num_credits + 1)
            if op == "join" and block in anchor_of and klass:
                anchor = anchor_of[block]
                free = queues.class_of(anchor) not in (WORTHLESS, NOT_FREE)
                queues.push_joiner(block, klass, anchor if free else None)
                twin.push_joiner(block, klass, anchor if free else None)
            else:
                queues.push(block, klass)
                twin.push(block, klass)
        elif op == "remove" and order:
            block = order[arg % len(order)]
            queues.remove(block)
            twin.remove(block)
            taken.append(block)
        elif op == "move" and order:
            block = order[arg % len(order)]
            if queues.class_of(block) != NOT_FREE:  # a never-used block has no class
                queues.move(block, arg % (num_credits + 1))
                twin.move(block, arg % (num_credits + 1))
    assert list(queues) == list(twin)


# -- policies on a hybrid pool ------------------------------------------------------------

BS = 4


def full() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def mamba() -> MambaSpec:
    return MambaSpec(block_size=BS, shapes=((2, 8),), dtypes=("float32",), mamba_cache_mode="align")


def window(size: int) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=size
    )


@pytest.fixture(scope="module")
def registry() -> kvcore.Registry:
    return kvcore.load_registry(only=["full_attention", "mamba", "sliding_window"])


def manager_with(registry, specs, num_blocks, **policy_options):
    config = kvcore.KVCacheConfig.from_specs(num_blocks, specs)
    policies = []

    def factory(info):
        policies.append(ValuePolicy(info, **policy_options))
        return policies[-1]

    manager = kvcore.KVCacheManager(
        config, 256, registry=registry, hash_algorithm="fast", eviction=factory
    )
    return manager, policies[0]


def prefill_and_free(manager, request):
    blocks, num_hit = admit(manager, request)
    assert blocks is not None
    manager.free(request)
    return num_hit


def cached_order(pool):
    return [b for b in pool.free_block_ids() if pool.block_hash(b) is not None]


def test_mamba_states_are_kept_only_at_the_prompt_tail_and_checkpoints(registry):
    # Group 0 full attention, group 1 Mamba, block size 4. A 33-token prompt
    # caches 8 full blocks and 8 states (after 4, 8, ..., 32 tokens); hits are at
    # most 32 tokens (prompt - 1, aligned). Tail 8 tokens: hits ending at 24..32
    # read the states after 24, 28 and 32. Checkpoints: a state costs 1 block, the
    # prefix 1/4 block per token; at a share of 1/4 that is one every 16 tokens:
    # the state after 16. The states after 4, 8, 12 and 20 are not admitted.
    manager, policy = manager_with(
        registry, [full(), mamba()], 40, tail_tokens=8, checkpoint_share=0.25
    )
    request = Request("a", list(range(1, 34)))
    admit(manager, request)
    assert policy._checkpoint_interval() == 16
    full_table, state_table = manager.get_block_ids("a")
    ends = (4, 8, 12, 16, 20, 24, 28, 32)
    prefix = dict(zip(ends, full_table, strict=False))
    state = dict(zip(ends, state_table, strict=False))
    manager.free(request)  # full attention freed first (tail first), then the states
    assert cached_order(manager.block_pool) == [
        # Not admitted: right after the hashless blocks, in the order freed.
        state[20],
        state[12],
        state[8],
        state[4],
        # The chain from its tail, each admitted state behind the prefix block
        # ending at the same token.
        prefix[32],
        state[32],
        prefix[28],
        state[28],
        prefix[24],
        state[24],
        prefix[20],
        prefix[16],
        state[16],
        prefix[12],
        prefix[8],
        prefix[4],
    ]


def test_a_hit_falls_back_to_the_checkpoint_when_the_tail_is_gone(registry):
    manager, _ = manager_with(registry, [full(), mamba()], 40, tail_tokens=8, checkpoint_share=0.25)
    prompt = list(range(1, 34))
    prefill_and_free(manager, Request("a", prompt))
    pool = manager.block_pool
    hashless = len(pool.free_block_ids()) - len(cached_order(pool))
    # Evict the 4 refused states and the chain's last three positions (6 blocks):
    # the longest hit with a state left now ends at the checkpoint, 16 tokens.
    pool.get_new_blocks(hashless + 4 + 6)
    _, num_hit = manager.get_computed_blocks(Request("b", prompt))
    assert num_hit == 16


def test_sliding_window_blocks_kept_for_the_tail_window_only(registry):
    # Window 8: a hit of E tokens reads the blocks covering [E - 7, E), two
    # blocks. A 41-token prompt allows hits up to 40; with no tail and no
    # checkpoints only the hit ending at 40 counts: it reads the window blocks
    # covering [32, 36) and [36, 40) (indices 8 and 9).
    manager, _ = manager_with(registry, [full(), window(8)], 60, tail_tokens=0, checkpoint_share=0)
    request = Request("a", list(range(1, 42)))
    admit(manager, request)
    prefix, windows = manager.get_block_ids("a")
    manager.free(request)
    assert cached_order(manager.block_pool) == [
        *[windows[i] for i in range(7, -1, -1)],  # refused, in the order freed
        prefix[9],
        windows[9],
        prefix[8],
        windows[8],
        *[prefix[i] for i in range(7, -1, -1)],
    ]
    _, num_hit = manager.get_computed_blocks(Request("b", list(range(1, 42))))
    assert num_hit == 40


def test_frequency_keeps_a_hit_block_longer_than_newer_never_hit_ones(make_manager):
    shared = list(range(1, 9))  # two full blocks of 4
    orders = {}
    for policy in ("lru", "frequency"):
        manager = make_manager(num_blocks=12, block_size=4, eviction=policy)
        prefill_and_free(manager, Request("a", [*shared, 100]))  # blocks 1, 2 (+3 partial)
        assert prefill_and_free(manager, Request("b", [*shared, 200])) == 8  # 1, 2 hit; 4
        prefill_and_free(manager, Request("c", list(range(50, 59))))  # 5, 6 (+7), never hit
        orders[policy] = cached_order(manager.block_pool)
    # LRU: freed order, each request's tail first. Frequency: blocks 2 and 1 were
    # hit once, a credit of one pool turnover (11 releases): due at 14 and 15,
    # after 6 and 5 (released 5th and 6th, no credit).
    assert orders["lru"] == [2, 1, 6, 5]
    assert orders["frequency"] == [6, 5, 2, 1]


def test_a_hit_count_saturates_in_the_top_hit_level(make_manager):
    # frequency's classes: 1 + the hit level, min(hits, 2) (no depth levels).
    # A block hit 12 times (its count saturates at 7) is in class 3, as one hit
    # twice; a block hit once is in class 2.
    manager = make_manager(num_blocks=12, block_size=4, eviction="frequency")
    queues = manager.block_pool._queue  # either backend's: both tell a free block's class

    def free_block_of(prefix):
        blocks, num_hit = manager.get_computed_blocks(Request("probe", [*prefix, 999]))
        assert num_hit == 4
        return blocks.get_block_ids()[0][0]

    for index in range(13):  # the first caches the block, the next 12 hit it
        prefill_and_free(manager, Request(f"r{index}", [1, 2, 3, 4, 100 + index]))
    for index in range(2):
        prefill_and_free(manager, Request(f"s{index}", [20, 21, 22, 23, 200 + index]))
    assert queues.class_of(free_block_of([1, 2, 3, 4])) == 3
    assert queues.class_of(free_block_of([20, 21, 22, 23])) == 2


def test_hit_credits_beyond_the_saturated_count_are_refused():
    info = PoolInfo(num_blocks=4, groups=(), alignment_tokens=1, view=None)
    with pytest.raises(ValueError, match="hit_credits needs 1 to 8 levels, got 9"):
        ValuePolicy(info, hit_credits=[0.0] * 9)


def test_cost_keeps_a_deeper_chain_longer_once_it_was_hit(make_manager):
    manager = make_manager(num_blocks=60, block_size=512, max_model_len=20000, eviction="cost")
    tokens = list(range(16385))
    prefill_and_free(manager, Request("long", tokens))  # blocks 1..33, 32 cached
    # Never hit: no credit, so LRU's order (the tail first, freed at clocks 1..32).
    assert cached_order(manager.block_pool) == list(range(32, 0, -1))
    # Hit again (a fresh block, 34, holds the last token), then freed at
    # clocks 33..64. The chain is 16,384 tokens deep: depth class
    # bit_length(16384 // 8192) = 2, a credit of 2 x 0.25 turnovers of the
    # 59-block pool, 30 releases: due 63..94. The short request's cached block
    # 35 (never hit, no credit) is freed at clock 65, due 65: it ties with
    # block 30 and goes first (lower class). LRU would give [32 .. 1, 35].
    assert prefill_and_free(manager, Request("again", tokens)) == 16384
    prefill_and_free(manager, Request("short", [-1] * 513))  # blocks 35, 36; 35 cached
    assert cached_order(manager.block_pool) == [32, 31, 35, *range(30, 0, -1)]


# -- every policy keeps every invariant ------------------------------------------------------

CONFIGS = {
    "full": [full()],
    "full+sliding_window": [full(), window(9)],
    "full+mamba": [full(), mamba()],
    "full+window+mamba": [full(), window(13), mamba()],
}


@pytest.mark.parametrize("policy", ["lru", "admit", "frequency", "cost"])
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_random_traffic_keeps_every_invariant(registry, policy, config):
    specs = CONFIGS[config]
    manager = kvcore.KVCacheManager(
        kvcore.KVCacheConfig.from_specs(30 * len(specs), specs),
        512,
        registry=registry,
        hash_algorithm="fast",
        eviction=policy,
    )
    stats = RandomWorkload(manager, seed=len(config) + len(policy), max_running=6).run(1500)
    assert stats.hit_tokens > 0
    assert stats.preemptions > 0
    assert stats.resets > 0


@pytest.mark.parametrize("policy", ["lru", "admit", "frequency", "cost"])
@pytest.mark.parametrize("config", ["full+mamba", "full+window+mamba"])
def test_random_traffic_keeps_every_invariant_in_a_two_level_pool(registry, policy, config):
    """Attention pages and Mamba states in classes of their own; memory moves between them."""
    specs = CONFIGS[config]
    manager = kvcore.KVCacheManager(
        two_level_config(specs, 12 * len(specs)),
        512,
        registry=registry,
        hash_algorithm="fast",
        eviction=policy,
    )
    stats = RandomWorkload(manager, seed=len(config) + len(policy), max_running=6).run(1500)
    assert stats.hit_tokens > 0
    assert stats.preemptions > 0
    assert stats.resets > 0
    assert manager.block_pool.pages.moves > 0  # large pages went from class to class


# -- admission: the per-candidate computation against the per-block rule ----------------


def _admitted_by_the_rule(policy: ValuePolicy, group: int, index: int, prompt: int) -> bool:
    """The admission rule for one block, as the module documentation states it."""
    info = policy._groups[group]
    size = info.block_size
    align = policy._align
    first, stop = index * size, (index + 1) * size
    last_end = (prompt - 1) // align * align

    def reads(hit_end: int) -> bool:
        assert info.tokens_read is not None
        return any(r.start < stop and first < r.stop for r in info.tokens_read(hit_end) if r)

    tail_start = max(0, last_end - policy._tail) // align * align
    candidate = max((first // align + 1) * align, tail_start)
    if candidate <= last_end and reads(candidate):
        return True
    interval = policy._checkpoint_interval()
    if interval:
        candidate = (first // interval + 1) * interval
        if candidate <= last_end and reads(candidate):
            return True
    return False


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    block_size=st.sampled_from([1, 4, 16, 64]),
    align_blocks=st.sampled_from([1, 2, 4]),
    window=st.one_of(st.none(), st.integers(1, 300)),
    tail=st.sampled_from([0, 16, 512]),
    share=st.sampled_from([0.0, 1 / 32, 0.5]),
    prompt=st.integers(1, 6000),
    span=st.tuples(st.integers(0, 400), st.integers(0, 400)),
)
def test_admitted_blocks_follow_the_rule_block_by_block(
    block_size, align_blocks, window, tail, share, prompt, span
):
    """The admission computed per candidate end equals the rule applied to every block."""
    if window is None:
        suffix = MambaSpec(
            block_size=block_size, shapes=((2, 8),), dtypes=("float32",), mamba_cache_mode="align"
        )
    else:
        suffix = SlidingWindowSpec(
            block_size=block_size,
            num_kv_heads=1,
            head_size=8,
            dtype="float16",
            sliding_window=window,
        )
    groups = (GroupInfo(kind="full_attention", block_size=block_size), GroupInfo.of(suffix))
    policy = ValuePolicy(
        PoolInfo(num_blocks=8, groups=groups, alignment_tokens=block_size * align_blocks),
        tail_tokens=tail,
        checkpoint_share=share,
    )
    start, stop = min(span), max(span)
    expected = [i for i in range(start, stop) if _admitted_by_the_rule(policy, 1, i, prompt)]
    assert policy._admitted_indices(1, start, stop, prompt) == expected


@pytest.mark.parametrize("policy", ["admit", "frequency", "cost"])
def test_a_double_free_met_mid_table_changes_nothing(policy: str) -> None:
    """A freed table with a block already at count 0: nothing is released, the queue unchanged."""
    pool = kvcore.managers.BlockPool(12, eviction=policy)
    request = Request("a", list(range(24)))
    kvcore.hashing.BlockHasher(4).update(request)
    table = pool.get_new_blocks(6)
    pool.cache_full_blocks(request, table, 0, 6, 4, 0)  # cached: a valued run
    pool.free_blocks([table[1]])  # freed behind the table's back
    before = (
        [pool.ref_count(block) for block in range(12)],
        pool.free_block_ids(),
        pool.get_num_free_blocks(),
    )
    # Released last block first: table[5] .. table[2] reach 0, then table[1]
    # has no count left.
    with pytest.raises(kvcore.errors.DoubleFreeError, match=f"block {table[1]} "):
        pool.free_blocks(table[::-1])
    after = (
        [pool.ref_count(block) for block in range(12)],
        pool.free_block_ids(),
        pool.get_num_free_blocks(),
    )
    assert after == before
    pool.check_invariants()
