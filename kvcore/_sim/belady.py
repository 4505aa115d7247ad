"""``--eviction belady``: the offline optimum every report shows next to the ceiling.

Belady's rule evicts the block whose next use lies farthest in the future. An
engine cannot know that; a simulator replaying a trace can. The oracle is
built before the replay from the workload alone:

* each request's unbounded-cache hit ``E`` (the ceiling's, in arrival order);
* the blocks such a hit reads in every group: the whole prefix ``[0, E)`` in
  a group that reads it all (full attention), only those covering the spec's
  ``tokens_read(E)`` in the others (the last window, the last Mamba state;
  :attr:`kvcore.eviction.GroupInfo.tokens_read`);
* per (group, block hash), the arrival indices of the requests that read it.

During the replay the simulator tells the oracle which request it is looking
up (``now``); a freed block's priority is its next use after ``now``
(never: first to go). Equal next uses evict the deeper block first, so a
chain loses its tail before its head. Victims come from a heap with lazy
deletion (entries of revived or re-queued blocks are skipped when popped, and
an entry whose use went by without a hit is re-queued with its next use), so
no operation scans the pool. It is an upper bound in practice, not a proof:
with chained hashes and several groups, "farthest next use" is a heuristic.
"""

from __future__ import annotations

import heapq
from array import array
from collections import deque
from collections.abc import Hashable, Iterable, Iterator, Sequence

from kvcore._hashing import BlockHasher
from kvcore._request import Request
from kvcore._trace import TraceRequest
from kvcore.eviction import GroupInfo, PoolInfo, PoolView

__all__ = ["NEVER", "BeladyPolicy", "FutureUses"]

#: Next use of a block no later request reads.
NEVER = (1 << 24) - 1
_BLOCK_BITS = 32
_DEPTH_BITS = 20


