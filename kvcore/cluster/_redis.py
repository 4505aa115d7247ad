"""The Redis backend of the cluster index: shared by every router, bounded, expiring with engines.

Keys, under a namespace ``NS`` (default ``"kvcore"``):

``NS:engines``
    A set of the engine ids the index has heard of.
``NS:e:ENGINE:meta``
    A hash ``{seq, ts}``: the last batch applied for the engine. Its presence
    means the engine is alive.
``NS:e:ENGINE:g:GROUP``
    A set: the block hashes the engine has cached in that group.
``NS:e:ENGINE:c:GROUP``
    A hash: block hash → how many *more* blocks the engine has cached with a
    hash already in the set (an engine can cache two blocks with equal
    contents; rare), so a removal takes a hash out of the set only with its
    last copy.

Every key of an engine expires ``ttl_s`` after its last batch or heartbeat,
so a crashed engine's entries vanish by themselves; memory is bounded by what
the live engines cache (every field mirrors a cached block) plus one
heartbeat period of a dead engine's. A batch is applied by one server-side
script, atomically: it is skipped if its sequence number is not newer than
the engine's ``seq`` (two routers feeding one Redis, or a retry after a
dropped reply, never apply a batch twice), and the engine's keys are dropped
first when the batch resets them (a restart, lost events) or holds an
``AllBlocksCleared``. The script works with bulk commands (``SMISMEMBER``,
``SADD``, ``SREM``), not one call per block. Batches are sent many per round
trip (pipelined), and a query is one script call that returns, per live
engine and group, a string of ``0``/``1`` flags over the request's hashes.

Block hashes are sent and stored as fixed-width binary fields: a SHA-256
digest as its 32 bytes, an integer hash as 8 bytes big-endian (two's
complement). A batch's hashes travel as one packed string per event (one
``struct.pack`` on the client, sliced by the script), so neither side handles
hashes one by one in Python.

This module imports redis-py, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Sequence
from typing import Any

from kvcore.cluster._backend import CLEAR, REMOVE, STORE, NotFetchedError, ReadyBatch, Snapshot
from kvcore.cluster._errors import InvalidConfigError, require

__all__ = ["HEAD_BLOCKS", "RedisBackend"]

# KEYS[1] = meta, then one set key per group, then one copies key per group.
# ARGV = seq, ts, ttl_ms, reset, then per operation: op ("S", "R" or "C"),
# group, field width, the packed fields (a clear has group 0, width 0, "").
# A set holds the engine's cached block hashes of a group; the copies hash
# counts the extra blocks cached with a hash already in the set (rare), so a
# removal takes the hash out only with its last copy. Bulk commands do the
# work (SMISMEMBER, SADD, HMGET, SREM); Lua only slices and picks.
_APPLY = """
local meta = KEYS[1]
local num_groups = (#KEYS - 1) / 2
local seq = tonumber(ARGV[1])
local last = redis.call('HGET', meta, 'seq')
if ARGV[4] ~= '1' and last and seq <= tonumber(last) then return 0 end
local function clear()
  for k = 2, #KEYS do redis.call('DEL', KEYS[k]) end
end
if ARGV[4] == '1' then clear() end
local i = 5
local n = #ARGV
while i <= n do
  local op = ARGV[i]
  if op == 'C' then
    clear()
  else
    local group = tonumber(ARGV[i + 1])
    local key, copies = KEYS[group + 2], KEYS[num_groups + group + 2]
    local width = tonumber(ARGV[i + 2])
    local packed = ARGV[i + 3]
    local fields = {}
    for p = 1, #packed, width do fields[#fields + 1] = string.sub(packed, p, p + width - 1) end
    for s = 1, #fields, 4000 do
      local e = math.min(#fields, s + 3999)
      if op == 'S' then
        local present = redis.call('SMISMEMBER', key, unpack(fields, s, e))
        redis.call('SADD', key, unpack(fields, s, e))
        for j = 1, #present do
          if present[j] == 1 then redis.call('HINCRBY', copies, fields[s + j - 1], 1) end
        end
      else
        local extra = redis.call('HMGET', copies, unpack(fields, s, e))
        local gone = {}
        for j = 1, #extra do
          local field = fields[s + j - 1]
          if extra[j] then
            if redis.call('HINCRBY', copies, field, -1) <= 0 then
              redis.call('HDEL', copies, field)
            end
          else
            gone[#gone + 1] = field
          end
        end
        if #gone > 0 then redis.call('SREM', key, unpack(gone)) end
      end
    end
  end
  i = i + 4
end
redis.call('HSET', meta, 'seq', ARGV[1], 'ts', ARGV[2])
for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
return 1
"""

# ARGV = namespace, number of groups, number of engines, engine ids, then per
# group: field width, packed fields. Returns per engine: {alive (0/1), flags of
# group 0, flags of group 1, ...}, a flag ("0"/"1") per field.
_QUERY = """
local ns = ARGV[1]
local num_groups = tonumber(ARGV[2])
local num_engines = tonumber(ARGV[3])
local fields = {}
for g = 0, num_groups - 1 do
  local width = tonumber(ARGV[4 + num_engines + 2 * g])
  local packed = ARGV[5 + num_engines + 2 * g]
  local list = {}
  if width > 0 then
    for p = 1, #packed, width do list[#list + 1] = string.sub(packed, p, p + width - 1) end
  end
  fields[g] = list
end
local out = {}
for e = 1, num_engines do
  local base = ns .. ':e:' .. ARGV[3 + e]
  local row = {}
  if redis.call('EXISTS', base .. ':meta') == 1 then
    row[1] = 1
    for g = 0, num_groups - 1 do
      local list = fields[g]
      local parts = {}
      for s = 1, #list, 4000 do
        local e = math.min(#list, s + 3999)
        local found = redis.call('SMISMEMBER', base .. ':g:' .. g, unpack(list, s, e))
        parts[#parts + 1] = table.concat(found)
      end
      row[g + 2] = table.concat(parts)
    end
  else
    row[1] = 0
  end
  out[e] = row
end
return out
"""


def _pack(block_hashes: Sequence[Hashable]) -> tuple[int, bytes]:
    """``(width, fields)``: the hashes as fixed-width binary fields, concatenated.

    Integer hashes become 8 bytes big-endian (negative ones in two's
    complement), digests stay as they are (all of one length).
    """
    if not block_hashes:
        return 0, b""
    first = block_hashes[0]
    if isinstance(first, bytes):
        width = len(first)
        packed = b"".join(block_hashes)  # type: ignore[arg-type]
        if len(packed) != width * len(block_hashes):
            msg = "block hashes of one batch must all have the same length"
            raise ValueError(msg)
        return width, packed
    try:
        return 8, struct.pack(f">{len(block_hashes)}q", *block_hashes)
    except struct.error:
        return 8, b"".join((h & _MASK64).to_bytes(8, "big") for h in block_hashes)  # type: ignore[operator]


_MASK64 = (1 << 64) - 1

#: Blocks per group fetched for every engine by a query's first round trip.
HEAD_BLOCKS = 64


class RedisBackend:
    """Keeps the cluster index in Redis (see the module documentation for the keys).

    Args:
        url: ``redis://HOST:PORT[/DB]``.
        num_groups: KV cache groups of the fleet's layout.
        namespace: Key prefix; routers of one fleet share it, fleets use
            different ones.
        ttl_s: Seconds an engine's keys live after its last batch or heartbeat.
        socket_timeout_s: Seconds to wait for Redis before calling it down.

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
        if not namespace or ":" in namespace:
            msg = f"namespace must be a non-empty string without ':', got {namespace!r}"
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
        except ValueError as exc:
            msg = f"the Redis index URL {url!r} is not valid: {exc}"
            raise InvalidConfigError(msg) from None
        self._redis = redis
        self._apply_script = self._client.register_script(_APPLY)
        self._query_script = self._client.register_script(_QUERY)
        self._known: set[str] = set()

    def _keys(self, engine: str) -> list[str]:
        """The engine's keys: meta, one set per group, one copies hash per group."""
        base = f"{self.namespace}:e:{engine}"
        groups = range(self.num_groups)
        return (
            [f"{base}:meta"] + [f"{base}:g:{g}" for g in groups] + [f"{base}:c:{g}" for g in groups]
        )

    def _call(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._redis.exceptions.ConnectionError as exc:
            raise ConnectionError(str(exc)) from exc
        except self._redis.exceptions.TimeoutError as exc:
            raise ConnectionError(f"timed out: {exc}") from exc

    def apply(self, batches: Sequence[ReadyBatch]) -> list[bool]:
        """Apply batches in order in one pipeline; ``False`` for those already applied."""
        if not batches:
            return []
        applied: list[bool] = self._call(self._apply_pipelined, batches)
        return applied

    def _apply_pipelined(self, batches: Sequence[ReadyBatch]) -> list[bool]:
        pipe = self._client.pipeline(transaction=False)
        new = {b.engine for b in batches} - self._known
        if new:
            pipe.sadd(f"{self.namespace}:engines", *sorted(new))
        codes = {STORE: b"S", REMOVE: b"R"}
        for batch in batches:
            args: list[Any] = [batch.seq, repr(batch.ts), self.ttl_ms, 1 if batch.reset else 0]
            for op, group, block_hashes in batch.ops:
                if op == CLEAR:
                    args += (b"C", 0, 0, b"")
                elif group < self.num_groups and block_hashes:
                    width, packed = _pack(block_hashes)
                    args += (codes[op], group, width, packed)
            self._apply_script(keys=self._keys(batch.engine), args=args, client=pipe)
        results = pipe.execute()
        self._known |= new
        if new:
            results = results[1:]
        return [bool(r) for r in results]

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
        members = self._call(self._client.smembers, f"{self.namespace}:engines")
        return [
            member
            for member in sorted(m.decode() for m in members)
            if self._call(self._client.exists, f"{self.namespace}:e:{member}:meta")
        ]

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
        """Block entries held for ``engine`` (copies counted), all groups."""
        keys = self._keys(engine)
        sets, copies = keys[1 : 1 + self.num_groups], keys[1 + self.num_groups :]
        total: int = sum(self._call(self._client.scard, key) for key in sets)
        for key in copies:
            total += sum(int(v) for v in self._call(self._client.hvals, key))
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
