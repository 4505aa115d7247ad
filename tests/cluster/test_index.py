"""The cluster index: each engine's exact hits by each group's own rule; events applied once."""

from __future__ import annotations

import random

import pytest
from clusterhelpers import (
    LAYOUTS,
    Engine,
    engine_hit,
    full,
    layout,
    mamba,
    prompt_hits,
    random_step,
    window,
)

import kvcore
from kvcore.cluster import ClusterIndex, SubmitResult
from kvcore.testing import admit


def feed(index, engine):
    batch = engine.publish()
    if batch is not None:
        index.submit(engine.name, *batch)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_index_answers_what_each_engine_would_hit(make_index, name):
    specs = LAYOUTS[name]
    index = make_index(specs)
    engines = [Engine("a", specs), Engine("b", specs)]
    for engine in engines:
        index.heartbeat(engine.name)
    rng = random.Random(7)
    bases = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    compared = 0
    for step in range(150):
        engine = rng.choice(engines)
        random_step(engine, rng, bases, step)
        feed(index, engine)
        tokens = rng.choice(bases)[: rng.randrange(2, 40)]
        estimate = prompt_hits(index, tokens)
        for other in engines:
            assert estimate[other.name] == engine_hit(other, tokens), (step, other.name)
            compared += estimate[other.name] > 0
    assert compared > 20  # the comparison covered real hits, not only misses


def test_a_window_group_needs_only_its_window(make_index):
    # full + sliding window 4 (block 4): a hit of L tokens needs the full
    # prefix and, of the window group, only the block of tokens [L - 3, L).
    specs = [full(), window()]
    aware, alike = make_index(specs), make_index(specs, hybrid_aware=False)
    engine = Engine("a", specs)
    prompt = list(range(100, 124))  # 6 blocks per group
    request = kvcore.Request("r", prompt)
    admit(engine.manager, request)
    window_blocks = list(engine.manager.coordinator.get_blocks("r")[1])
    request.append_output_token_ids(1)
    engine.manager.allocate_slots(request, 1)  # the window moves on: blocks 0-4 freed
    engine.manager.free(request)
    # The window group's first four blocks are evicted (as LRU would, first).
    engine.manager.block_pool.evict_blocks(window_blocks[:4])
    batch = engine.publish()
    for index in (aware, alike):
        index.submit("a", *batch)
    probe = prompt + [7]
    assert engine_hit(engine, probe) == 24
    assert prompt_hits(aware, probe) == {"a": 24}
    assert prompt_hits(alike, probe) == {"a": 0}  # block 0 of the window group is gone


def test_a_mamba_group_needs_only_the_state_at_the_hit(make_index):
    # full + Mamba (block 4, align mode): a hit of L tokens needs the full
    # prefix and only the state after L tokens.
    specs = [full(), mamba()]
    aware, alike = make_index(specs), make_index(specs, hybrid_aware=False)
    engine = Engine("a", specs)
    prompt = list(range(200, 216))  # 4 blocks per group
    request = kvcore.Request("r", prompt)
    admit(engine.manager, request)
    state_blocks = list(engine.manager.coordinator.get_blocks("r")[1])
    request.append_output_token_ids(1)
    engine.manager.allocate_slots(request, 1)  # earlier states freed: only the last is kept
    engine.manager.free(request)
    engine.manager.block_pool.evict_blocks(state_blocks[:3])
    batch = engine.publish()
    for index in (aware, alike):
        index.submit("a", *batch)
    probe = prompt + [9]
    assert engine_hit(engine, probe) == 16
    assert prompt_hits(aware, probe) == {"a": 16}
    assert prompt_hits(alike, probe) == {"a": 0}


def recorded_run(specs, steps=60, seed=3):
    engine = Engine("a", specs)
    rng = random.Random(seed)
    bases = [[rng.randrange(50) for _ in range(40)] for _ in range(3)]
    for step in range(steps):
        random_step(engine, rng, bases, step)
        engine.publish()
    return engine, bases


