"""The eviction-policy seam: the pool reports every event to its policy, and only asks it.

A recording policy wraps an LRU written against the public protocol (the
list-based reference of ``protocol_adapters``), logs every call and checks,
on every call, what the protocol promises the policy (``take`` never asks
for more than is free, ``release`` never gets a free block, ``revive`` only
gets free cached blocks, ``hit`` only blocks in use). The expected call logs
are worked out by hand from the scenario.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from types import ModuleType, SimpleNamespace

import pytest
from protocol_adapters import ExactThroughTheProtocol, ReferenceLRU, ThroughTheProtocol

import kvcore
from kvcore import Request
from kvcore._backend import native_available
from kvcore._eviction.driver import PolicyDriver
from kvcore._eviction.lru import LRUFreeQueue
from kvcore._eviction.policies import ValuePolicy
from kvcore._eviction.queue import FreeQueue
from kvcore.errors import (
    HookImplementationError,
    InvalidConfigError,
    PluginConflictError,
    UnknownEvictionPolicyError,
)
from kvcore.eviction import EvictionPolicy, PoolInfo
from kvcore.testing import RandomWorkload, admit
from kvcore_plugins.full_attention import FullAttentionSpec
from kvcore_plugins.mamba import MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowSpec


class RecordingPolicy:
    """LRU order, every call logged and checked against the protocol's guarantees."""

    def __init__(self, info: PoolInfo) -> None:
        self.info = info
        self.inner = ReferenceLRU(info.num_blocks)
        self.calls: list[tuple[object, ...]] = []
        self.free = set(range(info.num_blocks))

    def take(self, n: int) -> list[int]:
        assert 0 <= n <= len(self.free), f"take({n}) with {len(self.free)} free"
        blocks = self.inner.take(n)
        assert len(set(blocks)) == n
        assert set(blocks) <= self.free
        self.free.difference_update(blocks)
        self.calls.append(("take", n, blocks))
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        assert blocks, "release of nothing"
        assert 0 not in blocks, "the null block was released"
        assert not self.free.intersection(blocks), f"release of free blocks {blocks}"
        assert len(set(blocks)) == len(blocks)
        self.free.update(blocks)
        self.inner.release(blocks)
        self.calls.append(("release", list(blocks)))

    def revive(self, block: int) -> None:
        assert block in self.free, f"revive of block {block}, which is not free"
        view = self.info.view
        assert view is not None
        assert view.block_hash(block) is not None
        self.free.discard(block)
        self.inner.revive(block)
        self.calls.append(("revive", block))

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        assert 0 <= start < stop <= len(blocks)
        assert stop <= len(block_hashes)
        view = self.info.view
        assert view is not None
        for index in range(start, stop):
            block = blocks[index]
            if block:
                assert block not in self.free
                assert view.block_hash(block) == block_hashes[index]
                assert view.block_group(block) == group
                assert view.is_cached(block_hashes[index], group)
        self.calls.append(("cached", group, list(blocks[start:stop]), start, num_prompt_tokens))

    def hit(self, blocks: Sequence[int]) -> None:
        assert not self.free.intersection(b for b in blocks if b), "hit on a free block"
        self.calls.append(("hit", list(blocks)))

    def forget(self, blocks: Sequence[int] | None) -> None:
        self.calls.append(("forget", None if blocks is None else list(blocks)))

    def __iter__(self) -> Iterator[int]:
        return iter(self.inner)


def recording_manager(make_manager, **kwargs):
    policies: list[RecordingPolicy] = []

    def factory(info: PoolInfo) -> RecordingPolicy:
        policies.append(RecordingPolicy(info))
        return policies[-1]

    manager = make_manager(eviction=factory, **kwargs)
    (policy,) = policies
    return manager, policy


