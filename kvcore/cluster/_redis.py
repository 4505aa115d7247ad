"""The Redis backend of the cluster index: shared by every router, bounded, expiring with engines.

Keys, under a namespace ``NS`` (default ``"kvcore"``):

``NS:engines``
    A set of the engine ids the index has heard of.
``NS:e:ENGINE:meta``
    A hash ``{seq, ts}``: the last batch applied for the engine. Its presence
    means the engine is alive.
``NS:e:ENGINE:g:GROUP``
    A hash: block hash → how many of the engine's blocks in that group are
    cached with it (an engine can cache two blocks with equal contents).

Every key of an engine expires ``ttl_s`` after its last batch or heartbeat,
so a crashed engine's entries vanish by themselves; memory is bounded by what
the live engines cache (every field mirrors a cached block) plus one
heartbeat period of a dead engine's. A batch is applied by one server-side
script, atomically: it is skipped if its sequence number is not newer than
the engine's ``seq`` (two routers feeding one Redis, or a retry after a
dropped reply, never apply a batch twice), and the engine's keys are dropped
first when the batch resets them (a restart, lost events) or holds an
``AllBlocksCleared``. Batches are sent many per round trip (pipelined), and
a query is one script call that returns, per live engine and group, a string
of ``0``/``1`` flags over the request's hashes.

Block hashes are stored as bytes: a SHA-256 digest as is, an integer hash as
its decimal digits.

This module imports redis-py, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

from kvcore.cluster._backend import CLEAR, REMOVE, STORE, ReadyBatch, Snapshot
from kvcore.cluster._errors import InvalidConfigError, require

__all__ = ["RedisBackend"]

# KEYS[1] = meta, KEYS[2..] = group keys (group g at KEYS[g + 2]).
# ARGV = seq, ts, ttl_ms, reset, then ops: op ("S", "R" or "C"), group, count,
# then count hashes (a clear has group 0 and count 0).
_APPLY = """
local meta = KEYS[1]
local seq = tonumber(ARGV[1])
local last = redis.call('HGET', meta, 'seq')
if ARGV[4] ~= '1' and last and seq <= tonumber(last) then return 0 end
if ARGV[4] == '1' then for k = 2, #KEYS do redis.call('DEL', KEYS[k]) end end
local i = 5
local n = #ARGV
while i <= n do
  local op = ARGV[i]
  local count = tonumber(ARGV[i + 2])
  if op == 'C' then
    for k = 2, #KEYS do redis.call('DEL', KEYS[k]) end
  else
    local key = KEYS[tonumber(ARGV[i + 1]) + 2]
    for j = i + 3, i + 2 + count do
      if op == 'S' then
        redis.call('HINCRBY', key, ARGV[j], 1)
      elseif redis.call('HINCRBY', key, ARGV[j], -1) <= 0 then
        redis.call('HDEL', key, ARGV[j])
      end
    end
  end
  i = i + 3 + count
end
redis.call('HSET', meta, 'seq', ARGV[1], 'ts', ARGV[2])
for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
return 1
"""

# ARGV = namespace, number of groups, number of engines, engine ids, then per
# group: count, hashes. Returns per engine: {alive (0/1), flags of group 0, ...}.
_QUERY = """
local ns = ARGV[1]
local num_groups = tonumber(ARGV[2])
local num_engines = tonumber(ARGV[3])
local out = {}
for e = 1, num_engines do
  local engine = ARGV[3 + e]
  local row = {}
  if redis.call('EXISTS', ns .. ':e:' .. engine .. ':meta') == 1 then
    row[1] = 1
    local pos = 4 + num_engines
    for g = 0, num_groups - 1 do
      local count = tonumber(ARGV[pos])
      local flags = {}
      local key = ns .. ':e:' .. engine .. ':g:' .. g
      local done = 0
      while done < count do
        local take = math.min(4000, count - done)
        local values = redis.call('HMGET', key, unpack(ARGV, pos + 1 + done, pos + done + take))
        for j = 1, take do flags[done + j] = values[j] and '1' or '0' end
        done = done + take
      end
      row[g + 2] = table.concat(flags)
      pos = pos + count + 1
    end
  else
    row[1] = 0
  end
  out[e] = row
end
return out
"""


def _field(block_hash: Hashable) -> bytes:
    if isinstance(block_hash, bytes):
        return block_hash
    return str(block_hash).encode()


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
        base = f"{self.namespace}:e:{engine}"
        return [f"{base}:meta"] + [f"{base}:g:{g}" for g in range(self.num_groups)]

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
        return self._call(self._apply_pipelined, batches)

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
                    args += (b"C", 0, 0)
                elif group < self.num_groups:
                    args += (codes[op], group, len(block_hashes))
                    args.extend(map(_field, block_hashes))
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
        """One script call: per engine and group, flags over the request's hashes."""
        args: list[Any] = [self.namespace, self.num_groups, len(engines), *engines]
        positions: list[dict[Hashable, int]] = []
        for group in range(self.num_groups):
            hashes = group_hashes[group] if group < len(group_hashes) else ()
            args.append(len(hashes))
            args.extend(_field(h) for h in hashes)
            positions.append({h: i for i, h in enumerate(hashes)})
        rows = self._call(self._query_script, [], args) if engines else []
        flags: list[list[bytes] | None] = [row[1:] if row[0] else None for row in rows]

        def holds(position: int, group: int, block_hash: Hashable) -> bool:
            row = flags[position]
            if row is None or group >= len(row):
                return False
            index = positions[group].get(block_hash)
            return index is not None and row[group][index] == 49  # b"1"

        return Snapshot(holds)

    def cached_blocks(self, engine: str) -> int:
        """Block entries held for ``engine`` (copies counted), all groups."""
        total = 0
        for key in self._keys(engine)[1:]:
            values = self._call(self._client.hvals, key)
            total += sum(int(v) for v in values)
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
