"""Both backends, the same traffic, the same state after every step.

Two managers built alike, one on the Python block pool (the specification)
and one on the native pool, are driven by the same random engine
(:class:`kvcore.testing.RandomWorkload`: prefix hits, revivals of freed
cached blocks, eviction, chunked prefill, decode with lookahead, external
tokens, preemption, resets), for every attention type the core serves, with
EAGLE and under every built-in eviction policy (``lru`` in C, the others in
Python beside the compiled counts and map). After every step, everything
observable must be equal: what the step returned or raised, the workload's
counters, and the full
snapshot (reference counts, free-queue order, each block's hash and group,
the cache map with its duplicates, pending events, every block table).

Faults: with ``faults`` on, every engine-facing call first runs once with a
fault injected after one of the pool's batched operations completed (so
the native side has changed its arrays before the error); the call must
change nothing on either backend, and the same call then runs for real.

A second, pool-level machine calls the pool's public methods directly,
including the rare paths (a hash cached twice in one group, forced
evictions, reserved blocks, resets) that the engine traffic reaches seldom.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from native_backend import native_hashing_built, require_native
from pool_state import pool_state
from tiny_specs import full, mamba, sw

import kvcore
from kvcore import KVCacheManager, Request
from kvcore._block_pool import BlockPool
from kvcore.errors import KVCoreError
from kvcore.testing import RandomWorkload, snapshot
from kvcore_plugins.chunked_local import ChunkedLocalAttentionSpec
from kvcore_plugins.cross_attention import CrossAttentionSpec

REGISTRY = kvcore.load_registry()


def chunked(chunk: int, block_size: int = 4) -> ChunkedLocalAttentionSpec:
    return ChunkedLocalAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        head_size=1,
        dtype="float32",
        attention_chunk_size=chunk,
    )


def cross(block_size: int = 4) -> CrossAttentionSpec:
    return CrossAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype="float32")


#: name -> (specs, encoder tokens per request, manager options)
CONFIGS: dict[str, tuple[list[Any], int, dict[str, Any]]] = {
    "full": ([full()], 0, {}),
    "full, no caching": ([full()], 0, {"enable_caching": False}),
    "sliding_window": ([sw(6)], 0, {}),
    "full+sliding_window": ([full(), sw(9)], 0, {}),
    "full+mamba": ([full(), mamba(num_speculative_blocks=1)], 0, {}),
    "mamba": ([mamba(num_speculative_blocks=2)], 0, {}),
    "full+chunked_local": ([full(), chunked(8)], 0, {}),
    # Cross attention's KV is per request: such a model is never prefix cached.
    "full+cross": ([full(), cross()], 20, {"enable_caching": False}),
}

MAX_MODEL_LEN = 256
#: The built-in online policies (the offline ``belady`` needs the future).
POLICIES = ("lru", "admit", "frequency", "cost")


def managers(
    specs: list[Any], num_blocks: int, **kwargs: Any
) -> tuple[KVCacheManager, KVCacheManager]:
    config = kvcore.KVCacheConfig.from_specs(num_blocks, specs)
    built = tuple(
        KVCacheManager(
            config,
            MAX_MODEL_LEN,
            registry=REGISTRY,
            enable_kv_cache_events=True,
            backend=backend,
            **kwargs,
        )
        for backend in ("python", "native")
    )
    assert [manager.backend for manager in built] == ["python", "native"]
    return built  # type: ignore[return-value]


def outcome(call: Callable[[], object]) -> object:
    try:
        return ("returned", call())
    except (KVCoreError, AssertionError) as error:
        return ("raised", type(error).__name__, str(error))


# -- faults: a failure after a batched pool operation, on either backend -------------------

FAULT_POINTS = ("_take", "_release", "_touch", "_cache_full_blocks", "_uncache")


class Fault(Exception):
    """The injected failure."""


class Faults:
    """Raises :class:`Fault` after the ``due``-th armed pool operation completed."""

    def __init__(self) -> None:
        self.armed = False
        self.due = 0
        self.fired = 0

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def operation(pool: BlockPool, *args: Any) -> Any:
            result = original(pool, *args)
            if self.armed:
                self.due -= 1
                if self.due == 0:
                    self.armed = False
                    self.fired += 1
                    raise Fault
            return result

        return operation


def install_faults(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    from kvcore._native_pool import NativeBlockPool, NativePolicyPool

    for cls in (BlockPool, NativeBlockPool, NativePolicyPool):
        for name in FAULT_POINTS:
            if name in vars(cls):
                monkeypatch.setattr(cls, name, faults.wrap(vars(cls)[name]))


def unordered(state: tuple[Any, ...]) -> tuple[Any, ...]:
    """A :func:`~kvcore.testing.snapshot` with each pool's free blocks as a set."""
    pools = tuple((pool[0], frozenset(pool[1]), *pool[2:]) for pool in state[0])
    return (pools, *state[1:])


