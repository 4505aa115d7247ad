"""An operation either completes or changes nothing, whatever a plugin manager raises.

The managers below are the built-in full-attention, sliding-window and Mamba
managers with a fault injector: every method the core calls ticks a shared
counter before and after doing its work, and raises at a chosen tick. A
script of engine calls (chunked prefill, decode with lookahead, a hybrid
hit with external tokens, revival of freed cached blocks, preemption,
window skipping, a refused allocation) is run once without faults to count
the ticks; then, for every tick, it is run again with a fault there. The
call that hits the fault must raise it and leave the pool (reference
counts, free-queue order, cache map, pending events) and every block table
exactly as they were; retrying it without the fault must then give what the
fault-free run gave, and so must the rest of the script.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from protocol_adapters import ReferenceLRU
from tiny_specs import full, mamba, sw
from two_level import two_level_config

import kvcore
from kvcore import KVCacheManager, Request
from kvcore.testing import check_manager_invariants, snapshot
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec
from kvcore_plugins.mamba import MambaManager, MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec


class InjectedFault(Exception):
    """Raised by a faulty manager at the chosen tick."""


class Faults:
    """Counts the calls the core makes into managers; raises at one of them."""

    def __init__(self) -> None:
        self.fire_at: int | None = None
        self.ticks = 0
        self.points: list[str] = []

    def tick(self, where: str) -> None:
        at = self.ticks
        self.ticks += 1
        self.points.append(where)
        if at == self.fire_at:
            raise InjectedFault(f"tick {at}: {where}")


FAULTS = Faults()


def faulty(base: type) -> type:
    """``base`` with a tick before and after each method the coordinator calls."""
    name = base.__name__

    def around(method: str, call: Callable[[], Any]) -> Any:
        FAULTS.tick(f"{name}.{method}:before")
        result = call()
        FAULTS.tick(f"{name}.{method}:after")
        return result

    class Faulty(base):  # type: ignore[misc, valid-type]
        @classmethod
        def find_longest_cache_hit(cls, query: Any) -> Any:
            return around(
                "find_longest_cache_hit", lambda: super(Faulty, cls).find_longest_cache_hit(query)
            )

        def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
            return around(
                "get_num_skipped_tokens",
                lambda: super(Faulty, self).get_num_skipped_tokens(num_computed_tokens),
            )

        def get_num_blocks_to_allocate(self, *args: Any) -> int:
            return around(
                "get_num_blocks_to_allocate",
                lambda: super(Faulty, self).get_num_blocks_to_allocate(*args),
            )

        def remove_skipped_blocks(self, *args: Any) -> None:
            around(
                "remove_skipped_blocks", lambda: super(Faulty, self).remove_skipped_blocks(*args)
            )

        def allocate_new_computed_blocks(self, *args: Any) -> None:
            around(
                "allocate_new_computed_blocks",
                lambda: super(Faulty, self).allocate_new_computed_blocks(*args),
            )

        def allocate_new_blocks(self, *args: Any) -> list[int]:
            return around(
                "allocate_new_blocks", lambda: super(Faulty, self).allocate_new_blocks(*args)
            )

        def cache_blocks(self, *args: Any) -> None:
            around("cache_blocks", lambda: super(Faulty, self).cache_blocks(*args))

        def free(self, *args: Any) -> None:
            around("free", lambda: super(Faulty, self).free(*args))

        def steady_until(self, *args: Any) -> int:
            return around("steady_until", lambda: super(Faulty, self).steady_until(*args))

    if not base.frees_skipped_blocks:
        # The contract: only a type that frees skipped blocks may override these.
        del Faulty.get_num_skipped_tokens
        del Faulty.remove_skipped_blocks
    Faulty.__name__ = Faulty.__qualname__ = f"Faulty{name}"
    return Faulty


LAYER_TYPES = [
    kvcore.LayerType(spec=FullAttentionSpec, manager=faulty(FullAttentionManager)),
    kvcore.LayerType(spec=SlidingWindowSpec, manager=faulty(SlidingWindowManager)),
    kvcore.LayerType(spec=MambaSpec, manager=faulty(MambaManager)),
]
try:  # the example plugin that frees a gap with its own remove_skipped_blocks
    import kvcore_streaming
except ImportError:  # pragma: no cover - installed by the README's test command
    kvcore_streaming = None
else:
    LAYER_TYPES.append(
        kvcore.LayerType(
            spec=kvcore_streaming.StreamingSpec,
            manager=faulty(kvcore_streaming.StreamingManager),
        )
    )
REGISTRY = kvcore.registry.registry_from_layer_types(LAYER_TYPES, name="faulty")


Op = Callable[[KVCacheManager, dict[str, Request]], object]


def blocks(result: object) -> object:
    return None if result is None else result.get_block_ids()  # type: ignore[attr-defined]


def lookup(name: str, tokens: list[int]) -> Op:
    def op(manager: KVCacheManager, requests: dict[str, Request]) -> object:
        request = requests.setdefault(name, Request(name, tokens))
        hit, num_hit = manager.get_computed_blocks(request)
        requests[f"{name}:hit"] = (hit, num_hit)  # type: ignore[assignment]
        return hit.get_block_ids(), num_hit

    return op


def admit(name: str, num_new: int | None = None, external: int = 0) -> Op:
    """Allocate the looked-up request's first chunk (default: all of it), adopting the hit."""

    def op(manager: KVCacheManager, requests: dict[str, Request]) -> object:
        request = requests[name]
        hit, num_hit = requests[f"{name}:hit"]  # type: ignore[misc]
        chunk = request.num_tokens - num_hit - external if num_new is None else num_new
        result = manager.allocate_slots(
            request, chunk, num_hit, hit, num_external_computed_tokens=external
        )
        if result is not None:
            request.num_computed_tokens = num_hit + external + chunk
        return blocks(result)

    return op


