"""The native pool's prefix map kept as digests in C (``digest_size``, ``int_hashes``).

The differential tests drive it against the Python pool with engine and
pool traffic (``test_native_differential.py``); here: which managers get it,
its refusals, its byte count worked out from its layout, the two views the
specification's code reads it through, and the table alone against a dict
under many insertions and removals (wrap-around, long runs, reuse).
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_backend import require_native
from pool_state import pool_state
from tiny_specs import full

import kvcore
from kvcore._block_pool import BlockPool
from kvcore.errors import InvalidConfigError

REGISTRY = kvcore.load_registry(only=["full_attention"])


def native_pool(num_blocks: int, **options: Any) -> Any:
    require_native()
    from kvcore._native_pool import NativeBlockPool

    return NativeBlockPool(num_blocks, **options)


def digest(value: int) -> bytes:
    return hashlib.sha256(str(value).encode()).digest()


@pytest.mark.parametrize(
    ("algorithm", "size", "ints"),
    [("sha256", 32, False), ("xxh3_128", 16, False), ("fast", None, True)],
)
def test_a_manager_gives_its_pool_the_kind_of_its_hashes(
    algorithm: str, size: int | None, ints: bool
) -> None:
    require_native()
    if algorithm == "xxh3_128":
        pytest.importorskip("xxhash")
    config = kvcore.KVCacheConfig.from_specs(10, [full()])
    manager = kvcore.KVCacheManager(config, 64, registry=REGISTRY, hash_algorithm=algorithm)
    assert (manager.block_pool.digest_size, manager.block_pool.int_hashes) == (size, ints)
    request = kvcore.Request("a", list(range(12)))
    manager.get_computed_blocks(request)
    manager.allocate_slots(request, 12)
    blocks = manager.coordinator.managers[0].req_to_blocks["a"]
    # Every full block is cached under the request's hash for its position.
    assert [manager.block_pool.block_hash(b) for b in blocks[:3]] == request.block_hashes[:3]


@pytest.mark.parametrize("size", [0, 65, 8.0, True, "32"])
def test_a_digest_size_outside_1_to_64_bytes_is_refused_by_both_pools(size: object) -> None:
    with pytest.raises(InvalidConfigError, match=r"digest_size must be None or an int in 1\.\.64"):
        BlockPool(8, digest_size=size)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="digest_size"):
        native_pool(8, digest_size=size)


@pytest.mark.parametrize("bad", ["text", b"short", digest(1) + b"x", 7, None])
def test_a_hash_of_another_kind_is_refused_and_changes_nothing(bad: object) -> None:
    pool = native_pool(8, digest_size=32)
    blocks = pool.get_new_blocks(3)
    request = kvcore.Request("r", [0] * 3)
    request.block_hashes.extend([digest(0), bad, digest(2)])
    before = pool_state(pool)
    with pytest.raises(TypeError, match=r"is not a bytes object of 32 bytes.*digest_size=32"):
        pool.cache_full_blocks(request, blocks, 0, 3, 1, 0)
    assert pool_state(pool) == before
    pool.check_invariants()


@pytest.mark.parametrize("bad", [2**63, -(2**63) - 1, b"12345678", 3.0, True, None])
def test_an_int_pool_refuses_a_hash_that_is_no_64_bit_int_and_changes_nothing(
    bad: object,
) -> None:
    pool = native_pool(8, int_hashes=True)
    blocks = pool.get_new_blocks(3)
    request = kvcore.Request("r", [0] * 3)
    request.block_hashes.extend([-(2**63), bad, 2**63 - 1])
    before = pool_state(pool)
    with pytest.raises(TypeError, match=r"is not an int in the signed 64-bit range.*int_hashes"):
        pool.cache_full_blocks(request, blocks, 0, 3, 1, 0)
    assert pool_state(pool) == before
    pool.check_invariants()


def test_int_hashes_round_trip_through_the_8_byte_keys_at_both_ends_of_the_range() -> None:
    pool = native_pool(8, int_hashes=True)
    blocks = pool.get_new_blocks(4)
    request = kvcore.Request("r", [0] * 4)
    values = [-(2**63), -1, 0, 2**63 - 1]
    request.block_hashes.extend(values)
    pool.cache_full_blocks(request, blocks, 0, 4, 1, 0)
    assert [pool.block_hash(b) for b in blocks] == values
    assert pool.match_prefix(values, 0, 4, [0]) == (blocks,)
    assert pool.cached_block(-1, 0) == blocks[1]
    assert pool.cached_block(1, 0) is None


@pytest.mark.parametrize("options", [{"int_hashes": 1}, {"int_hashes": True, "digest_size": 8}])
def test_int_hashes_is_a_bool_and_excludes_a_digest_size(options: dict[str, Any]) -> None:
    with pytest.raises(InvalidConfigError, match=r"int_hashes must be True or False"):
        BlockPool(8, **options)


def test_the_byte_count_follows_the_layout() -> None:
    pool = native_pool(1000, digest_size=32)
    # int32 counts (1,000), int32 queue links before and after (1,001 each with
    # the sentinel), 32-byte digests, one bit a block, 32-bit slots for 1.5
    # times the blocks plus 16, one 8-byte entry count for the one group.
    expected = 4 * 1000 + 8 * 1001 + 32 * 1000 + 125 + 4 * (1000 + 500 + 16) + 8
    assert pool.nbytes == expected == 50_205
    assert native_pool(1000).nbytes == 4 * 1000 + 8 * 1001
    # Int hashes: the same layout with 8-byte keys.
    int_expected = 4 * 1000 + 8 * 1001 + 8 * 1000 + 125 + 4 * (1000 + 500 + 16) + 8
    assert native_pool(1000, int_hashes=True).nbytes == int_expected == 26_205


def test_the_views_keep_an_entry_and_its_hash_together() -> None:
    pool = native_pool(8, digest_size=32)
    blocks = pool.get_new_blocks(2)
    hashes, cached = pool._hash, pool._cached[0]
    cached[digest(1)] = blocks[0]
    assert hashes[blocks[0]] == digest(1)  # an entry always carries its hash
    assert cached.get(digest(1)) == blocks[0]
    assert digest(1) in cached
    assert len(cached) == 1
    hashes[blocks[0]] = None
    assert digest(1) not in cached
    assert len(cached) == 0
    assert hashes.count(None) == 8
    hashes[blocks[1]] = digest(2)
    cached[digest(2)] = blocks[1]
    with pytest.raises(ValueError, match=r"block \d carries another hash"):
        cached[digest(3)] = blocks[1]
    with pytest.raises(KeyError):
        del cached[digest(3)]
    assert dict(cached.items()) == {digest(2): blocks[1]}
    assert list(hashes) == [digest(2) if b == blocks[1] else None for b in range(8)]


@settings(max_examples=60, deadline=None)
@given(
    operations=st.lists(
        st.tuples(st.booleans(), st.integers(1, 63), st.integers(0, 40), st.integers(0, 1)),
        max_size=300,
    )
)
def test_the_table_answers_as_a_dict_through_insertions_and_removals(
    operations: list[tuple[bool, int, int, int]],
) -> None:
    """Random inserts and removals on a 64-block, two-group table: same answers as dicts.

    Keys of 8 bytes from 41 values over 64 blocks and two groups fill runs
    that wrap round the end of the table and are shifted back on removal.
    """
    pool = native_pool(64, digest_size=8, num_groups=2)
    model: list[dict[bytes, int]] = [{}, {}]
    owner: dict[int, tuple[int, bytes]] = {}  # block -> (group, key) it is the entry of
    for insert, block, value, group in operations:
        key = value.to_bytes(8, "little")
        if insert and block not in owner and key not in model[group]:
            pool._group[block] = group
            pool._cached[group][key] = block
            model[group][key] = block
            owner[block] = (group, key)
        elif not insert and key in model[group]:
            # As the pool's own steps do: the entry goes, then the block's hash.
            del pool._cached[group][key]
            removed = model[group].pop(key)
            pool._hash[removed] = None
            owner.pop(removed)
        pool._hash[block] = pool._hash[block]  # a write of what is there changes nothing
        for g in (0, 1):
            assert len(pool._cached[g]) == len(model[g])
            assert all(pool._cached[g].get(k) == b for k, b in model[g].items())
    for g in (0, 1):
        assert dict(pool._cached[g].items()) == model[g]
        # A key that was never inserted finds nothing.
        assert pool._cached[g].get((1000).to_bytes(8, "little")) is None


def _home(key: bytes, group: int, capacity: int) -> int:
    """Where the table's probe for ``key`` starts (its mix, as _digest_table.c computes it)."""
    mask = (1 << 64) - 1
    h = int.from_bytes(key, "little") ^ (((group + 1) * 0x9E3779B97F4A7C15) & mask)
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & mask
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & mask
    h ^= h >> 31
    return (h * capacity) >> 64