class FutureUses:
    """Per (group, block hash), the arrival indices of the requests whose hit reads it.

    Args:
        requests: The replayed requests, in arrival order.
        hits: Each request's unbounded-cache hit in tokens (a multiple of the
            hit alignment).
        groups: The pool's groups.
        hash_block_size: Tokens per hash of the manager.
        hash_algorithm: The manager's hash algorithm.

    Attributes:
        now: Arrival index of the request being looked up (-1 before any).
    """

    __slots__ = ("_first", "_next", "_time", "now")

    def __init__(
        self,
        requests: Sequence[TraceRequest],
        hits: Sequence[int],
        groups: Sequence[GroupInfo],
        hash_block_size: int,
        hash_algorithm: str,
    ) -> None:
        self.now = -1
        self._time = array("i")
        self._next = array("i")
        self._first: list[dict[Hashable, int]] = [{} for _ in groups]
        last: list[dict[Hashable, int]] = [{} for _ in groups]
        hasher = BlockHasher(hash_block_size, hash_algorithm)
        time = self._time
        nxt = self._next
        for index, (trace, hit) in enumerate(zip(requests, hits, strict=True)):
            if hit <= 0:
                continue
            request = Request(trace.request_id, trace.prompt_token_ids[:hit])
            hasher.update(request)
            hashes = request.block_hashes
            for group, info in enumerate(groups):
                if not info.prefix_cached:
                    continue
                size = info.block_size
                scale = size // hash_block_size
                if info.tokens_read is None:
                    positions: Iterable[int] = range(hit // size)
                else:
                    positions = sorted(
                        {
                            p
                            for r in info.tokens_read(hit)
                            if r
                            for p in range(r.start // size, (r.stop - 1) // size + 1)
                        }
                    )
                first, tails = self._first[group], last[group]
                for position in positions:
                    key = hashes[(position + 1) * scale - 1]
                    event = len(time)
                    time.append(index)
                    nxt.append(-1)
                    previous = tails.get(key)
                    if previous is None:
                        first[key] = event
                    else:
                        nxt[previous] = event
                    tails[key] = event

    def next_use(self, group: int, block_hash: Hashable) -> int:
        """The first arrival index after :attr:`now` whose hit reads the block, or :data:`NEVER`.

        Uses at or before ``now`` are dropped for good (``now`` only grows), so
        each use is stepped over once.
        """
        first = self._first[group]
        event = first.get(block_hash)
        if event is None:
            return NEVER
        time = self._time
        now = self.now
        if time[event] > now:
            return time[event]
        nxt = self._next
        while event >= 0 and time[event] <= now:
            event = nxt[event]
        if event < 0:
            del first[block_hash]
            return NEVER
        first[block_hash] = event
        return time[event]


class BeladyPolicy:
    """Evict the free block whose next use is farthest away (needs :class:`FutureUses`).

    Never-allocated blocks go first, then blocks without a hash, then the
    cached ones by next use, latest first.
    """

    __slots__ = (
        "_end",
        "_free",
        "_fresh_end",
        "_fresh_start",
        "_heap",
        "_key",
        "_sizes",
        "_view",
        "_worthless",
        "groups",
        "num_in_heap",
        "uses",
    )

    def __init__(self, info: PoolInfo, uses: FutureUses | None = None) -> None:
        n = info.num_blocks
        assert info.view is not None
        self._view: PoolView = info.view
        self._sizes = tuple(group.block_size for group in info.groups)
        #: The pool's groups (the oracle reads their ``tokens_read``).
        self.groups = info.groups
        #: The oracle; must be set before the first block is freed.
        self.uses = uses
        # A page class of a two-level pool starts with no free block.
        self._fresh_start = 0 if info.free_at_start else n
        self._fresh_end = n
        self._free = bytearray(n)
        self._key = array("q", bytes(8 * n))
        self._end = array("i", bytes(4 * n))
        self._heap: list[int] = []
        self._worthless: deque[int] = deque()
        self.num_in_heap = 0

    def _entry(self, block: int) -> int:
        view = self._view
        assert self.uses is not None, "BeladyPolicy.uses must be set before blocks are freed"
        next_use = self.uses.next_use(view.block_group(block), view.block_hash(block))
        depth = min(self._end[block], (1 << _DEPTH_BITS) - 1)
        key = (next_use << _DEPTH_BITS) | depth
        self._key[block] = key
        # heapq pops the smallest: negate, so the latest use (then the deepest) comes first.
        return -((key << _BLOCK_BITS) | block)

    def take(self, n: int) -> list[int]:
        """Fresh blocks, then hashless ones, then the farthest next uses."""
        out: list[int] = []
        fresh = min(n, self._fresh_end - self._fresh_start)
        if fresh:
            out.extend(range(self._fresh_start, self._fresh_start + fresh))
            self._fresh_start += fresh
            n -= fresh
        free = self._free
        keys = self._key
        worthless = self._worthless
        while n and worthless:
            block = worthless.popleft()
            if not free[block] or keys[block] != -1:
                continue  # revived (a two-level pool's page left its class), or queued by use
            free[block] = 0
            out.append(block)
            n -= 1
        heap = self._heap
        mask = (1 << _BLOCK_BITS) - 1
        now = self.uses.now if self.uses is not None else -1
        while n:
            entry = -heapq.heappop(heap)
            block = entry & mask
            key = entry >> _BLOCK_BITS
            if not free[block] or key != self._key[block]:
                continue  # revived, or queued again since
            if self._view.block_hash(block) is not None and (key >> _DEPTH_BITS) <= now:
                heapq.heappush(heap, self._entry(block))  # its use went by unread
                continue
            free[block] = 0
            self.num_in_heap -= 1
            out.append(block)
            n -= 1
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Queue freed blocks by next use."""
        free = self._free
        view = self._view
        heap = self._heap
        for block in blocks:
            free[block] = 1
            if view.block_hash(block) is None:
                self._key[block] = -1
                self._worthless.append(block)
                continue
            heapq.heappush(heap, self._entry(block))
            self.num_in_heap += 1
        if len(heap) > 2 * self.num_in_heap + 4096:
            self._compact()

    def revive(self, block: int) -> None:
        """A hit took the block back (its entry goes stale)."""
        if self._key[block] != -1:
            self.num_in_heap -= 1
        self._free[block] = 0
        self._key[block] = -1

    def withdraw(self, block: int) -> None:
        """The block's large page left the class: it leaves the free set as a hit takes it."""
        self.revive(block)

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """Record each cached block's depth (the tie-break)."""
        size = self._sizes[group]
        end = self._end
        for index in range(start, stop):
            block = blocks[index]
            if block:
                end[block] = (index + 1) * size

    def hit(self, blocks: Sequence[int]) -> None:
        """Hits need no bookkeeping: the next use is recomputed when the block is freed."""

    def forget(self, blocks: Sequence[int] | None) -> None:
        """A block without a hash is found worthless when its entry is popped."""

    def __iter__(self) -> Iterator[int]:
        """The free blocks (fresh, hashless, then by next use, latest first)."""
        yield from range(self._fresh_start, self._fresh_end)
        free, keys = self._free, self._key
        yield from (b for b in dict.fromkeys(self._worthless) if free[b] and keys[b] == -1)
        mask = (1 << _BLOCK_BITS) - 1
        seen = set()
        for entry in sorted((-e for e in self._heap), reverse=True):
            block = entry & mask
            live = self._free[block] and (entry >> _BLOCK_BITS) == self._key[block]
            if live and block not in seen:
                seen.add(block)
                yield block

    def _compact(self) -> None:
        mask = (1 << _BLOCK_BITS) - 1
        free = self._free
        keys = self._key
        live = {}
        for entry in self._heap:
            block = -entry & mask
            if free[block] and (-entry >> _BLOCK_BITS) == keys[block]:
                live[block] = entry
        self._heap = list(live.values())
        heapq.heapify(self._heap)
        self.num_in_heap = len(self._heap)
