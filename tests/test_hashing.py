"""Chained block hashes and their extra keys (vllm-notes §4, §9.2)."""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys

import pytest
from extra_key_bytes import LONG_BLOCK_KEYS, long_block_request

from kvcore import MultiModalFeature, Request
from kvcore._hashing import (
    NONE_HASH_SHA256,
    BlockHashView,
    block_extra_keys,
    encode_extra_keys,
)
from kvcore.errors import InvalidConfigError, RequestStateError
from kvcore.hashing import BlockHasher


def expected_sha256(parent: bytes, tokens: list[int], extra: bytes = b"") -> bytes:
    """The documented encoding: parent digest, int64 little-endian tokens, tagged extras."""
    data = parent + struct.pack(f"<{len(tokens)}q", *tokens)
    if extra:
        data += b"\x01" + extra
    return hashlib.sha256(data).digest()


def test_hashes_chain_over_full_units_only():
    # Scenario 10: tokens 0..5 in units of 3 -> two hashes, the second chained on the first.
    request = Request("r", [0, 1, 2, 3, 4, 5, 6])
    BlockHasher(3).update(request)
    h0 = expected_sha256(NONE_HASH_SHA256, [0, 1, 2])
    h1 = expected_sha256(h0, [3, 4, 5])
    assert request.block_hashes == [h0, h1]
    assert NONE_HASH_SHA256 == hashlib.sha256(b"kvcore/none-hash/v1").digest()


def test_hashes_are_extended_incrementally_as_tokens_arrive():
    grown = Request("a", [1, 2, 3])
    hasher = BlockHasher(4)
    hasher.update(grown)
    assert grown.block_hashes == []
    grown.append_output_token_ids(4)
    hasher.update(grown)
    grown.append_output_token_ids([5, 6, 7, 8, 9])
    hasher.update(grown)
    at_once = Request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hasher.update(at_once)
    assert grown.block_hashes == at_once.block_hashes
    assert len(at_once.block_hashes) == 2


@pytest.mark.parametrize("algorithm", ["sha256", "fast"])
def test_equal_prefixes_give_equal_hashes_and_a_difference_propagates(algorithm):
    hasher = BlockHasher(2, algorithm)
    a = Request("a", [1, 2, 3, 4, 5, 6])
    b = Request("b", [1, 2, 3, 4, 9, 6])
    c = Request("c", [1, 9, 3, 4, 5, 6])
    for request in (a, b, c):
        hasher.update(request)
    assert a.block_hashes[:2] == b.block_hashes[:2]
    assert a.block_hashes[2] != b.block_hashes[2]
    # A change in block 0 changes every later hash, although blocks 1-2 match.
    assert all(x != y for x, y in zip(a.block_hashes, c.block_hashes, strict=True))


def test_sha256_hashes_are_identical_in_another_process():
    code = (
        "from kvcore import Request; from kvcore.hashing import BlockHasher;"
        "r = Request('x', list(range(40)), cache_salt='s', lora_name='l');"
        "BlockHasher(8).update(r);"
        "print(','.join(h.hex() for h in r.block_hashes))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
    )
    request = Request("x", list(range(40)), cache_salt="s", lora_name="l")
    BlockHasher(8).update(request)
    assert out.stdout.strip() == ",".join(h.hex() for h in request.block_hashes)


def test_extra_keys_of_multimodal_inputs_are_relative_to_the_block():
    # Scenario 12: items "hash1" at [0,5) and "hash2" at [10,15) of a 20-token prompt.
    features = [
        MultiModalFeature(identifier="hash1", offset=0, length=5),
        MultiModalFeature(identifier="hash2", offset=10, length=5),
    ]
    request = Request("r", list(range(20)), mm_features=features)
    assert block_extra_keys(request, 0, 5) == (("mm", "hash1", 0),)
    assert block_extra_keys(request, 3, 8) == (("mm", "hash1", -3),)
    assert block_extra_keys(request, 6, 10) is None
    assert block_extra_keys(request, 0, 15) == (("mm", "hash1", 0), ("mm", "hash2", 10))
    # Half-open ranges: an item ending at the block start does not overlap it.
    assert block_extra_keys(request, 5, 10) is None