def step(name: str, num_new: int = 1, lookahead: int = 0, new_token: int | None = None) -> Op:
    """A prefill chunk (no new token) or a decode step (appends ``new_token`` first)."""

    def op(manager: KVCacheManager, requests: dict[str, Request]) -> object:
        request = requests[name]
        if new_token is not None and request.num_computed_tokens == request.num_tokens:
            request.append_output_token_ids(new_token)
        result = manager.allocate_slots(request, num_new, num_lookahead_tokens=lookahead)
        if result is not None:
            request.num_computed_tokens += num_new
        return blocks(result)

    return op


def free(name: str) -> Op:
    def op(manager: KVCacheManager, requests: dict[str, Request]) -> object:
        manager.free(requests[name])
        requests[name].num_computed_tokens = 0
        return manager.num_free_blocks

    return op


def skip(name: str, num_computed: int) -> Op:
    def op(manager: KVCacheManager, requests: dict[str, Request]) -> object:
        manager.remove_skipped_blocks(name, num_computed)
        return manager.get_block_ids(name)

    return op


def cache(name: str, num_computed: int) -> Op:
    def op(manager: KVCacheManager, requests: dict[str, Request]) -> object:
        manager.cache_blocks(requests[name], num_computed)
        return manager.block_pool.num_cached_blocks()

    return op


PROMPT = list(range(100, 120))  # 20 tokens

SCRIPT: list[Op] = [
    lookup("a", PROMPT),
    admit("a", num_new=12),  # chunked prefill
    step("a", num_new=8),  # the rest of the prompt; the window drops early blocks
    step("a", lookahead=3, new_token=7),  # decode with speculative slots
    step("a", new_token=8),
    lookup("b", [*PROMPT, 5, 5, 5, 5, 5, 5]),
    admit("b", num_new=4, external=2),  # a hybrid hit, external tokens, then 4 more
    free("a"),
    lookup("c", [*PROMPT[:16], 9, 9, 9]),  # revives a's freed cached blocks
    admit("c"),
    skip("b", 22),
    step("b", num_new=6, lookahead=2),
    cache("b", 26),
    lookup("d", list(range(500, 620))),
    admit("d"),  # refused: the pool cannot hold 120 more tokens per group
    free("c"),
    free("b"),
    free("b"),  # preempted then aborted: a no-op
    lookup("e", [*PROMPT, 5, 5, 5, 5, 5, 5, 1]),
    admit("e"),
    step("e", new_token=3),
    free("e"),
]

CONFIGS = {
    "hybrid": ([full(), sw(8), mamba(num_speculative_blocks=1)], 40, "shared"),
    "full": ([full()], 20, "shared"),
    # Attention pages of 32 bytes (2 a large page), Mamba states of 16 (4).
    "hybrid two-level": ([full(), sw(8), mamba(num_speculative_blocks=1)], 30, "two-level"),
    "selective states two-level": (
        [full(), mamba(num_speculative_blocks=1, prefill_states="selective")],
        30,
        "two-level",
    ),
}
if kvcore_streaming is not None:
    CONFIGS["full+streaming"] = (
        [
            full(),
            kvcore_streaming.StreamingSpec(
                block_size=4,
                num_kv_heads=1,
                head_size=1,
                dtype="float32",
                sink_tokens=4,
                sliding_window=8,
            ),
        ],
        30,
        "shared",
    )


def make(
    specs: list[Any], num_blocks: int, pool: str = "shared", eviction: Any = "lru"
) -> KVCacheManager:
    if pool == "two-level":
        config = two_level_config(specs, num_blocks)
    else:
        config = kvcore.KVCacheConfig.from_specs(num_blocks, specs)
    return KVCacheManager(
        config, 128, registry=REGISTRY, enable_kv_cache_events=True, eviction=eviction
    )


def state(manager: KVCacheManager) -> tuple[object, ...]:
    return (snapshot(manager), manager.prefix_cache_stats)


