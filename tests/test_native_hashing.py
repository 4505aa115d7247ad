"""The compiled block hashes (kvcore._native_hash) against the Python hasher, their specification.

Both hashers get the same requests grown the same way; their hashes must be
equal, and equal to SHA-256 over the documented encoding computed here with
hashlib. Bad token ids must raise the same error with the same message on
both, leaving the request's hashes as they were.
"""

from __future__ import annotations

import hashlib
import logging
import struct
from collections.abc import Hashable
from enum import IntEnum

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from native_backend import require_native, require_native_hashing
from tiny_specs import full

import kvcore
import kvcore._backend as backend_module
from kvcore import Request
from kvcore._hashing import _NONE_HASH_FAST, NONE_HASH_SHA256
from kvcore.hashing import BlockHasher

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# 2**61 - 1 is the modulus of an int's hash, which the compiled "fast" chain computes;
# ids within 2**30 (one CPython digit) are read in place, the others through the C API.
MODULUS = 2**61 - 1
EDGES = [
    *(INT64_MIN, INT64_MIN + 1, -1, -2, 0, 1, 255, 256, 2**31, 2**32, INT64_MAX - 1, INT64_MAX),
    *(MODULUS - 1, MODULUS, MODULUS + 1, -MODULUS, 2 * MODULUS + 3, 1546275796),
    *(2**30 - 1, 2**30, -(2**30) + 1, -(2**30)),
]
token_ids = st.one_of(st.integers(INT64_MIN, INT64_MAX), st.sampled_from(EDGES))
REGISTRY = kvcore.load_registry(only=["full_attention"])
BAD_IDS = [INT64_MAX + 1, INT64_MIN - 1, 2**200, "7", 1.0, None, b"\x01", [3]]


def hashers(block_size: int, algorithm: str) -> tuple[BlockHasher, BlockHasher]:
    """The Python hasher and one with the compiled chain (which must be there)."""
    require_native_hashing()
    native = BlockHasher(block_size, algorithm, native=True)
    assert native._chain is not None
    return BlockHasher(block_size, algorithm), native


def sha256_chain(tokens: list[int], block_size: int) -> list[bytes]:
    """The documented chain, worked out with hashlib: parent digest then int64 LE ids."""
    out: list[bytes] = []
    parent = hashlib.sha256(b"kvcore/none-hash/v1").digest()
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start : start + block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{block_size}q", *block)).digest()
        out.append(parent)
    return out


def grow_both(
    pair: tuple[BlockHasher, BlockHasher], prompt: list[object], chunks: list[list[object]]
) -> list[Request]:
    """One request per hasher, hashed after the prompt and after every chunk of outputs."""
    requests = [Request("r", list(prompt)) for _ in range(2)]  # type: ignore[arg-type]
    for chunk in [[], *chunks]:
        for hasher, request in zip(pair, requests, strict=True):
            request.append_output_token_ids(chunk)  # type: ignore[arg-type]
            hasher.update(request)
        assert requests[0].block_hashes == requests[1].block_hashes
    return requests


@given(
    prompt=st.lists(token_ids, min_size=1, max_size=200),
    chunks=st.lists(st.lists(token_ids, max_size=40), max_size=4),
    block_size=st.integers(1, 33),
    algorithm=st.sampled_from(["sha256", "fast"]),
)
@settings(max_examples=150, deadline=None)
def test_the_compiled_chain_equals_the_python_hasher(
    prompt: list[int], chunks: list[list[int]], block_size: int, algorithm: str
) -> None:
    requests = grow_both(hashers(block_size, algorithm), prompt, chunks)
    tokens = requests[1].all_token_ids
    assert len(requests[1].block_hashes) == len(tokens) // block_size
    if algorithm == "sha256":
        assert requests[1].block_hashes == sha256_chain(tokens, block_size)
    else:
        parent: Hashable = _NONE_HASH_FAST
        for index, got in enumerate(requests[1].block_hashes):
            parent = hash((parent, tuple(tokens[index * block_size : (index + 1) * block_size])))
            assert got == parent


def test_the_fast_chain_computes_the_interpreters_hash_itself_on_cpython() -> None:
    """The import-time check passes here, so the tests above ran the formulas, not tuples."""
    require_native_hashing()
    import kvcore._native_hash as native_hash

    assert native_hash.fast_formulas_in_use()


def test_the_sha256_chain_of_the_int64_edges_by_hand() -> None:
    python, native = hashers(2, "sha256")
    request = Request("r", [INT64_MIN, INT64_MAX, -1, 0])
    native.update(request)
    first = hashlib.sha256(
        NONE_HASH_SHA256 + b"\x00" * 7 + b"\x80" + b"\xff" * 7 + b"\x7f"
    ).digest()
    second = hashlib.sha256(first + b"\xff" * 8 + b"\x00" * 8).digest()
    assert request.block_hashes == [first, second]


@pytest.mark.parametrize("algorithm", ["sha256", "fast"])
def test_a_long_prompt_in_one_call_equals_the_python_hasher(algorithm: str) -> None:
    # 4,100 ids in blocks of 16: 32 KiB to hash, past the size where the
    # compiled chain lets other threads run while it hashes.
    prompt = [(i * 2654435761) % 2**63 - 2**62 for i in range(4100)]
    requests = grow_both(hashers(16, algorithm), prompt, [[5] * 12])
    assert len(requests[1].block_hashes) == 257
    if algorithm == "sha256":
        assert requests[1].block_hashes == sha256_chain(requests[1].all_token_ids, 16)