def test_cache_salt_enters_the_first_block_only():
    # Scenario 13.
    request = Request("r", list(range(20)), cache_salt="salt")
    assert block_extra_keys(request, 0, 1) == (("salt", "salt"),)
    assert block_extra_keys(request, 0, 10) == (("salt", "salt"),)
    assert block_extra_keys(request, 1, 2) is None
    assert block_extra_keys(request, 6, 10) is None
    mixed = Request(
        "m",
        list(range(20)),
        cache_salt="salt",
        mm_features=[MultiModalFeature(identifier="hash1", offset=0, length=5)],
    )
    assert block_extra_keys(mixed, 0, 5) == (("mm", "hash1", 0), ("salt", "salt"))


def test_lora_name_enters_every_block():
    # Scenario 14.
    request = Request("r", list(range(20)), lora_name="test_lora_adapter")
    assert block_extra_keys(request, 0, 3) == (("lora", "test_lora_adapter"),)
    assert block_extra_keys(request, 12, 15) == (("lora", "test_lora_adapter"),)
    assert block_extra_keys(Request("p", list(range(20))), 0, 3) is None


def test_multimodal_keys_across_blocks_and_their_hash():
    # Scenario 16: block size 16; items aaa@11 (10 tokens), bbb@30 (18), ccc@48 (7).
    tokens = [*range(10), *[-1] * 6, *[-1] * 4, *range(10, 20), *[-1] * 2]
    tokens += [-1] * 16 + [-1] * 7 + [100] * 4
    features = [
        MultiModalFeature(identifier="aaa", offset=11, length=10),
        MultiModalFeature(identifier="bbb", offset=30, length=18),
        MultiModalFeature(identifier="ccc", offset=48, length=7),
    ]
    request = Request("r", tokens, mm_features=features)
    assert request.num_tokens == 59
    assert [block_extra_keys(request, s, s + 16) for s in (0, 16, 32)] == [
        (("mm", "aaa", 11),),
        (("mm", "aaa", -5), ("mm", "bbb", 14)),
        (("mm", "bbb", -2),),
    ]
    hasher = BlockHasher(16)
    hasher.update(request)
    assert len(request.block_hashes) == 3
    # (("mm", "aaa", 11),) written out: a 1-tuple holding a 3-tuple of two
    # strings and the 1-byte int 11.
    mm_aaa_11 = (
        b"T\x01\x00\x00\x00T\x03\x00\x00\x00S\x02\x00\x00\x00mmS\x03\x00\x00\x00aaaI\x01\x0b"
    )
    assert request.block_hashes[0] == expected_sha256(NONE_HASH_SHA256, tokens[:16], mm_aaa_11)
    request.append_output_token_ids([7, 7, 7, 7, 7])
    hasher.update(request)
    assert len(request.block_hashes) == 4
    assert block_extra_keys(request, 48, 64) == (("mm", "ccc", 0),)
    # The same tokens with another image in block 1 share only block 0's hash.
    other = Request("o", tokens, mm_features=[features[0], features[2]])
    hasher.update(other)
    assert other.block_hashes[0] == request.block_hashes[0]
    assert other.block_hashes[1] != request.block_hashes[1]
    # Its block 1 carries only (("mm", "aaa", -5),): -5 is the byte 0xfb.
    mm_aaa_minus_5 = (
        b"T\x01\x00\x00\x00T\x03\x00\x00\x00S\x02\x00\x00\x00mmS\x03\x00\x00\x00aaaI\x01\xfb"
    )
    assert other.block_hashes[1] == expected_sha256(
        request.block_hashes[0], tokens[16:32], mm_aaa_minus_5
    )


def test_extra_key_encoding_is_unambiguous():
    keys = [
        (("lora", "ab"),),
        (("lora", "a"), "b"),
        (("mm", "x", 1),),
        (("mm", "x", -1),),
        (("mm", "x", 256),),
        ((b"ab",),),
        (("ab",),),
        ((None,),),
    ]
    encodings = [encode_extra_keys(k) for k in keys]
    assert len(set(encodings)) == len(keys)
    with pytest.raises(TypeError, match="has no canonical encoding"):
        encode_extra_keys((1.5,))