def run_script(
    specs: list[Any], num_blocks: int, pool: str = "shared"
) -> tuple[list[object], int, object]:
    FAULTS.__init__()  # type: ignore[misc]
    manager = make(specs, num_blocks, pool)
    requests: dict[str, Request] = {}
    results = [op(manager, requests) for op in SCRIPT]
    check_manager_invariants(manager)
    return results, FAULTS.ticks, state(manager)


@pytest.mark.parametrize("config", CONFIGS)
def test_the_script_exercises_every_path(config):
    results, ticks, _ = run_script(*CONFIGS[config])
    assert results[14] is None  # the refused admission
    points = set(FAULTS.points)
    for name in ("allocate_new_computed_blocks", "allocate_new_blocks", "cache_blocks", "free"):
        assert any(name in point for point in points), name
    if config.startswith("hybrid"):
        hit_b = results[5]
        assert hit_b[1] == 20  # b hits a's whole prompt in all three groups
        assert any("SlidingWindowManager.remove_skipped_blocks:after" in p for p in points)
    if config == "full+streaming":
        assert any("StreamingManager.remove_skipped_blocks:after" in p for p in points)
    assert ticks > (300 if config == "hybrid" else 60)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_fault_at_any_call_changes_nothing_and_a_retry_succeeds(config):
    specs, num_blocks, pool = CONFIGS[config]
    expected, num_ticks, final = run_script(specs, num_blocks, pool)
    faults_seen = 0
    for fire_at in range(num_ticks):
        FAULTS.__init__()  # type: ignore[misc]
        FAULTS.fire_at = fire_at
        manager = make(specs, num_blocks, pool)
        requests: dict[str, Request] = {}
        results = []
        for index, op in enumerate(SCRIPT):
            before = state(manager)
            try:
                results.append(op(manager, requests))
            except InjectedFault:
                faults_seen += 1
                assert state(manager) == before, (fire_at, index, FAULTS.points[-1])
                check_manager_invariants(manager)
                FAULTS.fire_at = None
                results.append(op(manager, requests))
        assert results == expected, fire_at
        assert state(manager) == final, fire_at
    assert faults_seen == num_ticks


def free_set_state(manager: KVCacheManager) -> tuple[object, ...]:
    """:func:`state` with the free blocks as a set: a policy's order may change on undo."""
    pools, *rest = snapshot(manager)
    free_sets = tuple((ref, frozenset(free), *other) for ref, free, *other in pools)
    return (free_sets, manager.block_pool.get_num_free_blocks(), *rest)


@pytest.mark.parametrize("policy", ["admit", "frequency", "cost"])
@pytest.mark.parametrize("config", ["hybrid", "full", "hybrid two-level"])
def test_a_fault_under_another_policy_keeps_the_free_set_and_counts(config, policy):
    """The pool undoes a protocol-driven policy by compensating calls.

    Reference counts, the free set, the free count, the cache map, events and
    tables come back exactly; only the policy's order may differ, so after
    the retry the block ids may too, and the script must still run through.
    """
    specs, num_blocks, pool = CONFIGS[config]
    FAULTS.__init__()  # type: ignore[misc]
    clean = make(specs, num_blocks, pool, policy)
    requests: dict[str, Request] = {}
    for op in SCRIPT:
        op(clean, requests)
    num_ticks = FAULTS.ticks
    assert num_ticks > 60
    faults_seen = 0
    for fire_at in range(num_ticks):
        FAULTS.__init__()  # type: ignore[misc]
        FAULTS.fire_at = fire_at
        manager = make(specs, num_blocks, pool, policy)
        requests = {}
        for index, op in enumerate(SCRIPT):
            before = free_set_state(manager)
            try:
                op(manager, requests)
            except InjectedFault:
                faults_seen += 1
                assert free_set_state(manager) == before, (fire_at, index, FAULTS.points[-1])
                check_manager_invariants(manager)
                FAULTS.fire_at = None
                op(manager, requests)
        check_manager_invariants(manager)
    assert faults_seen == num_ticks


@pytest.mark.parametrize("config", CONFIGS)
def test_an_exact_undo_policy_through_the_protocol_rolls_back_exactly(config):
    """A policy with ``exact_undo`` records its own undo: the order comes back too.

    An independent list-based LRU written against the public protocol must
    give, fault or no fault, the results and the final state of the built-in
    ``lru`` queue.
    """
    specs, num_blocks, pool = CONFIGS[config]
    expected, num_ticks, final = run_script(specs, num_blocks, pool)
    for fire_at in range(0, num_ticks, 3):
        FAULTS.__init__()  # type: ignore[misc]
        FAULTS.fire_at = fire_at
        manager = make(
            specs,
            num_blocks,
            pool,
            lambda info: ReferenceLRU(info.num_blocks, free_at_start=info.free_at_start),
        )
        requests: dict[str, Request] = {}
        results = []
        for op in SCRIPT:
            before = state(manager)
            try:
                results.append(op(manager, requests))
            except InjectedFault:
                assert state(manager) == before, fire_at
                FAULTS.fire_at = None
                results.append(op(manager, requests))
        assert results == expected, fire_at
        assert state(manager) == final, fire_at