def outcome(hasher: BlockHasher, request: Request) -> tuple[object, ...]:
    before = list(request.block_hashes)
    try:
        hasher.update(request)
    except Exception as error:
        assert request.block_hashes == before, "a refused update appended hashes"
        return (type(error), str(error))
    return ("hashed", list(request.block_hashes))


@given(
    good=st.lists(token_ids, min_size=1, max_size=80),
    position=st.integers(0, 79),
    bad=st.sampled_from(BAD_IDS),
    block_size=st.integers(1, 9),
    algorithm=st.sampled_from(["sha256", "fast"]),
    hashed_first=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_a_bad_token_id_is_refused_alike(
    good: list[int],
    position: int,
    bad: object,
    block_size: int,
    algorithm: str,
    hashed_first: bool,
) -> None:
    pair = hashers(block_size, algorithm)
    requests = [Request("r", list(good)) for _ in range(2)]
    if hashed_first:
        for hasher, request in zip(pair, requests, strict=True):
            hasher.update(request)
    position = min(position, len(good))
    for request in requests:
        request.all_token_ids.insert(position, bad)  # type: ignore[arg-type]
        request.all_token_ids.extend(range(block_size))
    results = [outcome(hasher, request) for hasher, request in zip(pair, requests, strict=True)]
    assert results[0] == results[1]
    bad_in_a_new_block = position >= len(requests[0].block_hashes) * block_size
    if bad_in_a_new_block:
        assert results[0][0] != "hashed"
        assert f"token id at position {position} is {bad!r}" in str(results[0][1])


class Colour(IntEnum):
    RED = 7


@pytest.mark.parametrize("algorithm", ["sha256", "fast"])
def test_ids_that_are_not_plain_ints_hash_as_in_python(algorithm: str) -> None:
    # bool and int subclasses are integers to struct and hash(): the compiled
    # chain leaves them to the Python path, so the values cannot differ.
    numpy = pytest.importorskip("numpy")
    prompt: list[object] = [True, Colour.RED, numpy.int64(-5), 3, False, numpy.int32(9)]
    requests = grow_both(hashers(2, algorithm), prompt, [[1, 2]])
    plain = Request("plain", [1, 7, -5, 3, 0, 9, 1, 2])
    BlockHasher(2, algorithm).update(plain)
    assert requests[1].block_hashes == plain.block_hashes


def test_the_chain_declines_what_it_does_not_serve() -> None:
    require_native_hashing()
    from kvcore import _native_hash

    out: list[Hashable] = []
    chain = _native_hash.chain_sha256
    assert chain([1, 2], 0, 1, 2, b"short", out) is False  # a parent of another length
    assert chain((1, 2), 0, 1, 2, NONE_HASH_SHA256, out) is False  # not a list
    assert chain([1, 2], 1, 1, 2, NONE_HASH_SHA256, out) is False  # past the end
    assert chain([1, 2**63], 0, 1, 2, NONE_HASH_SHA256, out) is False
    assert _native_hash.chain_fast([1, "2"], 0, 1, 2, 0, out) is False
    assert _native_hash.chain_fast([1, 2], 0, 1, 2, "parent", out) is False  # not an int
    same = [1, 2]
    assert chain(same, 0, 1, 2, NONE_HASH_SHA256, same) is False  # tokens as the output
    assert same == [1, 2]
    assert out == []
    assert chain([1, 2], 0, 1, 2, NONE_HASH_SHA256, out) is True
    assert out == sha256_chain([1, 2], 2)
    with pytest.raises(TypeError, match="expected"):
        chain([1, 2], 0, 1)


@pytest.mark.parametrize("algorithm", ["sha256", "fast", "xxh3_128"])
def test_managers_hash_in_c_on_the_native_backend_only(algorithm: str) -> None:
    require_native()
    require_native_hashing()
    if algorithm == "xxh3_128":
        pytest.importorskip("xxhash")
    config = kvcore.KVCacheConfig.from_specs(10, [full()])
    built = {
        backend: kvcore.KVCacheManager(
            config, 64, registry=REGISTRY, backend=backend, hash_algorithm=algorithm
        )
        for backend in ("native", "python")
    }
    # xxh3_128 has no compiled chain: the Python hasher serves both backends.
    assert (built["native"]._hasher._chain is not None) == (algorithm != "xxh3_128")
    assert built["python"]._hasher._chain is None


def test_without_the_compiled_hashing_the_python_hasher_serves_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real = backend_module.importlib.import_module

    def missing(name: str) -> object:
        if name == "kvcore._native_hash":
            raise ImportError("no module named kvcore._native_hash")
        return real(name)

    backend_module._native_hash_module.cache_clear()
    monkeypatch.setattr(backend_module.importlib, "import_module", missing)
    monkeypatch.setattr(backend_module, "_said", set())
    try:
        with caplog.at_level(logging.WARNING, logger="kvcore"):
            first = BlockHasher(4, "sha256", native=True)
            BlockHasher(4, "fast", native=True)
        request = Request("r", list(range(9)))
        first.update(request)
    finally:
        backend_module._native_hash_module.cache_clear()
    assert first._chain is None
    assert request.block_hashes == sha256_chain(list(range(9)), 4)
    notices = [r.getMessage() for r in caplog.records if "compiled block hashing" in r.getMessage()]
    assert len(notices) == 1
    assert "libssl-dev" in notices[0]
