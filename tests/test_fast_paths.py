"""The decode guard of the engine-facing manager changes nothing but speed.

A running request's decode step skips every group while it stays within the
groups' ``steady_until``. A random engine (admissions with prefix hits,
chunked prefill, decode with lookahead, delayed caching, preemption,
skipped-block removal, frees) drives two managers built alike: one with the
shipped managers, one with managers whose ``steady_until`` always answers
"the next step may change something" (always correct), so that every call
takes the full route through the coordinator and the managers. After every
call both must have returned the same thing and hold exactly the same state
(reference counts, free-queue order, cache map, tables, events): the guard may
only skip work the full route would have found to be nothing.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from pool_state import pool_state
from protocol_adapters import rolled_back
from tiny_specs import full, mamba, sw
from two_level import two_level_config

import kvcore
import kvcore._kv_cache_manager
from kvcore import KVCacheManager, Request
from kvcore.errors import HookImplementationError
from kvcore.managers import SingleTypeManager
from kvcore.testing import check_manager_invariants, snapshot
from kvcore_plugins.full_attention import FullAttentionManager, FullAttentionSpec
from kvcore_plugins.mamba import MambaManager, MambaSpec
from kvcore_plugins.sliding_window import SlidingWindowManager, SlidingWindowSpec

REGISTRY = kvcore.load_registry(only=["full_attention", "sliding_window", "mamba"])


def always_full_route(base: type) -> type:
    """``base`` whose decode steps never skip it."""

    class AlwaysFullRoute(base):  # type: ignore[misc, valid-type]
        def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
            return num_computed_tokens

    AlwaysFullRoute.__name__ = AlwaysFullRoute.__qualname__ = f"AlwaysFullRoute{base.__name__}"
    return AlwaysFullRoute


SLOW_REGISTRY = kvcore.registry.registry_from_layer_types(
    [
        kvcore.LayerType(spec=FullAttentionSpec, manager=always_full_route(FullAttentionManager)),
        kvcore.LayerType(spec=SlidingWindowSpec, manager=always_full_route(SlidingWindowManager)),
        kvcore.LayerType(spec=MambaSpec, manager=always_full_route(MambaManager)),
    ],
    name="slow",
)


CONFIGS = {
    "full": [full()],
    "sliding_window": [sw(6)],
    "full+sliding_window": [full(), sw(9)],
    "full+mamba": [full(), mamba(num_speculative_blocks=1)],
    # Alone, the state group's room for speculative states sets the limit.
    "mamba": [mamba(num_speculative_blocks=2)],
    # Two-level pools, the groups at block sizes of their own: the groups
    # have work at different steps, and a step calls only those that do.
    "two-level full+mamba": [full(), mamba(block_size=16)],
    "two-level full+sliding_window+mamba": [full(), sw(9, block_size=8), mamba(block_size=16)],
}


def make(specs: list[Any], fast: bool, **kwargs: Any) -> KVCacheManager:
    sizes = {spec.block_size for spec in specs}
    if len(sizes) > 1:
        config = two_level_config(specs, 30)
    else:
        config = kvcore.KVCacheConfig.from_specs(60, specs)
    return KVCacheManager(config, 256, registry=REGISTRY if fast else SLOW_REGISTRY, **kwargs)


def outcome(call: Any) -> object:
    try:
        result = call()
    except kvcore.errors.KVCoreError as error:
        return ("raised", type(error).__name__)
    if isinstance(result, kvcore.KVCacheBlocks):
        return result.get_block_ids()
    return result


def drive(specs: list[Any], seed: int, steps: int, **kwargs: Any) -> int:
    """Run one random engine on a fast and a slow manager; return the fast decode count."""
    rng = random.Random(seed)
    managers = (make(specs, True, **kwargs), make(specs, False, **kwargs))
    # One Request object per manager (a Request belongs to one manager).
    requests: tuple[dict[str, Request], dict[str, Request]] = ({}, {})
    prompts = [[rng.randrange(3) for _ in range(rng.randrange(1, 40))] for _ in range(6)]
    # Count the calls that took the full route; the others were skipped.
    noted = [0]
    full_route = managers[0]._allocate

    def counting_route(*args: Any) -> Any:
        noted[0] += 1
        return full_route(*args)

    managers[0]._allocate = counting_route  # type: ignore[method-assign]
    fast_decodes = 0
    for step in range(steps):
        action = rng.random()
        live = sorted(requests[0])
        if action < 0.15 or not live:
            request_id = f"r{step}"
            base = rng.choice(prompts)
            tokens = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(3)]
            chunk = rng.randrange(1, len(tokens) + 1)

            def admit(
                manager: KVCacheManager,
                reqs: dict[str, Request],
                request_id: str = request_id,
                tokens: list[int] = tokens,
                chunk: int = chunk,
            ) -> object:
                request = Request(request_id, tokens)
                hit, num_hit = manager.get_computed_blocks(request)
                num_new = min(chunk, request.num_tokens - num_hit)
                result = manager.allocate_slots(request, num_new, num_hit, hit)
                if result is not None:
                    request.num_computed_tokens = num_hit + num_new
                    reqs[request_id] = request
                return (num_hit, outcome(lambda: result))

            results = [admit(m, r) for m, r in zip(managers, requests, strict=True)]
        elif action < 0.25:
            request_id = rng.choice(live)
            results = [
                outcome(lambda m=m, r=r, i=request_id: m.free(r.pop(i)))
                for m, r in zip(managers, requests, strict=True)
            ]
        elif action < 0.3:
            request_id = rng.choice(live)
            results = []
            for m, r in zip(managers, requests, strict=True):
                request = r[request_id]
                results.append(
                    outcome(lambda m=m, q=request: m.cache_blocks(q, q.num_computed_tokens))
                )
        else:
            # One decode (or prefill chunk) step for a running request.
            request_id = rng.choice(live)
            lookahead = rng.choice((0, 0, 0, 1, 3))
            delay = rng.random() < 0.1
            token = rng.randrange(3)
            results = []
            for m, r in zip(managers, requests, strict=True):
                request = r[request_id]
                if request.num_computed_tokens >= request.num_tokens:
                    request.append_output_token_ids(token)
                num_new = request.num_tokens - request.num_computed_tokens
                noted_before = noted[0]
                result = outcome(
                    lambda m=m, q=request, n=num_new, k=lookahead, d=delay: m.allocate_slots(
                        q, n, num_lookahead_tokens=k, delay_cache_blocks=d
                    )
                )
                if m is managers[0] and noted[0] == noted_before and result == ([],) * len(specs):
                    fast_decodes += 1
                if result is not None and result[0] != "raised":  # type: ignore[index]
                    request.num_computed_tokens += num_new
                results.append(result)
        assert results[0] == results[1], (step, results)
        assert snapshot(managers[0]) == snapshot(managers[1]), step
        for manager in managers:
            check_manager_invariants(manager)
    return fast_decodes


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", range(6))
def test_fast_decode_changes_nothing_but_speed(name: str, seed: int) -> None:
    drive(CONFIGS[name], seed, 300)


@pytest.mark.parametrize("seed", range(3))
def test_fast_decode_with_caching_off(seed: int) -> None:
    drive(CONFIGS["full+sliding_window"], seed, 200, enable_caching=False)


def test_fast_decode_is_taken() -> None:
    """The fast path really runs (the test above would pass if it never did)."""
    # Of about 210 decode steps a run, with 4-token blocks and lookahead.
    assert drive(CONFIGS["full"], 0, 300) > 50
    assert drive(CONFIGS["full+sliding_window"], 0, 300) > 40
    assert drive(CONFIGS["full+mamba"], 0, 300) > 30


def test_a_decode_step_with_work_calls_only_the_groups_that_have_some(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """4-token attention blocks beside 16-token states: each group is called at its own steps."""
    seen: list[tuple[int, tuple[int, ...]]] = []
    real = kvcore._kv_cache_manager.KVCacheManager._change_tables

    def noting(self: Any, request: Request, *args: Any) -> Any:
        groups = args[-1]
        if request._kv_owner is not None:  # a running request (None: every group acts)
            acting = tuple(range(len(self.coordinator.managers))) if groups is None else groups
            seen.append((request.num_computed_tokens, tuple(acting)))
        return real(self, request, *args)

    monkeypatch.setattr(kvcore._kv_cache_manager.KVCacheManager, "_change_tables", noting)
    manager = make(CONFIGS["two-level full+mamba"], True)
    request = Request("a", list(range(5)))
    manager.allocate_slots(request, 5)
    request.num_computed_tokens = 5
    for _ in range(43):
        request.append_output_token_ids(1)
        manager.allocate_slots(request, 1)
        request.num_computed_tokens += 1
    # Attention: a new block when a step needs token 4k + 1, and its blocks
    # cached when a step reaches a multiple of 16 (the hit alignment). The
    # states: cached at 16m, a new block for token 16m + 1, and the replaced
    # one freed a step later.
    attention = set(range(8, 64, 4)) | {n - 1 for n in range(16, 64, 16)}
    states = {n + d for n in range(16, 64, 16) for d in (-1, 0, 1)}
    expected = [
        (n, tuple(g for g, steps in enumerate((attention, states)) if n in steps))
        for n in range(5, 48)
        if n in attention | states
    ]
    assert seen == expected


def test_mamba_keeps_room_for_speculative_states_in_its_steady_limit() -> None:
    """Mamba allocates one speculative state block ahead: a step needing it is not skipped."""
    manager = make([mamba(num_speculative_blocks=1)], True)
    request = Request("a", list(range(10)))
    manager.allocate_slots(request, 10)
    request.num_computed_tokens = 10
    mamba_group = manager.coordinator.managers[0]
    size = mamba_group.block_size
    table = manager.get_block_ids("a")[0]
    # ceil(10 / size) blocks for the tokens, plus one for the speculative state.
    assert len(table) == -(-10 // size) + 1
    # Slots held less the one block of room; the next block filling caches.
    expected = min(len(table) * size - size, (10 // size + 1) * size - 1)
    # Every state but the latest is freed (n - 1 tokens skipped): the oldest
    # held block goes once (first_held + 1) * size + 1 tokens are computed, or
    # at the next step if that count is already behind.
    first_held = next(i for i, block in enumerate(table) if block)
    expected = min(expected, max(10, (first_held + 1) * size + 1))
    assert mamba_group.steady_until("a", 10) == expected


def test_a_manager_changing_a_decode_rule_must_say_when_its_next_change_comes() -> None:
    """Overriding an allocation step without steady_until is refused when the registry loads."""

    class Roomy(SingleTypeManager):  # type: ignore[type-arg]
        supports_prefix_caching = False

        def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
            return super().allocate_new_blocks(request_id, num_tokens + self.block_size)

    class Declared(Roomy):
        def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
            return super().steady_until(request_id, num_computed_tokens) - self.block_size

    refused = r"overrides allocate_new_blocks .* steady_until"
    with pytest.raises(HookImplementationError, match=refused):
        kvcore.registry.registry_from_layer_types(
            [kvcore.LayerType(spec=FullAttentionSpec, manager=Roomy)]
        )
    kvcore.registry.registry_from_layer_types(
        [kvcore.LayerType(spec=FullAttentionSpec, manager=Declared)]
    )


def test_free_queues_the_tail_first_and_skips_shared_blocks() -> None:
    """A request's blocks join the queue last first; blocks another request holds stay out."""
    manager = make([full()], True)
    pool = manager.block_pool
    first = Request("a", list(range(13)))  # 3 full blocks and one partial
    manager.allocate_slots(first, 13)
    (table_a,) = manager.get_block_ids("a")
    second = Request("b", list(range(9)) + [99])  # shares a's first two blocks
    hit, num_hit = manager.get_computed_blocks(second)
    assert num_hit == 8
    manager.allocate_slots(second, 2, num_hit, hit)
    queue_before = pool.free_block_ids()
    manager.free(first)
    # a's blocks 3 and 2 are free now (tail first); 0 and 1 are still b's.
    assert pool.free_block_ids() == [*queue_before, table_a[3], table_a[2]]
    assert [pool.ref_count(b) for b in table_a] == [1, 1, 0, 0]
    (table_b,) = manager.get_block_ids("b")
    manager.free(second)
    assert pool.free_block_ids()[-3:] == [table_b[2], table_b[1], table_b[0]]
    check_manager_invariants(manager)


