"""The Redis backend of the cluster index: shared by every router, bounded, expiring with engines.

Keys, under a namespace ``NS`` (default ``"kvcore"``):

``NS:engines``
    A set of the engine ids the index has heard of.
``NS:e:ENGINE:meta``
    A hash ``{seq, ts, inc, n, retired}``: the last batch applied for the
    engine (sequence number, time, incarnation), the engine's entry count,
    and the incarnations it has replaced. Its presence means the engine is
    alive.
``NS:e:ENGINE:g:GROUP``
    A set: the block hashes the engine has cached in that group.
``NS:e:ENGINE:c:GROUP``
    A hash: block hash → how many *more* blocks the engine has cached with a
    hash already in the set (an engine can cache two blocks with equal
    contents; rare), so a removal takes a hash out of the set only with its
    last copy.

Every key of an engine expires ``ttl_s`` after its last batch or heartbeat,
so a crashed engine's entries vanish by themselves; memory is bounded by what
the live engines cache (every field mirrors a cached block, and an engine
holds at most its pool's worth) plus one TTL of a dead engine's.

A batch is applied by one server-side script, whole or not at all: the
script checks its arguments, the keys' types, the sequence number and
incarnation, and the engine's entry count after the batch before its first
write (see ``kvcore.cluster._redis_scripts``), so a refused batch, or one that Redis stops for lack
of memory, leaves Redis as it was, and no input makes it loop or grow without
bound. A batch whose sequence number was applied already is skipped (two
routers feeding one Redis, or a retry after a dropped reply, never apply a
batch twice); one from a new incarnation drops the engine's old entries
first, one from a replaced incarnation is skipped. The script works with bulk
commands (``SMISMEMBER``, ``SADD``, ``SREM``), not one call per block. Batches
are sent many per round trip (pipelined), and a query is one script call that
returns, per live engine and group, a string of ``0``/``1`` flags over the
request's hashes.

Block hashes are sent and stored as fixed-width binary fields: a SHA-256
digest as its 32 bytes, an XXH3-128 digest as its 16, an integer hash as 8
bytes big-endian (two's complement). An event's hashes travel as one packed
string (one ``struct.pack`` on the client, sliced by the script), so neither
side handles hashes one by one in Python.

This module imports redis-py, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Hashable, Sequence
from typing import Any

from kvcore.cluster._backend import (
    CLEAR,
    STORE,
    ApplyResult,
    NotFetchedError,
    ReadyBatch,
    Snapshot,
)
from kvcore.cluster._errors import (
    IndexUnavailableError,
    InvalidConfigError,
    InvalidEventError,
    require,
)
from kvcore.cluster._redis_scripts import APPLY, QUERY, RESULTS

__all__ = ["HEAD_BLOCKS", "RedisBackend"]


def _pack(block_hashes: Sequence[Hashable]) -> tuple[int, bytes]:
    """``(width, fields)``: the hashes as fixed-width binary fields, concatenated.

    Integer hashes (signed 64-bit, as the index keeps them) become 8 bytes
    big-endian in two's complement; digests stay as they are (one width).

    Raises:
        InvalidEventError: hashes of two types or widths, an empty digest, or
            an integer outside the signed 64-bit range.
    """
    if not block_hashes:
        return 0, b""
    if type(block_hashes[0]) is bytes:
        width = len(block_hashes[0])
        if width < 1 or set(map(type, block_hashes)) != {bytes}:
            msg = "block hashes must be non-empty bytes of one width, or 64-bit integers"
            raise InvalidEventError(msg)
        packed = b"".join(block_hashes)  # type: ignore[arg-type]
        if len(packed) != width * len(block_hashes):
            msg = "block hashes of one operation must all have the same length"
            raise InvalidEventError(msg)
        return width, packed
    try:
        return 8, struct.pack(f">{len(block_hashes)}q", *block_hashes)
    except struct.error:
        msg = "integer block hashes must be within the signed 64-bit range"
        raise InvalidEventError(msg) from None


#: Blocks per group fetched for every engine by a query's first round trip.
HEAD_BLOCKS = 64

_NAMESPACE = re.compile(r"[!-9;-~]{1,100}")


def _redacted(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


class RedisBackend:
    """Keeps the cluster index in Redis (see the module documentation for the keys).

    Args:
        url: ``redis://[USER:PASSWORD@]HOST:PORT[/DB]``, ``rediss://...`` for
            TLS (the server's certificate is checked against the system's
            authorities, or the file in the URL's ``ssl_ca_certs=`` query
            argument), or ``unix://PATH``. Query arguments are redis-py's
            connection options.
        num_groups: KV cache groups of the fleet's layout.
        namespace: Key prefix; routers of one fleet share it, fleets use
            different ones (1-100 printable ASCII characters, no ``:`` nor
            space). A Redis user limited to ``~NAMESPACE:*`` keys can run
            the index.
        ttl_s: Seconds an engine's keys live after its last batch or heartbeat.
        socket_timeout_s: Seconds to wait for Redis before calling it down.

    Every Redis failure (connection, timeout, TLS, authentication, an error
    answer such as out of memory or no permission) raises
    :class:`~kvcore.cluster.IndexUnavailableError` with Redis's reason; the
    connection is made at the first call.

    Raises:
        MissingExtraError: redis-py is not installed.
        InvalidConfigError: a malformed URL or option.
    """

    name = "redis"

    def __init__(
        self,
        url: str,
        num_groups: int,
        *,
        namespace: str = "kvcore",
        ttl_s: float = 30.0,
        socket_timeout_s: float = 2.0,
    ) -> None:
        redis = require("redis", "the Redis cluster index")
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            msg = f"the Redis index URL must look like redis://HOST:PORT, got {url!r}"
            raise InvalidConfigError(msg)
        if type(num_groups) is not int or num_groups < 1:
            msg = f"num_groups must be a positive integer, got {num_groups!r}"
            raise InvalidConfigError(msg)
        if not ttl_s > 0:
            msg = f"ttl_s must be > 0 seconds, got {ttl_s!r}"
            raise InvalidConfigError(msg)
        if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
            msg = (
                "namespace must be 1-100 printable ASCII characters without ':' or spaces, "
                f"got {namespace!r}"
            )
            raise InvalidConfigError(msg)
        self.url = url
        self.num_groups = num_groups
        self.namespace = namespace
        self.ttl_ms = max(1, round(ttl_s * 1000))
        try:
            self._client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout_s,
                socket_connect_timeout=socket_timeout_s,
                retry_on_timeout=False,
            )
        except (ValueError, TypeError) as exc:
            msg = f"the Redis index URL {_redacted(url)!r} is not valid: {exc}"
            raise InvalidConfigError(msg) from None
        self._redis = redis
        self._apply_script = self._client.register_script(APPLY)
        self._query_script = self._client.register_script(QUERY)
        self._known: set[str] = set()

    def _keys(self, engine: str) -> list[str]:
        """The engine's keys: meta, one set per group, one copies hash per group."""
        base = f"{self.namespace}:e:{engine}"
        groups = range(self.num_groups)
        return (
            [f"{base}:meta"] + [f"{base}:g:{g}" for g in groups] + [f"{base}:c:{g}" for g in groups]
        )

    def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, with every Redis failure as an :class:`IndexUnavailableError`."""
        exceptions = self._redis.exceptions
        try:
            return fn(*args)
        except (exceptions.ConnectionError, exceptions.TimeoutError) as exc:
            msg = (
                f"the cluster index's redis backend is unreachable at {_redacted(self.url)}: {exc}"
            )
            raise IndexUnavailableError(msg) from exc
        except exceptions.RedisError as exc:
            msg = (
                f"the cluster index's redis backend refused the command "
                f"({type(exc).__name__}): {exc}"
            )
            raise IndexUnavailableError(msg) from exc

    def apply(self, batches: Sequence[ReadyBatch]) -> list[str]:
        """Apply batches in order in one pipeline, each by one script call, whole or not at all."""
        if not batches:
            return []
        codes: list[Any] = self._call(self._apply_pipelined, batches)
        return [RESULTS.get(code, ApplyResult.INVALID) for code in codes]

    def _script_args(self, batch: ReadyBatch) -> list[Any]:
        fields = sum(len(hashes) for _, _, hashes in batch.ops)
        max_blocks = -1 if batch.max_blocks is None else batch.max_blocks
        args: list[Any] = [
            batch.seq,
            repr(batch.ts),
            self.ttl_ms,
            1 if batch.reset else 0,
            batch.incarnation,
            max_blocks,
            fields,
        ]
        for op, group, block_hashes in batch.ops:
            if op == CLEAR:
                args += (b"C", 0, 0, b"")
            elif block_hashes:
                width, packed = _pack(block_hashes)
                args += (b"S" if op == STORE else b"R", group, width, packed)
        return args

    def _apply_pipelined(self, batches: Sequence[ReadyBatch]) -> list[Any]:
        calls = [(self._keys(batch.engine), self._script_args(batch)) for batch in batches]
        pipe = self._client.pipeline(transaction=False)
        new = {b.engine for b in batches} - self._known
        if new:
            pipe.sadd(f"{self.namespace}:engines", *sorted(new))
        for keys, args in calls:
            self._apply_script(keys=keys, args=args, client=pipe)
        results = pipe.execute()
        self._known |= new
        return list(results[1:] if new else results)

    def forget(self, engine: str) -> None:
        """Delete the engine's keys and its entry in the engine set."""

        def run() -> None:
            pipe = self._client.pipeline(transaction=False)
            pipe.delete(*self._keys(engine))
            pipe.srem(f"{self.namespace}:engines", engine)
            pipe.execute()

        self._call(run)
        self._known.discard(engine)

    def heartbeat(self, engines: Sequence[str]) -> None:
        """Push back the expiry of the engines' keys (one pipeline)."""
        if not engines:
            return

        def run() -> None:
            pipe = self._client.pipeline(transaction=False)
            for engine in engines:
                for key in self._keys(engine):
                    pipe.pexpire(key, self.ttl_ms)
            pipe.execute()

        self._call(run)

    def engines(self) -> list[str]:
        """Engines whose keys have not expired."""

        def run() -> list[str]:
            members = sorted(m.decode() for m in self._client.smembers(f"{self.namespace}:engines"))
            pipe = self._client.pipeline(transaction=False)
            for member in members:
                pipe.exists(f"{self.namespace}:e:{member}:meta")
            return [m for m, alive in zip(members, pipe.execute(), strict=True) if alive]

        found: list[str] = self._call(run)
        return found

    def snapshot(
        self, engines: Sequence[str], group_hashes: Sequence[Sequence[Hashable]]
    ) -> Snapshot:
        """Flags per live engine and group over the request's first blocks, the rest on demand.

        One script call fetches the first ``HEAD_BLOCKS`` (64) blocks of every
        group for every engine; most engines' searches end there (a
        full-attention prefix stops at its first miss). An engine whose search
        goes further gets the rest of its blocks in one more call
        (:meth:`~kvcore.cluster.Snapshot.complete`).
        """
        hashes = [
            list(group_hashes[g]) if g < len(group_hashes) else [] for g in range(self.num_groups)
        ]
        packed = [_pack(h) for h in hashes]
        positions = [{h: i for i, h in enumerate(group)} for group in hashes]
        head = HEAD_BLOCKS
        flags: list[list[bytes] | None] = self._flags(engines, packed, 0, head)
        complete_len = [len(group) for group in hashes]

        def holds(position: int, group: int, block_hash: Hashable) -> bool:
            row = flags[position]
            if row is None or group >= len(row):
                return False
            index = positions[group].get(block_hash)
            if index is None:
                return False
            group_flags = row[group]
            if index >= len(group_flags):
                raise NotFetchedError
            return group_flags[index] == 49  # b"1"

        def complete(wanted: Sequence[int]) -> None:
            todo = [p for p in wanted if flags[p] is not None]
            if not todo or all(head >= n for n in complete_len):
                return
            rest = self._flags([engines[p] for p in todo], packed, head, None)
            for p, more in zip(todo, rest, strict=True):
                row = flags[p]
                assert row is not None
                flags[p] = [a + b for a, b in zip(row, more or [b""] * len(row), strict=True)]

        return Snapshot(holds, complete)

    def _flags(
        self,
        engines: Sequence[str],
        packed: Sequence[tuple[int, bytes]],
        first: int,
        last: int | None,
    ) -> list[list[bytes] | None]:
        """Per engine (``None`` if not alive), per group: flags over blocks ``[first, last)``."""
        if not engines:
            return []
        args: list[Any] = [self.namespace, self.num_groups, len(engines), *engines]
        for width, fields in packed:
            stop = None if last is None else last * width
            args += (width, fields[first * width : stop])
        rows = self._call(self._query_script, [], args)
        return [list(row[1:]) if row[0] else None for row in rows]

    def cached_blocks(self, engine: str) -> int:
        """Block entries held for ``engine`` (copies counted), all groups, from its sets."""
        keys = self._keys(engine)
        sets, copies = keys[1 : 1 + self.num_groups], keys[1 + self.num_groups :]

        def run() -> int:
            pipe = self._client.pipeline(transaction=False)
            for key in sets:
                pipe.scard(key)
            for key in copies:
                pipe.hvals(key)
            results = pipe.execute()
            counts = results[: len(sets)]
            extra = results[len(sets) :]
            return int(sum(counts)) + sum(int(v) for values in extra for v in values)

        total: int = self._call(run)
        return total

    def last_seq(self, engine: str) -> int | None:
        """The last sequence number applied for ``engine`` (``None`` once its keys expired)."""
        value = self._call(self._client.hget, self._keys(engine)[0], "seq")
        return None if value is None else int(value)

    def memory_bytes(self) -> int:
        """Bytes Redis reports in use (``INFO memory``: ``used_memory``)."""
        return int(self._call(self._client.info, "memory")["used_memory"])

    def clear_namespace(self) -> None:
        """Delete every key of this namespace (for a simulation's clean-up)."""

        def run() -> None:
            keys = list(self._client.scan_iter(match=f"{self.namespace}:*", count=1000))
            for start in range(0, len(keys), 1000):
                self._client.delete(*keys[start : start + 1000])

        self._call(run)
        self._known.clear()

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()