def test_out_of_order_and_replayed_batches_give_the_in_order_state(make_index):
    specs = [full(), window()]
    engine, bases = recorded_run(specs)
    batches = engine.batches
    in_order, shuffled = make_index(specs), make_index(specs)
    for batch in batches:
        assert in_order.submit("a", *batch) == SubmitResult.APPLIED
    rng = random.Random(1)
    delivery = batches + rng.sample(batches, 15)  # 15 replays
    rng.shuffle(delivery)
    results = [shuffled.submit("a", *batch) for batch in delivery]
    assert results.count(SubmitResult.DUPLICATE) + shuffled.stats.duplicates >= 15
    shuffled.flush()
    in_order.flush()
    assert shuffled.stats.batches == in_order.stats.batches == len(batches)
    assert shuffled.stats.duplicates == 15
    assert shuffled.missing("a") is None
    assert shuffled.cached_blocks("a") == in_order.cached_blocks("a")
    assert shuffled.cached_blocks("a") == engine.manager.block_pool.num_cached_blocks()
    for base in bases:
        for length in (5, 17, 33):
            assert prompt_hits(shuffled, base[:length]) == prompt_hits(in_order, base[:length])
            assert prompt_hits(shuffled, base[:length])["a"] == engine_hit(engine, base[:length])


def test_a_replayed_batch_is_not_counted_twice(make_index):
    specs = [full()]
    engine = Engine("a", specs)
    admit(engine.manager, kvcore.Request("r", list(range(20))))
    index = make_index(specs)
    batch = engine.publish()
    assert index.submit("a", *batch) == SubmitResult.APPLIED
    assert index.cached_blocks("a") == 5
    assert index.submit("a", *batch) == SubmitResult.DUPLICATE
    assert index.cached_blocks("a") == 5
    assert index.stats.batches == 1


def test_a_gap_that_replay_cannot_fill_is_resynced_without_stale_entries(make_index):
    specs = [full()]
    engine = Engine("a", specs, num_blocks=11)
    first = kvcore.Request("r1", list(range(40)))  # 10 blocks: the whole pool
    admit(engine.manager, first)
    b0 = engine.publish()
    engine.manager.free(first)
    admit(engine.manager, kvcore.Request("r2", list(range(1000, 1008))))  # evicts 2 of r1's
    b1 = engine.publish()  # lost
    admit(engine.manager, kvcore.Request("r3", list(range(2000, 2008))))
    b2 = engine.publish()
    index = make_index(specs)
    index.submit("a", *b0)
    assert index.submit("a", *b2) == SubmitResult.BUFFERED
    assert index.missing("a") == 1
    assert prompt_hits(index, list(range(41)))["a"] == 40  # b1's evictions not seen yet
    index.resync("a")
    assert index.missing("a") is None
    # Everything before the gap is dropped: r1's blocks (its last four were
    # evicted in the lost batches) are no longer claimed, an under-estimate of
    # the engine's 24 tokens, never the stale 40; r3's blocks, stored after the gap, are.
    assert engine_hit(engine, list(range(41))) == 24
    assert prompt_hits(index, list(range(41)))["a"] == 0
    assert prompt_hits(index, list(range(2000, 2009)))["a"] == 8
    assert index.cached_blocks("a") == 2
    assert index.stats.resyncs == 1
    b1_late = b1
    assert index.submit("a", *b1_late) == SubmitResult.DUPLICATE


