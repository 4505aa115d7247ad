"""Choosing the backend: the argument, KVCORE_BACKEND, ``auto``, and what each says.

The behaviour of the native pool itself is tested against the Python one in
``test_native_differential.py``; here: which pool a manager gets, the errors
and notices on the way, and the compiled module's own guards.
"""

from __future__ import annotations

import logging

import pytest
from native_backend import require_native
from tiny_specs import full

import kvcore
from kvcore import _backend
from kvcore._block_pool import BlockPool
from kvcore._cli.main import main
from kvcore.errors import DoubleFreeError, InvalidConfigError

REGISTRY = kvcore.load_registry(only=["full_attention"])


def manager(**kwargs: object) -> kvcore.KVCacheManager:
    config = kvcore.KVCacheConfig.from_specs(10, [full()])
    return kvcore.KVCacheManager(config, 64, registry=REGISTRY, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def fresh_notices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-only notices afresh and no KVCORE_BACKEND of the caller."""
    monkeypatch.setattr(_backend, "_said", set())
    monkeypatch.delenv("KVCORE_BACKEND", raising=False)


def test_auto_is_native_where_the_module_imports() -> None:
    require_native()
    assert kvcore.backend() == "native"
    assert manager().backend == "native"
    assert type(manager().block_pool).__name__ == "NativeBlockPool"


@pytest.mark.parametrize("source", ["argument", "environment"])
def test_python_is_chosen_by_argument_or_environment(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if source == "argument":
        built = manager(backend="python")
    else:
        monkeypatch.setenv("KVCORE_BACKEND", "python")
        assert kvcore.backend() == "python"
        built = manager()
    assert built.backend == "python"
    assert type(built.block_pool) is BlockPool


def test_the_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    require_native()
    monkeypatch.setenv("KVCORE_BACKEND", "python")
    assert manager(backend="native").backend == "native"


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("argument", r"backend must be one of 'auto', 'python', 'native', got 'c\+\+'"),
        ("environment", r"KVCORE_BACKEND must be one of 'auto', 'python', 'native', got 'c\+\+'"),
    ],
)
def test_an_unknown_backend_names_the_field_and_the_choices(
    where: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options: dict[str, object] = {}
    if where == "argument":
        options["backend"] = "c++"
    else:
        monkeypatch.setenv("KVCORE_BACKEND", "c++")
    with pytest.raises(InvalidConfigError, match=expected):
        manager(**options)


@pytest.mark.parametrize("eviction", ["admit", "frequency", "cost"])
def test_native_serves_every_built_in_policy_with_compiled_queues(
    eviction: str, caplog: pytest.LogCaptureFixture
) -> None:
    require_native()
    from kvcore import _native  # type: ignore[attr-defined]
    from kvcore._native_pool import NativeBlockPool

    with caplog.at_level(logging.INFO, logger="kvcore"):
        built = [manager(backend="native", eviction=eviction), manager(eviction=eviction)]
    assert [m.backend for m in built] == ["native", "native"]
    for m in built:
        assert type(m.block_pool) is NativeBlockPool
        assert type(m.block_pool._queue) is _native.ValueQueue
        # The queue drives a core that keeps no queue of its own.
        with pytest.raises(RuntimeError, match=r"keeps no free queue"):
            list(m.block_pool._core)
    assert not [r for r in caplog.records if r.name == "kvcore"]


def test_a_third_party_policy_runs_in_python_on_the_native_pool() -> None:
    require_native()
    from protocol_adapters import ReferenceLRU

    from kvcore._eviction.driver import PolicyDriver
    from kvcore._native_pool import NativePolicyPool

    built = manager(backend="native", eviction=lambda info: ReferenceLRU(info.num_blocks))
    assert type(built.block_pool) is NativePolicyPool
    assert isinstance(built.block_pool._queue, PolicyDriver)
    request = kvcore.Request("a", list(range(1, 19)))  # 18 tokens: 5 blocks of 4
    blocks = built.allocate_slots(request, 18)
    assert blocks is not None
    assert blocks.get_block_ids() == ([1, 2, 3, 4, 5],)
    built.free(request)  # freed last block first: 5, 4, 3, 2, 1
    assert built.block_pool.free_block_ids() == [6, 7, 8, 9, 5, 4, 3, 2, 1]


def test_a_policy_pool_core_has_no_queue_and_refuses_a_bad_hand_out() -> None:
    """The core of a policy pool keeps no queue; a block handed out twice changes nothing."""
    require_native()
    from kvcore import _native  # type: ignore[attr-defined]

    core = _native.Core(4, DoubleFreeError, queue=False)
    core.bind([None] * 4, [{}], [{}], bytearray(4))
    assert core.nbytes == 4 * 4  # the counts only, no links
    for call in (lambda: core.take(1), lambda: core.release_blocks([1]), lambda: list(core)):
        with pytest.raises(RuntimeError, match=r"keeps no free queue \(made with queue=False\)"):
            call()
    core.claim_blocks([0, 1], False, None, None)
    assert (list(memoryview(core)), core.num_free) == ([1, 1, 0, 0], 2)
    for blocks in ([2, 1], [3, 3]):
        with pytest.raises(RuntimeError, match=r"handed out block (1|3), which is in use"):
            core.claim_blocks(blocks, False, None, None)
        assert (list(memoryview(core)), core.num_free) == ([1, 1, 0, 0], 2)
    # A hit on a free and a held block: the free one comes back to be
    # unqueued by the policy; the counts, and the undo, as worked out by hand.
    # A bad id part-way: the counts taken before it are given back.
    for bad in ([2, 1, 4], [2, -1], [2, 1.5]):
        with pytest.raises((IndexError, TypeError)):
            core.adopt_blocks(bad)
        assert (list(memoryview(core)), core.num_free) == ([1, 1, 0, 0], 2)
    core.journal = []
    assert core.adopt_blocks([2, 1, 0]) == [2]
    assert (list(memoryview(core)), core.num_free) == ([1, 2, 1, 0], 1)
    assert core.drop_blocks([1, 2]) == [2]
    assert (list(memoryview(core)), core.num_free) == ([1, 1, 0, 0], 2)
    steps, core.journal = core.journal, None
    for undo, arguments in reversed(steps):
        undo(*arguments)
    assert (list(memoryview(core)), core.num_free) == ([1, 1, 0, 0], 2)


def test_without_the_module_auto_falls_back_once_and_native_says_how_to_fix(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_backend, "_native_import_error", lambda: "No module named 'x'")
    with caplog.at_level(logging.WARNING, logger="kvcore"):
        assert [manager().backend for _ in range(3)] == ["python"] * 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "using the Python backend" in warnings[0].getMessage()
    with pytest.raises(InvalidConfigError, match=r"reinstall kvcore with a C compiler present"):
        manager(backend="native")


def test_version_names_the_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVCORE_BACKEND", "python")
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"kvcore {kvcore.__version__} (python backend)\n"
    monkeypatch.setenv("KVCORE_BACKEND", "fortran")
    with pytest.raises(SystemExit):
        main(["--version"])
    out = capsys.readouterr().out
    assert out.startswith(f"kvcore {kvcore.__version__} (KVCORE_BACKEND must be one of")


# -- the compiled module's guards (past the pool, it still refuses bad ids) ---------------


def test_the_native_pool_refuses_what_the_python_pool_refuses() -> None:
    require_native()
    from kvcore._native_pool import NativeBlockPool

    pool = NativeBlockPool(6)
    blocks = pool.get_new_blocks(2)
    assert blocks == [1, 2]
    pool.free_blocks([2])
    before = (list(pool._ref), pool.free_block_ids(), pool.get_num_free_blocks())
    with pytest.raises(DoubleFreeError, match=r"block 2 was freed more often than it was"):
        pool.free_blocks([1, 2])
    assert (list(pool._ref), pool.free_block_ids(), pool.get_num_free_blocks()) == before
    assert pool.free_block_ids() == [3, 4, 5, 2]
    assert pool.ref_count(1) == 1


def test_the_core_checks_block_ids_itself() -> None:
    require_native()
    from kvcore import _native  # type: ignore[attr-defined]

    core = _native.Core(4, DoubleFreeError)
    with pytest.raises(IndexError, match=r"block 4 is not a block of this pool \(ids 0\.\.3\)"):
        core.release_blocks([4])
    with pytest.raises(IndexError, match=r"block -1 is not a block"):
        core.touch_blocks([-1])
    with pytest.raises(RuntimeError, match=r"used before bind"):
        core.take_blocks(1, False, None, None)
    core.bind([None] * 4, [{}], [{}], bytearray(4))
    with pytest.raises(ValueError, match=r"cannot take 5 blocks: only 4 are free"):
        core.take_blocks(5, False, None, None)
    with pytest.raises(ValueError, match=r"bind\(\): hashes and groups need one entry a block"):
        core.bind([None] * 3, [{}], [{}], bytearray(4))
    # Nothing changed: the queue is still in id order, every count 0.
    assert core.queued() == [0, 1, 2, 3]
    assert list(memoryview(core)) == [0, 0, 0, 0]


def test_more_groups_than_the_native_pool_serves_use_python() -> None:
    from kvcore._native_pool import native_gap

    assert native_gap("lru", 256) is None
    assert native_gap("lru", 257) == "257 KV cache groups (the native backend serves up to 256)"


class _EqualityRaises:
    """A hash whose comparison raises (the pool must pass the error on, not answer)."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __eq__(self, other: object) -> bool:
        raise self.error("compared")

    __hash__ = object.__hash__


@pytest.mark.parametrize("backend", ["python", "native"])
def test_holds_cached_answers_each_case_as_worked_out_by_hand(backend: str) -> None:
    if backend == "native":
        require_native()
        from kvcore._native_pool import NativeBlockPool as Pool
    else:
        Pool = BlockPool
    pool = Pool(8, num_groups=2)
    request = kvcore.Request("a", [1, 2, 3, 4, 5, 6])
    kvcore.hashing.BlockHasher(2).update(request)
    h0, h1, h2 = request.block_hashes
    # Blocks 1 and 2 cached in group 0 under h0 and h1; block 3 in group 1 under h0.
    in_zero, in_one = pool.get_new_blocks(2), pool.get_new_blocks(1)
    assert (in_zero, in_one) == ([1, 2], [3])
    pool.cache_full_blocks(request, in_zero, 0, 2, 2, 0)
    pool.cache_full_blocks(request, in_one, 0, 1, 2, 1)
    holds = pool.holds_cached
    assert holds([1, 2], [h0, h1], 0)
    assert holds([1, 2], (h0, h1), 0)  # any sequence of hashes
    assert holds([3], [h0], 1)
    assert holds([], [], 0)  # nothing to check
    assert holds([], [], 7)
    assert not holds([2, 1], [h0, h1], 0)  # each block under its own position's hash
    assert not holds([3], [h0], 0)  # cached, but in the other group
    assert not holds([1], [h0], 2)  # a group the pool does not have
    assert not holds([1], [h0], "0")
    assert not holds([1, 2], [h0], 0)  # lengths differ
    assert not holds([4], [h2], 0)  # never cached
    for not_a_block in (0, -7, 8, 2**70, True, 1.0, "1", None):
        assert not holds([1, not_a_block], [h0, h1], 0), not_a_block
    # A type error while comparing hashes answers False; any other error is raised.
    assert not holds([1], [_EqualityRaises(TypeError)], 0)
    with pytest.raises(ZeroDivisionError, match="compared"):
        holds([1], [_EqualityRaises(ZeroDivisionError)], 0)
    # Blocks are checked before hashes: a bad block answers without comparing.
    assert not holds([1, -1], [_EqualityRaises(ZeroDivisionError), h1], 0)
    # The hashes stop at the first that differs, as a list comparison does.
    assert not holds([2, 1], [h0, _EqualityRaises(ZeroDivisionError)], 0)


def test_a_release_queues_the_blocks_it_freed_and_counts_them() -> None:
    """``release_blocks`` returns how many reached 0; ``drop_blocks`` lists them, in order."""
    require_native()
    from kvcore import _native  # type: ignore[attr-defined]

    core = _native.Core(8, DoubleFreeError)
    core.bind([None] * 8, [{}], [{}], bytearray(8))
    # Block 0 stands for the null block, which a release skips; the pool holds it.
    assert core.take_blocks(6, False, None, None) == [0, 1, 2, 3, 4, 5]
    core.touch_blocks([2])  # block 2 held twice
    assert core.release_blocks([5, 1]) == 2
    assert core.release_blocks((4,)) == 1
    assert core.release_blocks([3, 0, 2]) == 1  # 0 is skipped, 2 is still held once
    assert list(memoryview(core)) == [1, 0, 1, 0, 0, 0, 0, 0]
    assert list(core) == [6, 7, 5, 1, 4, 3]  # never used, then freed in release order
    assert core.num_free == 6

    policy_core = _native.Core(6, DoubleFreeError, queue=False)
    policy_core.bind([None] * 6, [{}], [{}], bytearray(6))
    policy_core.claim_blocks([0, 1, 2, 3], False, None, None)
    policy_core.adopt_blocks([2])
    every = [3, 1]
    assert policy_core.drop_blocks(every) is every  # every block freed: no copy made
    some = [2, 0]
    assert policy_core.drop_blocks(some) == []
    assert policy_core.drop_blocks((2,)) == [2]  # a tuple in, a list out
    assert list(memoryview(policy_core)) == [1, 0, 0, 0, 0, 0]


def test_the_core_keeps_one_int_object_per_block_id_below_its_cap() -> None:
    """A block handed out again is the same int object; ids from 2**20 on are made anew."""
    require_native()
    from kvcore import _native  # type: ignore[attr-defined]

    core = _native.Core(1000, DoubleFreeError)
    core.bind([None] * 1000, [{}], [{}], bytearray(1000))
    assert core.id_objects == (0, 1000)
    first = core.take_blocks(600, False, None, None)
    assert core.id_objects == (600, 1000)
    core.release_blocks(first[::-1])  # block 0 stands for the null block: skipped
    again = core.take_blocks(999, False, None, None)  # 600..999 fresh, then the freed ones
    assert again == [*range(600, 1000), *range(599, 0, -1)]
    assert all(a is b for a, b in zip(again[400:], first[:0:-1], strict=True))
    assert core.id_objects == (1000, 1000)

    cap = 2**20
    large = _native.Core(cap + 2, DoubleFreeError)
    large.bind([None] * (cap + 2), [{}], [{}], bytearray(cap + 2))
    taken = large.take_blocks(cap + 2, False, None, None)
    assert taken[-2:] == [cap, cap + 1]
    assert large.id_objects == (cap, cap)
    large.release_blocks(taken[-2:])
    assert large.take_blocks(2, False, None, None) == [cap, cap + 1]