def test_free_detects_a_double_free_and_changes_nothing() -> None:
    """A block freed behind the manager's back: its free refuses, state untouched."""
    manager = make([full(), sw(6)], True)
    request = Request("a", list(range(30)))
    request.num_computed_tokens = 0
    manager.allocate_slots(request, 30)
    request.num_computed_tokens = 30
    manager.remove_skipped_blocks("a", 30)  # nulls at the head of the window table
    full_table, window_table = manager.get_block_ids("a")
    assert window_table[0] == 0
    manager.block_pool.free_blocks([window_table[-1]])
    before = snapshot(manager)
    with pytest.raises(kvcore.errors.DoubleFreeError, match=f"block {window_table[-1]} "):
        manager.free(request)
    assert snapshot(manager) == before
    assert manager.block_pool.ref_count(0) == 0


@pytest.mark.parametrize(
    ("shape", "expected_tail"),
    [
        # Unique blocks only: all take the count-1 loop.
        ("bbbb", "4321"),
        # Leading nulls (a windowed table): skipped before the pass.
        ("00bb", "43"),
        # Nulls between blocks: the bisection lands inside; nothing skipped wrongly.
        ("0b0b", "42"),
        ("b00b", "41"),
        ("000b0", "4"),
        # A shared block at the head: the count-1 loop hands over to the general one.
        ("sbbb", "432"),
        ("bsbb", "431"),
    ],
)
def test_free_table_releases_every_block_of_any_shape(shape: str, expected_tail: str) -> None:
    """Nulls (0), shared (s) and unique (b) blocks: the unique ones join the tail, last first."""
    pool = kvcore.managers.BlockPool(8)
    assert pool.get_new_blocks(4) == [1, 2, 3, 4]  # position i may hold block i + 1
    table = [0 if kind == "0" else i + 1 for i, kind in enumerate(shape)]
    for block in range(1, 5):
        if block not in table:
            pool.free_blocks([block])  # not in the table: free it beforehand
    shared = [i + 1 for i, kind in enumerate(shape) if kind == "s"]
    pool.touch(shared)  # a second holder
    queue_before = pool.free_block_ids()
    before = pool_state(pool)
    with rolled_back(pool):
        pool.free_blocks(table[::-1])
        assert pool.free_block_ids() == queue_before + [int(b) for b in expected_tail]
        assert [pool.ref_count(b) for b in shared] == [1] * len(shared)
        pool.check_invariants()
    assert pool_state(pool) == before
    pool.check_invariants()


