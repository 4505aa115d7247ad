"""The ``"xxh3_128"`` block hash: its encoding, determinism across processes, errors."""

from __future__ import annotations

import struct
import subprocess
import sys

import pytest
import xxhash
from extra_key_bytes import LONG_BLOCK_KEYS, long_block_request

import kvcore
from kvcore import MultiModalFeature, Request
from kvcore.errors import InvalidConfigError
from kvcore.hashing import BlockHasher
from kvcore_plugins.full_attention import FullAttentionSpec

NONE_HASH = xxhash.xxh3_128_digest(b"kvcore/none-hash/v1")


def expected(parent: bytes, tokens: list[int], extra: bytes = b"") -> bytes:
    """The documented encoding (as sha256's), digested with XXH3-128."""
    data = parent + struct.pack(f"<{len(tokens)}q", *tokens)
    if extra:
        data += b"\x01" + extra
    return xxhash.xxh3_128_digest(data)


def test_hashes_are_xxh3_128_of_the_parent_and_the_packed_tokens():
    request = Request("r", [5, -1, 2**40, 7, 8, 9, 10])
    BlockHasher(3, "xxh3_128").update(request)
    h0 = expected(NONE_HASH, [5, -1, 2**40])
    h1 = expected(h0, [7, 8, 9])
    assert request.block_hashes == [h0, h1]
    assert all(len(h) == 16 for h in request.block_hashes)


def test_extra_keys_enter_the_digest_as_with_sha256():
    features = [MultiModalFeature(identifier="img", offset=2, length=3)]
    request = Request("r", list(range(8)), lora_name="l", cache_salt="s", mm_features=features)
    BlockHasher(4, "xxh3_128").update(request)
    # Written out as in test_hashing.py: (("lora", "l"), ("mm", "img", 2),
    # ("salt", "s")) on block 0; (("lora", "l"), ("mm", "img", -2)) on block 1.
    lora = b"T\x02\x00\x00\x00S\x04\x00\x00\x00loraS\x01\x00\x00\x00l"
    mm_img = b"T\x03\x00\x00\x00S\x02\x00\x00\x00mmS\x03\x00\x00\x00img"
    salt = b"T\x02\x00\x00\x00S\x04\x00\x00\x00saltS\x01\x00\x00\x00s"
    block0 = b"T\x03\x00\x00\x00" + lora + mm_img + b"I\x01\x02" + salt
    block1 = b"T\x02\x00\x00\x00" + lora + mm_img + b"I\x01\xfe"
    h0 = expected(NONE_HASH, [0, 1, 2, 3], block0)
    h1 = expected(h0, [4, 5, 6, 7], block1)
    assert request.block_hashes == [h0, h1]


def test_two_byte_offsets_enter_the_digest_little_endian():
    request = long_block_request()
    BlockHasher(512, "xxh3_128").update(request)
    h0 = expected(NONE_HASH, list(range(512)), LONG_BLOCK_KEYS[0])
    h1 = expected(h0, list(range(512, 1024)), LONG_BLOCK_KEYS[1])
    assert request.block_hashes == [h0, h1]


def test_incremental_hashing_equals_hashing_at_once():
    hasher = BlockHasher(4, "xxh3_128")
    grown = Request("a", [1, 2, 3])
    hasher.update(grown)
    grown.append_output_token_ids([4, 5, 6, 7, 8, 9])
    hasher.update(grown)
    at_once = Request("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    hasher.update(at_once)
    assert (
        grown.block_hashes
        == at_once.block_hashes
        == [
            expected(NONE_HASH, [1, 2, 3, 4]),
            expected(expected(NONE_HASH, [1, 2, 3, 4]), [5, 6, 7, 8]),
        ]
    )


def test_hashes_are_identical_in_another_process_whatever_its_hash_seed():
    code = (
        "from kvcore import Request; from kvcore.hashing import BlockHasher;"
        "r = Request('x', list(range(40)), cache_salt='s', lora_name='l');"
        "BlockHasher(8, 'xxh3_128').update(r);"
        "print(','.join(h.hex() for h in r.block_hashes))"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    request = Request("x", list(range(40)), cache_salt="s", lora_name="l")
    BlockHasher(8, "xxh3_128").update(request)
    assert outputs == {",".join(h.hex() for h in request.block_hashes)}


def test_without_the_xxhash_package_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "xxhash", None)  # makes `import xxhash` fail
    with pytest.raises(InvalidConfigError, match=r"pip install 'kvcore\[xxhash\]'"):
        BlockHasher(16, "xxh3_128")


def test_the_manager_gives_the_same_blocks_and_hits_as_with_sha256():
    def run(algorithm: str) -> list[object]:
        spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=1, dtype="float16")
        config = kvcore.KVCacheConfig.from_specs(9, [spec])
        manager = kvcore.KVCacheManager(config, 64, hash_algorithm=algorithm)
        seen: list[object] = []
        for index, prompt in enumerate([list(range(10)), list(range(13)), [9] * 20]):
            request = Request(str(index), prompt)
            hit, num_hit = manager.get_computed_blocks(request)
            blocks = manager.allocate_slots(request, len(prompt) - num_hit, num_hit, hit)
            seen.append((num_hit, hit.get_block_ids(), blocks and blocks.get_block_ids()))
            if blocks is not None:
                request.num_computed_tokens = len(prompt)
                manager.free(request)
        return seen

    # Prompt 1 hits prompt 0's two full blocks (8 tokens); prompt 2 needs 5 blocks
    # and evicts from the head of the free queue.
    assert run("xxh3_128") == run("sha256")
    assert run("xxh3_128")[1][0] == 8