def test_a_restarted_engine_is_followed_from_its_new_numbering(make_index):
    specs = [full(), window()]
    old = Engine("a", specs)
    admit(old.manager, kvcore.Request("r", list(range(32))))
    index = make_index(specs)
    index.submit("a", *old.publish())
    admit(old.manager, kvcore.Request("s", list(range(100, 132))))
    index.submit("a", *old.publish())
    assert prompt_hits(index, list(range(33)))["a"] == 32
    # Crash and restart: an empty cache, numbering from 0, a later clock.
    new = Engine("a", specs)
    new.clock = old.clock + 10
    admit(new.manager, kvcore.Request("t", list(range(300, 316))))
    assert index.submit("a", *new.publish()) == SubmitResult.RESTARTED
    assert prompt_hits(index, list(range(33)))["a"] == 0
    assert prompt_hits(index, list(range(300, 317)))["a"] == 16
    assert index.cached_blocks("a") == new.manager.block_pool.num_cached_blocks()
    assert index.stats.restarts == 1


def test_all_blocks_cleared_empties_the_engine(make_index):
    specs = [full()]
    engine = Engine("a", specs)
    request = kvcore.Request("r", list(range(20)))
    admit(engine.manager, request)
    engine.manager.free(request)
    assert engine.manager.reset_prefix_cache()
    index = make_index(specs)
    index.submit("a", *engine.publish())
    assert isinstance(engine.batches[0][2][-1], kvcore.events.AllBlocksCleared)
    assert index.cached_blocks("a") == 0
    assert prompt_hits(index, list(range(21)))["a"] == 0


def test_an_engine_silent_past_the_heartbeat_timeout_is_dropped(make_index):
    now = [0.0]
    specs = [full()]
    index = make_index(specs, heartbeat_timeout_s=5.0, clock=lambda: now[0])
    a, b = Engine("a", specs), Engine("b", specs)
    for engine in (a, b):
        admit(engine.manager, kvcore.Request(engine.name, list(range(20))))
        index.submit(engine.name, *engine.publish())
    assert prompt_hits(index, list(range(21))) == {"a": 20, "b": 20}
    now[0] = 4.0
    index.heartbeat("a")  # b crashed: no batch, no heartbeat
    now[0] = 6.0
    assert index.live_engines() == ["a"]
    assert prompt_hits(index, list(range(21))) == {"a": 20}
    assert index.stats.expired == 1
    assert index.backend.cached_blocks("b") == 0


def test_bad_submissions_are_refused_with_the_field_named():
    index = ClusterIndex(layout([full()]))
    with pytest.raises(
        kvcore.errors.InvalidConfigError,
        match=r"seq must be an integer >= 0 and below 2\*\*53, got -1",
    ):
        index.submit("a", -1, 0.0, [])
    with pytest.raises(kvcore.errors.InvalidConfigError, match="engine must be a non-empty string"):
        index.submit("", 0, 0.0, [])
    with pytest.raises(kvcore.errors.InvalidConfigError, match="heartbeat_timeout_s must be > 0"):
        ClusterIndex(layout([full()]), heartbeat_timeout_s=0)
    assert index.live_engines() == []


@pytest.mark.parametrize("name", ["full+window", "full+mamba"])
def test_prompts_longer_than_a_first_fetch_match_the_engine(make_index, name):
    # Redis fetches the first 64 blocks of every engine, then the rest of the
    # engines whose search goes further: prompts of up to 100 blocks cross it.
    specs = LAYOUTS[name]
    index = make_index(specs, num_blocks=600)
    engines = [Engine("a", specs, num_blocks=600), Engine("b", specs, num_blocks=600)]
    rng = random.Random(11)
    bases = [[rng.randrange(50) for _ in range(400)] for _ in range(3)]
    for engine, base in zip(engines, bases, strict=False):
        for length in (300, 396):
            request = kvcore.Request(f"{engine.name}{length}", base[:length])
            admit(engine.manager, request)
            engine.manager.free(request)
        index.submit(engine.name, *engine.publish())
    for base in bases:
        for length in (250, 300, 397, 400):
            estimate = prompt_hits(index, base[:length])
            assert estimate == {e.name: engine_hit(e, base[:length]) for e in engines}
    assert prompt_hits(index, bases[0][:397])["a"] == 396