def test_the_pool_reports_every_event_and_the_policy_alone_chooses(make_manager):
    manager, policy = recording_manager(make_manager, num_blocks=11, block_size=4)
    pool = manager.block_pool
    assert policy.info.num_blocks == 11
    assert policy.info.alignment_tokens == 4
    (group,) = policy.info.groups
    assert (group.kind, group.block_size, group.reads_whole_prefix) == ("full_attention", 4, True)
    # The null block is the first block ever taken, when the pool is built.
    assert policy.calls == [("take", 1, [0])]

    # a: 10 tokens, 3 blocks, the first 2 full and cached.
    a = Request("a", list(range(1, 11)))
    admit(manager, a)
    assert policy.calls[1:] == [("take", 3, [1, 2, 3]), ("cached", 0, [1, 2], 0, 10)]
    manager.free(a)
    assert policy.calls[3:] == [("release", [3, 2, 1])]

    # b shares a's first 8 tokens: blocks 1 and 2 are revived, then reported hit;
    # one more block is taken (fresh blocks first: 4) and its third block cached.
    b = Request("b", [*range(1, 9), 50, 51, 52, 53])
    _, num_hit = admit(manager, b)
    assert num_hit == 8
    assert policy.calls[4:] == [
        ("revive", 1),
        ("revive", 2),
        ("hit", [1, 2]),
        ("take", 1, [4]),
        ("cached", 0, [4], 2, 12),
    ]
    manager.free(b)
    assert policy.calls[9:] == [("release", [4, 2, 1])]
    assert pool.free_block_ids() == list(policy) == [5, 6, 7, 8, 9, 10, 3, 4, 2, 1]
    assert pool.num_free == manager.num_free_blocks == 10

    manager.evict_blocks([1, 3])  # 3 carries no hash: only 1 is forgotten
    assert policy.calls[10:] == [("forget", [1])]
    assert manager.reset_prefix_cache()
    assert policy.calls[11:] == [("forget", None)]


def test_lookups_never_reach_the_policy(make_manager):
    manager, policy = recording_manager(make_manager, num_blocks=11, block_size=4)
    a = Request("a", list(range(1, 11)))
    admit(manager, a)
    before = list(policy.calls)
    manager.get_computed_blocks(Request("c", list(range(1, 11))))
    assert policy.calls == before


def test_a_recorded_policy_gives_the_default_block_ids(make_manager):
    """The reference LRU behind the protocol gives the built-in queue's blocks exactly.

    The pool decides no order itself, and the built-in queue's list with
    stale entries hands out what a plain list of free blocks would.
    """
    default = make_manager(num_blocks=40, block_size=4, hash_algorithm="fast")
    recorded, _ = recording_manager(
        make_manager, num_blocks=40, block_size=4, hash_algorithm="fast"
    )
    results = []
    for manager in (default, recorded):
        workload = RandomWorkload(manager, seed=11, max_running=5)
        stats = workload.run(600)
        results.append((stats, manager.block_pool.free_block_ids(), list(manager.block_pool._hash)))
    assert results[0] == results[1]
    assert results[0][0].hit_tokens > 0
    assert results[0][0].preemptions > 0


def _full() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")


HYBRIDS = {
    "full+sliding_window": [
        _full(),
        SlidingWindowSpec(
            block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=9
        ),
    ],
    "full+mamba": [
        _full(),
        MambaSpec(block_size=4, shapes=((2, 8),), dtypes=("float32",), mamba_cache_mode="align"),
    ],
}


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_random_traffic_keeps_the_protocol_on_hybrids(name):
    registry = kvcore.load_registry(environ={})
    specs = HYBRIDS[name]
    config = kvcore.KVCacheConfig.from_specs(70, specs)
    policies: list[RecordingPolicy] = []

    def factory(info: PoolInfo) -> RecordingPolicy:
        policies.append(RecordingPolicy(info))
        return policies[-1]

    manager = kvcore.KVCacheManager(
        config, 512, registry=registry, hash_algorithm="fast", eviction=factory
    )
    (policy,) = policies
    full_info, other = policy.info.groups
    assert full_info.reads_whole_prefix
    assert not other.reads_whole_prefix
    # A hit of 40 tokens reads the window's last 8 tokens (window 9), or one state.
    window = (range(32, 40),) if name == "full+sliding_window" else (range(39, 40),)
    assert other.tokens_read(40) == window
    stats = RandomWorkload(manager, seed=5, max_running=6).run(1500)
    assert stats.hit_tokens > 0
    assert stats.preemptions > 0
    kinds = {call[0] for call in policy.calls}
    assert kinds == {"take", "release", "revive", "cached", "hit", "forget"}