# Extra keys written out byte by byte. Each value starts with a one-byte tag:
# a tuple is "T" and its item count, a str "S" and the length of its UTF-8
# bytes, a bytes value "B" and its length (count and lengths: 4 bytes,
# little-endian), then the items or the bytes; an int is "I", one byte
# holding its size bit_length // 8 + 1, then its two's complement in that many
# bytes, little-endian; None is "N". Wrapped in the 1-tuple of keys: T1.
T1 = b"T\x01\x00\x00\x00"
MM_X = b"T\x03\x00\x00\x00S\x02\x00\x00\x00mmS\x01\x00\x00\x00x"


@pytest.mark.parametrize(
    ("keys", "encoded"),
    [
        (
            (("lora", "ab"),),
            T1 + b"T\x02\x00\x00\x00S\x04\x00\x00\x00loraS\x02\x00\x00\x00ab",
        ),
        # A salt of one character but two UTF-8 bytes: the length counts bytes.
        (
            (("salt", "\u00e9"),),
            T1 + b"T\x02\x00\x00\x00S\x04\x00\x00\x00saltS\x02\x00\x00\x00\xc3\xa9",
        ),
        ((("mm", "x", 0),), T1 + MM_X + b"I\x01\x00"),
        ((("mm", "x", 11),), T1 + MM_X + b"I\x01\x0b"),
        ((("mm", "x", -1),), T1 + MM_X + b"I\x01\xff"),
        # 128 and -128 have bit_length 8: two bytes (0x0080, 0xff80).
        ((("mm", "x", 128),), T1 + MM_X + b"I\x02\x80\x00"),
        ((("mm", "x", -128),), T1 + MM_X + b"I\x02\x80\xff"),
        # 300 = 0x012c; -300 = 0x10000 - 300 = 0xfed4.
        ((("mm", "x", 300),), T1 + MM_X + b"I\x02\x2c\x01"),
        ((("mm", "x", -300),), T1 + MM_X + b"I\x02\xd4\xfe"),
        # 2**40: bit_length 41, six bytes, the top one 0x01.
        ((("mm", "x", 2**40),), T1 + MM_X + b"I\x06\x00\x00\x00\x00\x00\x01"),
        ((("embeds", b"ab"),), T1 + b"T\x02\x00\x00\x00S\x06\x00\x00\x00embedsB\x02\x00\x00\x00ab"),
        # 300 bytes: the length 0x0000012c.
        ((b"\x07" * 300,), T1 + b"B\x2c\x01\x00\x00" + b"\x07" * 300),
        ((None,), T1 + b"N"),
        ((), b"T\x00\x00\x00\x00"),
    ],
    ids=lambda value: repr(value)[:40] if isinstance(value, tuple) else f"{len(value)}B",
)
def test_extra_keys_encode_to_these_bytes(keys, encoded):
    assert encode_extra_keys(keys) == encoded


def test_two_byte_offsets_enter_the_sha256_digest_little_endian():
    request = long_block_request()
    BlockHasher(512).update(request)
    h0 = expected_sha256(NONE_HASH_SHA256, list(range(512)), LONG_BLOCK_KEYS[0])
    h1 = expected_sha256(h0, list(range(512, 1024)), LONG_BLOCK_KEYS[1])
    assert request.block_hashes == [h0, h1]


def test_block_hash_view_uses_the_last_unit_of_each_block():
    # Scenario 18: unit hashes A, B, C, D at unit 16 -> blocks of 32 use B, D.
    view = BlockHashView(["A", "B", "C", "D", "E"], 2)
    assert len(view) == 2
    assert list(view) == ["B", "D"]
    assert view[1] == "D"
    assert view[-1] == "D"
    assert view[0:2] == ["B", "D"]
    with pytest.raises(IndexError):
        view[2]


def test_a_request_cannot_be_hashed_two_ways():
    request = Request("r", list(range(16)))
    BlockHasher(4).update(request)
    with pytest.raises(RequestStateError, match="belongs to one KVCacheManager"):
        BlockHasher(8).update(request)


@pytest.mark.parametrize(
    ("block_size", "algorithm", "message"),
    [(0, "sha256", "block_size must be a positive integer"), (4, "md5", "hash_algorithm must")],
)
def test_invalid_hasher_settings(block_size, algorithm, message):
    with pytest.raises(InvalidConfigError, match=message):
        BlockHasher(block_size, algorithm)
