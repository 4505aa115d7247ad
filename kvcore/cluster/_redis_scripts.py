"""The Redis backend's server-side scripts (Lua), kept apart from the client code.

This module imports nothing from redis-py: the scripts are plain text, sent
by :class:`~kvcore.cluster.RedisBackend`.
"""

from __future__ import annotations

from typing import Final

from kvcore.cluster._backend import RETIRED_KEPT, ApplyResult

__all__ = ["APPLY", "QUERY", "RESULTS"]

# KEYS[1] = meta, then one set key per group, then one copies key per group.
# ARGV = seq, ts, ttl_ms, reset, incarnation, max_blocks (-1: none), max_fields,
# then per operation: op ("S", "R" or "C"), group, field width, the packed
# fields (a clear has group 0, width 0, "").
#
# The script checks everything before its first write, so a refused batch, or
# one Redis stops with an out-of-memory error (Redis refuses only a script's
# first growing write), changes nothing: (1) the arguments (groups, widths,
# field counts: no input loops or grows without bound), (2) sequence and
# incarnation (kvcore.cluster._backend.sequence_decision), (3) the final count
# of every hash the batch touches (from the stored counts, read with pcall so
# a key of another type is found before any write) against max_blocks. Then
# it writes the final state of those hashes with bulk commands: only keys it
# has read (or deleted, on a reset), so every write is to a key of the right
# type. Returns a code of RESULTS.
APPLY: Final = """
local num_groups = (#KEYS - 1) / 2
local n = #ARGV
local seq = tonumber(ARGV[1])
local max_blocks = tonumber(ARGV[6])
local max_fields = tonumber(ARGV[7])
local function whole(x) return x ~= nil and x >= 0 and x == math.floor(x) end
if num_groups < 1 or num_groups ~= math.floor(num_groups) or not whole(seq)
    or not whole(max_fields) or max_blocks == nil or (n - 7) % 4 ~= 0 then
  return -1
end
local total, first = 0, 8
for i = 8, n, 4 do
  local op = ARGV[i]
  if op == 'C' then
    first = i + 4
  elseif op == 'S' or op == 'R' then
    local group, width = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    if not whole(group) or group >= num_groups or not whole(width) or width < 1
        or width > 64 or #ARGV[i + 3] % width ~= 0 then
      return -1
    end
    total = total + #ARGV[i + 3] / width
    if total > max_fields then return -1 end
  else
    return -1
  end
end
-- A meta key of another type (someone else wrote there) reads as absent: the
-- batch then resets the engine, whose keys are deleted first.
local meta = {}
local read, found = pcall(redis.call, 'HMGET', KEYS[1], 'seq', 'inc', 'n', 'retired')
if read then meta = found end
local inc = ARGV[5]
local reset = ARGV[4] == '1'
local last = tonumber(meta[1])
-- Retired incarnations, as |id|id|...| ('!' stands for the empty incarnation).
local retired = meta[4] or ''
local function key_of(id) if id == '' then return '!' end return id end
if last == nil then
  reset = true
elseif (meta[2] or '') ~= inc then
  if string.find(retired, '|' .. key_of(inc) .. '|', 1, true) then return 2 end
  reset = true
  local kept = {}
  for id in string.gmatch(retired, '[^|]+') do kept[#kept + 1] = id end
  kept[#kept + 1] = key_of(meta[2] or '')
  retired = '|' .. table.concat(kept, '|', math.max(1, #kept - RETIRED_KEPT + 1)) .. '|'
elseif seq <= last then
  if not (reset and inc == '') then return 0 end
  reset = true
elseif seq ~= last + 1 and not reset then
  return 5
end
if first > 8 then reset = true end
-- One pass over the operations after the last clear: each hash is sliced
-- once; `now` holds the count of every hash touched as the batch changes it
-- (a hash first seen starts at its stored count), `base` the stored count of
-- those the engine held, `touched` (counted by `sizes`) the order hashes were
-- first seen in. The stored counts of an operation's new hashes are read in
-- bulk (SMISMEMBER, and HMGET when the group has a copies hash at all).
-- Appends use explicit counters: the length operator costs a search a call.
local touched, sizes, base, now, has_copies = {}, {}, {}, {}, {}
for g = 0, num_groups - 1 do
  touched[g], sizes[g], base[g], now[g] = {}, 0, {}, {}
  has_copies[g] = not reset and redis.call('EXISTS', KEYS[num_groups + g + 2]) == 1
end
local held = reset and 0 or (tonumber(meta[3]) or 0)
for i = first, n, 4 do
  local g, width, packed = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3]
  local list, known, counts, size = touched[g], base[g], now[g], sizes[g]
  local fields, f, seen = {}, 0, size
  for p = 1, #packed, width do
    local field = string.sub(packed, p, p + width - 1)
    f = f + 1
    fields[f] = field
    if counts[field] == nil then
      counts[field] = 0
      size = size + 1
      list[size] = field
    end
  end
  sizes[g] = size
  if not reset then
    -- The hashes this operation is the first to touch: list[seen + 1 .. size].
    for s = seen + 1, size, 4000 do
      local e = math.min(size, s + 3999)
      -- A key of another type fails the read, before any write: broken.
      local read, present = pcall(redis.call, 'SMISMEMBER', KEYS[g + 2], unpack(list, s, e))
      if not read then return 4 end
      local extra = {}
      if has_copies[g] then
        read, extra = pcall(redis.call, 'HMGET', KEYS[num_groups + g + 2], unpack(list, s, e))
        if not read then return 4 end
      end
      for j = 1, e - s + 1 do
        if present[j] == 1 then
          local field, count = list[s + j - 1], 1 + (tonumber(extra[j]) or 0)
          known[field], counts[field] = count, count
        end
      end
    end
  end
  if ARGV[i] == 'S' then
    for j = 1, f do
      local field = fields[j]
      counts[field] = counts[field] + 1
    end
    held = held + f
  else
    for j = 1, f do
      local field = fields[j]
      local count = counts[field]
      if count > 0 then
        counts[field] = count - 1
        held = held - 1
      end
    end
  end
end
if max_blocks >= 0 and held > max_blocks then return 3 end
if reset then redis.call('DEL', unpack(KEYS)) end
local function bulk(command, key, items, size)
  for s = 1, size, 4000 do
    redis.call(command, key, unpack(items, s, math.min(size, s + 3999)))
  end
end
for g = 0, num_groups - 1 do
  local added, gone, copies, single = {}, {}, {}, {}
  local a, r, c, o = 0, 0, 0, 0
  local known, counts, list = base[g], now[g], touched[g]
  for j = 1, sizes[g] do
    local field = list[j]
    local was, count = known[field] or 0, counts[field]
    if count > 0 and was == 0 then a = a + 1; added[a] = field end
    if count == 0 and was > 0 then r = r + 1; gone[r] = field end
    if count > 1 and count ~= was then
      copies[c + 1], copies[c + 2] = field, count - 1
      c = c + 2
    elseif count <= 1 and was > 1 then
      o = o + 1
      single[o] = field
    end
  end
  bulk('SADD', KEYS[g + 2], added, a)
  bulk('SREM', KEYS[g + 2], gone, r)
  bulk('HSET', KEYS[num_groups + g + 2], copies, c)
  bulk('HDEL', KEYS[num_groups + g + 2], single, o)
end
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'ts', ARGV[2], 'inc', inc, 'n', held,
  'retired', retired)
for k = 1, #KEYS do redis.call('PEXPIRE', KEYS[k], ARGV[3]) end
return 1
""".replace("RETIRED_KEPT", str(RETIRED_KEPT))

# What the apply script's codes mean.
RESULTS: Final = {
    1: ApplyResult.APPLIED,
    0: ApplyResult.DUPLICATE,
    2: ApplyResult.STALE,
    3: ApplyResult.OVER_CAPACITY,
    4: ApplyResult.BROKEN,
    5: ApplyResult.OUT_OF_ORDER,
    -1: ApplyResult.INVALID,
}

# ARGV = namespace, number of groups, number of engines, engine ids, then per
# group: field width, packed fields. Returns per engine: {alive (0/1), flags of
# group 0, flags of group 1, ...}, a flag ("0"/"1") per field. A group key of
# another type than a set (someone else wrote there) reads as holding nothing.
QUERY: Final = """
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
        local ok, found = pcall(redis.call, 'SMISMEMBER', base .. ':g:' .. g, unpack(list, s, e))
        if ok then
          parts[#parts + 1] = table.concat(found)
        else
          parts[#parts + 1] = string.rep('0', e - s + 1)
        end
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