def fail_first(manager: KVCacheManager, faults: Faults, due: int, exact: bool = True) -> None:
    """Make each engine-facing call of ``manager`` fail once first (and change nothing).

    ``exact=False``: the free blocks' order may change (a policy whose undo
    is a compensating release, see the engine-boundary docs), nothing else.
    """
    view = (lambda state: state) if exact else unordered
    for name in ("allocate_slots", "free", "reset_prefix_cache"):
        original = getattr(manager, name)

        def call(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            before = view(snapshot(manager))
            faults.armed, faults.due = True, due
            try:
                # A call with fewer pool operations than ``due`` runs for real.
                return _original(*args, **kwargs)
            except Fault:
                assert view(snapshot(manager)) == before, "a failed call changed state"
            finally:
                faults.armed = False
            return _original(*args, **kwargs)

        setattr(manager, name, call)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@given(
    seed=st.integers(0, 2**32 - 1),
    num_blocks=st.integers(12, 80),
    use_eagle=st.booleans(),
    hash_algorithm=st.sampled_from(["fast", "sha256"]),
    eviction=st.sampled_from(POLICIES),
)
@settings(max_examples=12, deadline=None)
def test_both_backends_agree_after_every_step(
    config: str, seed: int, num_blocks: int, use_eagle: bool, hash_algorithm: str, eviction: str
) -> None:
    require_native()
    specs, encoder, options = CONFIGS[config]
    # Chunked local attention refuses EAGLE with prefix caching.
    use_eagle = use_eagle and "chunked" not in config
    pair = managers(
        specs,
        num_blocks,
        use_eagle=use_eagle,
        hash_algorithm=hash_algorithm,
        eviction=eviction,
        **options,
    )
    # The native manager hashes in C where that module is built (the Python one never).
    assert pair[0]._hasher._chain is None
    assert (pair[1]._hasher._chain is not None) == native_hashing_built()
    loads = [
        RandomWorkload(manager, seed=seed, num_encoder_tokens=encoder, check_every=25)
        for manager in pair
    ]
    for step in range(200):
        results = [outcome(load.step) for load in loads]
        assert results[0] == results[1], f"step {step}"
        assert snapshot(pair[0]) == snapshot(pair[1]), f"step {step}"
        assert loads[0].stats == loads[1].stats, f"step {step}"
        assert pair[0].take_events() == pair[1].take_events(), f"step {step}"


@pytest.mark.parametrize("config", ["full", "full+sliding_window", "full+mamba"])
@given(
    seed=st.integers(0, 2**32 - 1),
    due=st.integers(1, 4),
    use_eagle=st.booleans(),
    eviction=st.sampled_from(POLICIES),
)
@settings(max_examples=8, deadline=None)
def test_a_fault_part_way_is_undone_alike_on_both_backends(
    config: str, seed: int, due: int, use_eagle: bool, eviction: str
) -> None:
    require_native()
    with pytest.MonkeyPatch.context() as monkeypatch:
        faults = Faults()
        install_faults(monkeypatch, faults)
        specs, encoder, options = CONFIGS[config]
        pair = managers(
            specs, 30, use_eagle=use_eagle, hash_algorithm="fast", eviction=eviction, **options
        )
        for manager in pair:
            fail_first(manager, faults, due, exact=eviction == "lru")
        loads = [RandomWorkload(manager, seed=seed, num_encoder_tokens=encoder) for manager in pair]
        for step in range(120):
            results = [outcome(load.step) for load in loads]
            assert results[0] == results[1], f"step {step}"
            assert snapshot(pair[0]) == snapshot(pair[1]), f"step {step}"
        # Both backends saw the same faults; the first pool operation of
        # every allocation that takes blocks fails at least once.
        assert faults.fired % 2 == 0
        assert faults.fired > 0 or due > 1


def test_the_fault_driver_sees_partial_native_work_undone() -> None:
    """Hand-worked: a fault after a native take is undone, queue order and all."""
    require_native()
    from kvcore._native_pool import NativeBlockPool

    pool = NativeBlockPool(8)
    pool.free_blocks(pool.get_new_blocks(3)[::-1])  # queue: 4 5 6 7 3 2 1
    assert pool.free_block_ids() == [4, 5, 6, 7, 3, 2, 1]
    taken: list[int] = []

    def take_then_fail() -> None:
        with pool.transaction():
            taken.extend(pool._take(5))
            assert pool.get_num_free_blocks() == 2
            raise Fault

    with pytest.raises(Fault):
        take_then_fail()
    assert taken == [4, 5, 6, 7, 3]
    assert pool.free_block_ids() == [4, 5, 6, 7, 3, 2, 1]
    assert list(pool._ref) == [0] * 8
    assert pool.get_num_free_blocks() == 7


# -- the pool's public methods, rare paths included ----------------------------------------


def free_set(state: tuple[object, ...]) -> tuple[object, ...]:
    """A :func:`pool_state` with the free blocks as a set (their order left out)."""
    free = state[1]
    assert isinstance(free, tuple)
    return (*state[:1], frozenset(free), *state[2:])


class TwoPools(RuleBasedStateMachine):
    """The same public pool calls on a Python and a native pool of two groups."""

    @initialize(
        num_blocks=st.integers(2, 24),
        caching=st.booleans(),
        events=st.booleans(),
        keys=st.sampled_from([None, 8, 16, 32, "int"]),
        eviction=st.sampled_from(POLICIES),
    )
    def build(
        self, num_blocks: int, caching: bool, events: bool, keys: int | str | None, eviction: str
    ) -> None:
        from kvcore._native_pool import NativeBlockPool

        options: dict[str, Any] = {
            "enable_caching": caching,
            "num_groups": 2,
            "enable_kv_cache_events": events,
            "digest_size": keys if isinstance(keys, int) else None,
            "int_hashes": keys == "int",
            "eviction": eviction,
        }
        # With a digest size (or int hashes) the native pool keeps its map as
        # digests in C: the hashes are then bytes of that width (ints spread
        # over the signed 64-bit range), else any hashable.
        self.key: Callable[[int], Hashable]
        if keys is None:
            self.key = lambda v: ("h", v)
        elif keys == "int":
            self.key = lambda v: (v * 0x9E3779B97F4A7C15) % 2**64 - 2**63
        else:
            width = keys
            self.key = lambda v: bytes([v]) * width
        self.eviction = eviction
        self.pools = (BlockPool(num_blocks, **options), NativeBlockPool(num_blocks, **options))
        self.held: list[int] = []  # blocks this machine holds (a count each), both pools alike
        self.next_request = 0

    def both(self, call: Callable[[BlockPool], object]) -> object:
        results = [outcome(lambda pool=pool: call(pool)) for pool in self.pools]
        assert results[0] == results[1]
        return results[0]

    @rule(count=st.integers(0, 6))
    def take(self, count: int) -> None:
        result = self.both(lambda pool: pool.get_new_blocks(count))
        if result[0] == "returned":
            self.held += result[1]  # type: ignore[index]

    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        if not self.held:
            return
        picked = data.draw(st.lists(st.sampled_from(self.held), max_size=6))
        # A block picked more often than held is a double free: both must refuse it alike.
        result = self.both(lambda pool: pool.free_blocks(picked))
        if result[0] == "returned":
            for block in picked:
                self.held.remove(block)

    @rule(data=st.data(), group=st.integers(0, 1), values=st.lists(st.integers(0, 3), max_size=5))
    def cache(self, data: st.DataObject, group: int, values: list[int]) -> None:
        """Cache some held blocks under hashes from a small set (so duplicates happen)."""
        if not self.pools[0].enable_caching:
            return  # managers cache nothing then (the pool would not evict on reuse)
        uncached = [b for b in dict.fromkeys(self.held) if self.pools[0].block_hash(b) is None]
        blocks = data.draw(st.lists(st.sampled_from(uncached), unique=True)) if uncached else []
        blocks = blocks[: len(values)]
        if not blocks:
            return
        hashes: list[Hashable] = [self.key(v) for v in values[: len(blocks)]]
        self.next_request += 1
        requests = {}
        for pool in self.pools:
            # A Request of its own for each pool (a request belongs to one).
            request = Request(f"r{self.next_request}", [0] * len(blocks))
            request.block_hashes.extend(hashes)
            requests[id(pool)] = request
        self.both(
            lambda pool: pool.cache_full_blocks(
                requests[id(pool)], blocks, 0, len(blocks), 1, group
            )
        )

    @rule(
        values=st.lists(st.integers(0, 3), max_size=5),
        group=st.integers(0, 1),
        nulls=st.integers(0, 2),
    )
    def hit(self, values: list[int], group: int, nulls: int) -> None:
        """Adopt a cached prefix, with null blocks in front (to be ignored)."""
        hashes = [self.key(v) for v in values]
        found = self.both(lambda pool: pool.match_prefix(hashes, 0, len(hashes), [group]))
        blocks = [0] * nulls + found[1][0]  # type: ignore[index]
        self.both(lambda pool: pool.count_evictable(blocks))
        self.both(lambda pool: pool.touch(blocks))
        self.held += [b for b in blocks if b]

    @rule(values=st.lists(st.integers(0, 3), max_size=4))
    def match_both_groups(self, values: list[int]) -> None:
        hashes = [self.key(v) for v in values]
        self.both(lambda pool: pool.match_prefix(hashes, 0, len(hashes), [0, 1]))
        self.both(lambda pool: [pool.cached_blocks(h, g) for h in hashes for g in (0, 1)])

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        blocks = data.draw(st.lists(st.integers(0, self.pools[0].num_blocks - 1), max_size=4))
        self.both(lambda pool: pool.evict_blocks(blocks))

    @rule()
    def reset(self) -> None:
        self.both(lambda pool: pool.reset_prefix_cache())

    @rule(count=st.integers(0, 2))
    def reserve(self, count: int) -> None:
        self.both(lambda pool: pool.reserve_blocks(count))

    @rule(count=st.integers(1, 6), data=st.data())
    def failed_transaction(self, count: int, data: st.DataObject) -> None:
        """Take, free, touch inside a transaction that then fails: nothing may change."""
        before = [pool_state(pool) for pool in self.pools]
        frees = data.draw(st.lists(st.sampled_from(self.held), max_size=3)) if self.held else []

        def run_then_fail(pool: BlockPool) -> None:
            with pool.transaction():
                outcome(lambda: pool.get_new_blocks(count))
                outcome(lambda: pool.free_blocks(frees))
                raise Fault

        for pool in self.pools:
            with pytest.raises(Fault):
                run_then_fail(pool)
        after = [pool_state(pool) for pool in self.pools]
        assert after[0] == after[1]
        if self.eviction != "lru":
            # The value policies undo a take by a release (engine-boundary
            # docs): the free set comes back, their order may not.
            after, before = [free_set(s) for s in after], [free_set(s) for s in before]
        assert after == before

    @rule()
    def take_events(self) -> None:
        self.both(lambda pool: pool.take_events())

    @invariant()
    def agree(self) -> None:
        if hasattr(self, "pools"):
            assert pool_state(self.pools[0]) == pool_state(self.pools[1])
            for pool in self.pools:
                pool.check_invariants()


def test_the_pool_methods_agree_on_both_backends() -> None:
    require_native()
    TwoPools.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
    TwoPools.TestCase().runTest()