def test_unknown_policy_names_list_the_available_ones(make_manager):
    unknown = r"unknown eviction policy 'lur'.*lru"
    with pytest.raises(UnknownEvictionPolicyError, match=unknown) as e:
        make_manager(eviction="lur")
    assert "Did you mean 'lru'?" in str(e.value)
    with pytest.raises(UnknownEvictionPolicyError, match="kvcore simulate --eviction belady"):
        make_manager(eviction="belady")
    with pytest.raises(UnknownEvictionPolicyError, match="a policy name or a factory"):
        make_manager(eviction=3)


def test_a_policy_missing_methods_is_refused_by_name(make_manager):
    def incomplete(info: PoolInfo) -> object:
        return SimpleNamespace(take=lambda n: list(range(n)), release=print)

    with pytest.raises(HookImplementationError, match="without revive, cached, hit, forget"):
        make_manager(eviction=incomplete)


def test_a_policy_must_hand_out_the_null_block_first(make_manager):
    class Backwards(ReferenceLRU):
        def take(self, n: int) -> list[int]:
            return [len(self.free) - 1 - i for i in range(n)]

    with pytest.raises(InvalidConfigError, match="must be the null block 0"):
        make_manager(eviction=lambda info: Backwards(info.num_blocks))


def test_the_pool_reaches_every_policy_through_one_free_queue_interface():
    """Built-in policies are free queues; any other policy is driven through the protocol."""
    assert isinstance(ReferenceLRU(4), EvictionPolicy)
    for name in kvcore.available_eviction_policies():
        pool = kvcore.managers.BlockPool(8, eviction=name)
        assert isinstance(pool._queue, FreeQueue), name
        assert not isinstance(pool._queue, PolicyDriver), name
    third_party = kvcore.managers.BlockPool(8, eviction=lambda info: ReferenceLRU(info.num_blocks))
    assert isinstance(third_party._queue, PolicyDriver)
    assert isinstance(third_party._queue, FreeQueue)
    assert isinstance(third_party._queue.policy, ReferenceLRU)


class MostRecentlyFreedFirst(ReferenceLRU):
    """Newest free block first (a toy third-party policy; O(free blocks) per take)."""

    # What was never used is not restored by an undo: the driver compensates.
    exact_undo = False

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self.never_used = set(range(num_blocks))

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            # Never-allocated blocks still go first, in id order (the pool
            # requires the null block first).
            block = self.free[0] if self.free[0] in self.never_used else self.free[-1]
            self.revive(block)
            self.never_used.discard(block)
            out.append(block)
        return out


def policy_plugin(policies: object) -> ModuleType:
    plugin = ModuleType("toy_policies")
    plugin.kvcore_eviction_policies = kvcore.hookimpl(lambda: policies)  # type: ignore[attr-defined]
    return plugin


def test_plugins_register_policies_through_the_hook(registry):
    mru = policy_plugin({"mru": lambda info: MostRecentlyFreedFirst(info.num_blocks)})
    full = kvcore.load_registry(plugins={"mru": mru}, only=["full_attention", "mru"])
    assert list(full.eviction_policies) == ["mru"]
    assert "mru" in kvcore.available_eviction_policies(full)
    assert "mru" not in kvcore.available_eviction_policies()
    config = kvcore.KVCacheConfig.from_specs(
        6, [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype="float32")]
    )
    manager = kvcore.KVCacheManager(config, 64, registry=full, eviction="mru")
    a, b = Request("a", list(range(1, 9))), Request("b", list(range(20, 28)))
    admit(manager, a)  # takes 1, 2
    admit(manager, b)  # takes 3, 4
    manager.free(a)  # frees 2 then 1
    manager.free(b)  # frees 4 then 3: 3 is the most recent
    blocks, _ = admit(manager, Request("c", list(range(40, 52))))
    assert blocks.get_block_ids() == ([5, 3, 4],)  # the fresh block first, then the newest
    # Without the plugin the name is unknown, and the message says where names come from.
    with pytest.raises(UnknownEvictionPolicyError, match="kvcore_eviction_policies hook"):
        kvcore.KVCacheManager(config, 64, registry=registry, eviction="mru")


