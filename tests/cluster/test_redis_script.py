"""The Redis apply script on its own: it checks every argument before its first write.

The index never sends a malformed batch, but the script runs on a shared
server and another client (a buggy one, another kvcore version) may call it;
so it is driven here with crafted arguments through redis-py's ``EVAL``.
Argument layout: seq, ts, ttl_ms, reset, incarnation, max_blocks, max_fields,
then per operation (op, group, field width, packed fields).
"""

from __future__ import annotations

import struct
import time

import pytest
import redis

from kvcore.cluster._redis_scripts import APPLY

GROUPS = 2


def keys(namespace: str) -> list[str]:
    base = f"{namespace}:e:a"
    return (
        [f"{base}:meta"]
        + [f"{base}:g:{g}" for g in range(GROUPS)]
        + [f"{base}:c:{g}" for g in range(GROUPS)]
    )


def packed(*hashes: int) -> bytes:
    return struct.pack(f">{len(hashes)}q", *hashes)


def header(seq, max_blocks=100, max_fields=100, reset=0, incarnation="x"):
    return [seq, "1.0", 60_000, reset, incarnation, max_blocks, max_fields]


@pytest.fixture
def client(redis_session):
    connection = redis.Redis.from_url(redis_session.url, socket_timeout=5)
    yield connection
    connection.close()


def state(client, namespace):
    return {key: client.dump(key) for key in keys(namespace)}


def run(client, namespace, args):
    return client.eval(APPLY, len(keys(namespace)), *keys(namespace), *args)


BAD = {
    "width 0": ["S", 0, 0, b"abc"],
    "width 0, nothing packed": ["S", 0, 0, b""],
    "negative group": ["S", -1, 8, packed(1)],
    "group past the layout": ["S", GROUPS, 8, packed(1)],
    "fractional group": ["S", "0.5", 8, packed(1)],
    "group not a number": ["R", "meta", 8, packed(1)],
    "fields not a multiple of the width": ["S", 0, 8, packed(1) + b"x"],
    "width past 64": ["S", 0, 65, b"y" * 65],
    "unknown operation": ["X", 0, 8, packed(1)],
    "missing field": ["S", 0, 8],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_malformed_operation_after_a_good_one_changes_nothing(client, namespace, name):
    assert run(client, namespace, [*header(0), "S", 0, 8, packed(1, 2)]) == 1
    before = state(client, namespace)
    start = time.monotonic()
    result = run(client, namespace, [*header(1), "S", 1, 8, packed(7), *BAD[name]])
    assert time.monotonic() - start < 2
    assert result == -1
    assert state(client, namespace) == before


@pytest.mark.parametrize(
    "args",
    [
        header("x"),
        header(-1),
        header(1, max_fields="many"),
        [*header(1, max_fields=1), "S", 0, 8, packed(5, 6)],
        header(1)[:6],
    ],
    ids=["seq not a number", "negative seq", "max_fields not a number", "too many", "short"],
)
def test_a_malformed_header_changes_nothing(client, namespace, args):
    assert run(client, namespace, [*header(0), "S", 0, 8, packed(1, 2)]) == 1
    before = state(client, namespace)
    assert run(client, namespace, args) == -1
    assert state(client, namespace) == before


def test_a_batch_past_max_blocks_changes_nothing_even_with_a_clear(client, namespace):
    assert run(client, namespace, [*header(0, max_blocks=3), "S", 0, 8, packed(1, 2)]) == 1
    before = state(client, namespace)
    # A clear then four stores: 4 entries, one more than 3.
    over = [*header(1, max_blocks=3), "C", 0, 0, b"", "S", 1, 8, packed(3, 4, 5, 6)]
    assert run(client, namespace, over) == 3
    assert state(client, namespace) == before
    # Removing one of them in the same batch makes it fit: 3 entries.
    fits = [*over, "R", 1, 8, packed(6)]
    assert run(client, namespace, fits) == 1
    assert client.hget(keys(namespace)[0], "n") == b"3"
    assert client.smembers(keys(namespace)[2]) == {packed(3), packed(4), packed(5)}
    assert not client.exists(keys(namespace)[1])


def test_copies_are_counted_and_removed_one_by_one(client, namespace):
    # Hash 9 stored three times (three blocks with equal contents), then
    # removed twice: one copy is left, in the set, with no extra count.
    assert run(client, namespace, [*header(0), "S", 0, 8, packed(9, 9), "S", 0, 8, packed(9)]) == 1
    assert client.hget(keys(namespace)[3], packed(9)) == b"2"
    assert run(client, namespace, [*header(1), "R", 0, 8, packed(9, 9)]) == 1
    assert client.smembers(keys(namespace)[1]) == {packed(9)}
    assert not client.exists(keys(namespace)[3])
    assert client.hget(keys(namespace)[0], "n") == b"1"