def test_free_table_double_free_after_released_blocks_changes_nothing() -> None:
    """A double free at the head, met after the tail was already linked: all restored."""
    pool = kvcore.managers.BlockPool(8)
    table = pool.get_new_blocks(4)
    pool.free_blocks([table[0]])  # freed behind the table's back
    before = pool_state(pool)
    with pytest.raises(kvcore.errors.DoubleFreeError, match=f"block {table[0]} "):
        pool.free_blocks(table[::-1])
    assert pool_state(pool) == before
    assert pool.ref_count(0) == 0
    pool.check_invariants()


def test_a_hit_waiting_as_one_run_is_revived_in_one_step_and_undone_exactly() -> None:
    """A freed request's blocks wait as one run (last first); a hit on them unlinks the run."""
    pool = kvcore.managers.BlockPool(12)
    request = Request("a", list(range(20)))
    kvcore.hashing.BlockHasher(4).update(request)
    table = pool.get_new_blocks(5)
    pool.cache_full_blocks(request, table, 0, 5, 4, 0)
    pool.get_new_blocks(2)  # blocks 6 and 7 stay held
    pool.free_blocks(table[::-1])
    assert pool.free_block_ids() == [8, 9, 10, 11, 5, 4, 3, 2, 1]
    before = pool_state(pool)
    with rolled_back(pool):
        pool.touch(table[:4])  # blocks 1..4: a run (4, 3, 2, 1) at the tail
        assert pool.free_block_ids() == [8, 9, 10, 11, 5]
        assert [pool.ref_count(b) for b in table] == [1, 1, 1, 1, 0]
        pool.check_invariants()
    assert pool_state(pool) == before
    pool.check_invariants()
    # A hit that is not one run (1, 2, 4: block 3 lies between) takes the
    # general path, with the same result as touching the blocks one by one.
    pool.touch([table[0], table[1], table[3]])
    assert pool.free_block_ids() == [8, 9, 10, 11, 5, 3]
    pool.check_invariants()