def test_policy_names_are_claimed_once(registry):
    factory = lambda info: ReferenceLRU(info.num_blocks)  # noqa: E731
    with pytest.raises(PluginConflictError, match="'lru', a name kvcore uses"):
        kvcore.load_registry(plugins={"p": policy_plugin({"lru": factory})}, only=["p"])
    both = "eviction policy 'x' is claimed by plugin 'p' and by plugin 'q'"
    with pytest.raises(PluginConflictError, match=both):
        kvcore.load_registry(
            plugins={"p": policy_plugin({"x": factory}), "q": policy_plugin({"x": factory})},
            only=["p", "q"],
        )
    with pytest.raises(HookImplementationError, match="must return a non-empty mapping of policy"):
        kvcore.load_registry(plugins={"p": policy_plugin(["x"])}, only=["p"])


def test_a_plugin_policy_that_raises_is_named(registry):
    def broken(info: PoolInfo) -> EvictionPolicy:
        raise ZeroDivisionError("no blocks to divide")

    plugins = kvcore.load_registry(
        plugins={"toy": policy_plugin({"broken": broken})}, only=["full_attention", "toy"]
    )
    config = kvcore.KVCacheConfig.from_specs(
        6, [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype="float32")]
    )
    failed = (
        r"kvcore plugin 'toy' failed in the factory of its eviction policy 'broken': "
        r"ZeroDivisionError: no blocks to divide\. .*--disable toy"
    )
    with pytest.raises(HookImplementationError, match=failed) as e:
        kvcore.KVCacheManager(config, 64, registry=plugins, eviction="broken")
    assert isinstance(e.value.__cause__, ZeroDivisionError)
    # A plugin factory building an incomplete policy is named with its plugin.
    incomplete = policy_plugin({"half": lambda info: SimpleNamespace(take=list)})
    plugins = kvcore.load_registry(plugins={"toy": incomplete}, only=["full_attention", "toy"])
    with pytest.raises(HookImplementationError, match=r"policy 'half' of plugin 'toy'.* without"):
        kvcore.KVCacheManager(config, 64, registry=plugins, eviction="half")


def _example_module():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "eviction_policy.py"
    spec = importlib.util.spec_from_file_location("eviction_policy_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_example_policy_keeps_every_invariant(registry):
    example = _example_module()
    plugins = kvcore.load_registry(plugins={"toy": example}, only=["full_attention", "toy"])
    assert list(plugins.eviction_policies) == ["newest-first"]
    config = kvcore.KVCacheConfig.from_specs(
        40, [FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype="float32")]
    )
    manager = kvcore.KVCacheManager(
        config, 512, registry=plugins, hash_algorithm="fast", eviction="newest-first"
    )
    stats = RandomWorkload(manager, seed=2, max_running=5).run(800)
    assert stats.hit_tokens > 0
    assert stats.preemptions > 0


# -- one order however the pool reaches the queue -----------------------------------------


def _managers_on(
    specs: list[object], evictions: Sequence[object], backend: str | None = None
) -> list[kvcore.KVCacheManager]:
    """One manager per eviction policy (name or factory), same config, events on."""
    registry = kvcore.load_registry(environ={})
    config = kvcore.KVCacheConfig.from_specs(70, specs)
    return [
        kvcore.KVCacheManager(
            config,
            512,
            registry=registry,
            hash_algorithm="fast",
            enable_kv_cache_events=True,
            eviction=eviction,  # type: ignore[arg-type]
            backend=backend,
        )
        for eviction in evictions
    ]


def lru_through_the_protocol(info: PoolInfo) -> ExactThroughTheProtocol:
    return ExactThroughTheProtocol(LRUFreeQueue(info.num_blocks))