def test_a_run_longer_than_a_slot_can_count_still_shifts_back_correctly() -> None:
    """Forty keys with one home slot: entries sit up to 39 slots past it.

    A slot keeps its entry's distance from home in 5 bits; the entries
    further away than that are found from their digests instead. Removing
    keys from the front, the middle and the back of the run must leave every
    other key found, and a key inserted again must be found too.
    """
    pool = native_pool(64, digest_size=8, num_groups=1)
    capacity = 64 + 64 // 2 + 16  # the table's slots for 64 blocks
    same_home = [
        key
        for value in range(200_000)
        if _home(key := value.to_bytes(8, "little"), 0, capacity) == 5
    ][:40]
    assert len(same_home) == 40
    model: dict[bytes, int] = {}
    for block, key in enumerate(same_home, start=1):
        pool._cached[0][key] = block
        model[key] = block
    for gone in (same_home[0], same_home[20], same_home[39], same_home[33], same_home[1]):
        del pool._cached[0][gone]
        pool._hash[model.pop(gone)] = None
        assert dict(pool._cached[0].items()) == model
        assert pool._cached[0].get(gone) is None
    pool._cached[0][same_home[20]] = 21
    model[same_home[20]] = 21
    assert dict(pool._cached[0].items()) == model
    assert all(pool._cached[0].get(key) == block for key, block in model.items())