@pytest.mark.parametrize("fail_in", ["_cache_full_blocks", "_take", "_release"])
def test_a_running_step_that_raises_changes_nothing(
    fail_in: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A running request's step runs in the pool's transaction like any other."""
    manager = make(CONFIGS["full+sliding_window"], True)
    request = Request("a", list(range(40)))
    manager.allocate_slots(request, 40)
    request.num_computed_tokens = 40
    # The class serving this manager: the Python pool or its native twin.
    pool_class = type(manager.block_pool)
    original = getattr(pool_class, fail_in)
    armed = [False]
    calls = [0]

    def failing(self: kvcore.managers.BlockPool, *args: Any) -> Any:
        if armed[0]:
            calls[0] += 1
            raise RuntimeError("injected")
        return original(self, *args)

    monkeypatch.setattr(pool_class, fail_in, failing)
    # Every step of 40 tokens allocates (4-token blocks), caches and moves the
    # window past a block now and then: the injected fault fires in each kind.
    raised = 0
    for token in range(40):
        request.append_output_token_ids(token)
        before = snapshot(manager)
        armed[0] = True
        try:
            manager.allocate_slots(request, 1)
        except RuntimeError:
            raised += 1
            assert snapshot(manager) == before
            armed[0] = False
            manager.allocate_slots(request, 1)
        armed[0] = False
        request.num_computed_tokens += 1
        check_manager_invariants(manager)
    assert raised > 0
    assert calls[0] == raised