def reference_lru(info: PoolInfo) -> ReferenceLRU:
    return ReferenceLRU(info.num_blocks)


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_the_lru_queue_directly_through_the_protocol_and_the_reference_agree(name):
    """One order, three ways: the built-in queue, the same behind the driver, a plain list.

    The same random traffic must give the same block ids, hit lengths,
    events and free order at every checkpoint; so must the native backend's
    queue, when it is built.
    """
    managers = _managers_on(
        HYBRIDS[name], ("lru", lru_through_the_protocol, reference_lru), backend="python"
    )
    if native_available():
        managers += _managers_on(HYBRIDS[name], ("lru",), backend="native")
    pools = [manager.block_pool for manager in managers]
    assert isinstance(pools[0]._queue, LRUFreeQueue)
    assert isinstance(pools[1]._queue, PolicyDriver)
    workloads = [RandomWorkload(manager, seed=23, max_running=6) for manager in managers]
    for _ in range(12):
        stats = [workload.run(150) for workload in workloads]
        events = [pool.take_events() for pool in pools]
        for pool, other_stats, other_events in zip(pools[1:], stats[1:], events[1:], strict=True):
            assert other_stats == stats[0]
            assert pool.free_block_ids() == pools[0].free_block_ids()
            assert list(pool._ref) == list(pools[0]._ref)
            assert pool._hash == pools[0]._hash
            assert other_events == events[0]
            assert pool.num_evicted == pools[0].num_evicted
    assert stats[0].hit_tokens > 0
    assert stats[0].preemptions > 0
    assert pools[0].num_evicted > 0


def test_credit_queues_take_a_never_allocated_block_out_of_the_fresh_run():
    """A touch of a block nobody allocated leaves a hole; take skips it (as LRU does)."""
    from kvcore._eviction.credit import CreditQueues

    queues = CreditQueues(10, [5])
    assert queues.take(1) == [0]
    queues.remove(4)  # a hole in the fresh run
    queues.remove(1)  # the head of the run: the run starts at 2
    assert not queues.is_free(4)
    assert not queues.is_free(1)
    assert list(queues) == [2, 3, 5, 6, 7, 8, 9]
    queues.push(4, 1)  # freed again: queued like any released block
    assert queues.is_free(4)
    assert list(queues) == [2, 3, 5, 6, 7, 8, 9, 4]
    assert queues.take(3) == [2, 3, 5]
    assert list(queues) == [6, 7, 8, 9, 4]
    assert queues.take(5) == [6, 7, 8, 9, 4]
    assert list(queues) == []


@pytest.mark.parametrize("policy", ["lru", "admit", "frequency", "cost", "example"])
def test_every_policy_accepts_a_touch_of_a_never_allocated_block(policy):
    eviction = _example_module().NewestFirst if policy == "example" else policy
    pool = kvcore.managers.BlockPool(8, eviction=eviction)
    pool.touch([5])  # nobody allocated block 5: it is taken out of the free set
    pool.check_invariants()
    assert pool.get_num_free_blocks() == 6
    assert 5 not in pool.free_block_ids()
    assert sorted(pool.get_new_blocks(6)) == [1, 2, 3, 4, 6, 7]
    pool.free_blocks([5])
    assert pool.free_block_ids() == [5]
    pool.check_invariants()


def _through_the_protocol(**options: object):
    def factory(info: PoolInfo) -> ThroughTheProtocol:
        return ThroughTheProtocol(ValuePolicy(info, **options))  # type: ignore[arg-type]

    return factory


@pytest.mark.parametrize(
    ("policy", "options"),
    [
        ("admit", {}),
        ("frequency", {"hit_credits": (0.0, 1.0, 2.0)}),
        ("cost", {"depth_credit": 0.25}),
    ],
)
@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_a_value_policy_directly_and_through_the_protocol_choose_the_same_blocks(
    name, policy, options
):
    """The pool drives a built-in policy as a free queue, or through the driver: same blocks.

    The same random traffic must give the same block ids, hit lengths,
    events and free order at every checkpoint.
    """
    managers = _managers_on(HYBRIDS[name], (policy, _through_the_protocol(**options)))
    direct, driven = (manager.block_pool for manager in managers)
    # The built-in queue of the backend: the specification, or its compiled twin.
    assert (
        type(direct._queue).__name__
        == {"python": "ValuePolicy", "native": "ValueQueue"}[direct.backend]
    )
    assert isinstance(driven._queue, PolicyDriver)
    workloads = [RandomWorkload(manager, seed=29, max_running=6) for manager in managers]
    for _ in range(10):
        stats = [workload.run(150) for workload in workloads]
        assert stats[0] == stats[1]
        assert direct.free_block_ids() == driven.free_block_ids()
        assert direct._ref == driven._ref
        assert direct._hash == driven._hash
        assert direct.take_events() == driven.take_events()
    assert stats[0].hit_tokens > 0
    assert stats[0].preemptions > 0