@pytest.mark.parametrize(("algorithm", "num_blocks"), [("sha256", 70_000), ("fast", 160_000)])
def test_a_map_too_large_for_the_cache_answers_as_the_python_pool(
    algorithm: str, num_blocks: int
) -> None:
    """A map of over 2 MiB, whose loops load ahead: the same answers as the Python pool.

    The same requests through both backends (a prompt admitted and freed,
    one that evicts most of it, the first looked up again, every block
    cached and evicted along the way) give the same hits and block ids.
    """
    require_native()
    config = kvcore.KVCacheConfig.from_specs(num_blocks, [full(block_size=4)])
    first, second = num_blocks * 3 // 7, num_blocks * 5 // 7  # in blocks

    def run(backend: str) -> list[object]:
        manager = kvcore.KVCacheManager(
            config, 4 * num_blocks, registry=REGISTRY, hash_algorithm=algorithm, backend=backend
        )
        seen: list[object] = []
        for name, start, length in (("a", 0, first), ("b", 10**7, second), ("a2", 0, first)):
            request = kvcore.Request(name, list(range(start, start + 4 * length)))
            hit, num_hit = manager.get_computed_blocks(request)
            blocks = manager.allocate_slots(request, 4 * length - num_hit, num_hit, hit)
            assert blocks is not None
            seen.append((num_hit, [list(group) for group in blocks.blocks]))
            manager.free(request)
        return seen

    native, python = run("native"), run("python")
    assert native == python
    # "b" takes the never-used blocks (all but "a"'s and the null block), then
    # the rest from "a"'s, its last blocks first (they were freed first).
    never_used = num_blocks - 1 - first
    assert native[2][0] == 4 * (first - (second - never_used))
