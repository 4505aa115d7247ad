"""The built-in online eviction policies besides ``"lru"``: ``admit``, ``frequency``, ``cost``.

They use only what a serving engine knows, with the same parameters on every
model and workload. All three share the rules below and differ in how long a
cached block is kept once free (its *credit*, see :mod:`kvcore._eviction.credit`).

**Worthless first.** A free block without a hash (never cached, or its hash
was dropped) goes before any cached one.

**Admission for suffix groups.** A group whose hit of ``E`` tokens reads
only some of the tokens before ``E`` (the spec's ``tokens_read(E)``: a
sliding window, a Mamba or linear-attention state, a chunked-local chunk) caches a block at
every boundary of every prompt, and nearly all of them are never read: a
Mamba state is read only by a hit that ends exactly there. Under LRU they
crowd out the prefix they belong to. So a suffix block is *admitted* (kept
like any cached block) only where a hit is likely to end:

- at the end of its prompt, or up to ``tail_tokens`` before it: a
  conversation resends its context, and the next turn's hit ends where this
  prompt ended, or a little before when the client re-renders the last
  turn's closing tokens or a router hashes prompts in chunks (256 to 512
  tokens is common);
- at *checkpoints*, spaced so that they cost at most ``checkpoint_share`` of
  the prefix blocks between two of them: a hit that cannot end at the tail
  falls back to the nearest checkpoint instead of to nothing. A 544-token
  Mamba state in three groups is checkpointed every ~52 k tokens, a 128-token
  sliding window of 16-token blocks every ~4 k tokens;
- where a hit already ended (the block was read by a hit: a branch point
  that other requests share).

A suffix block that is not admitted stays cached while free, but is taken
right after the worthless blocks.

**Chains lose depth in order.** A suffix block is freed as soon as its
request moves past it, long before the prefix it belongs to. When a prefix
block is freed, the admitted suffix blocks ending at the same token (found
through the pool's map: same hash, other group) are queued again right
behind it; an admitted suffix block freed after its prefix block joins it
there. A chain is then given up from its tail: prefix block, the state or
window there, the prefix block before it, and so on; a hit falls back to the
deepest position that still has both.

The policies:

``admit``
    These rules, least recently freed first otherwise.
``frequency``
    These rules, plus frequency (the SLRU / S3-FIFO family): a block a hit
    read is kept about one more turnover of the pool than one never hit, a
    block hit twice or more two more. Never-hit blocks go first.
``cost``
    These rules, plus the prefill compute a hit saves per byte held
    (Marconi's FLOP efficiency): attention over a long context costs more
    per token, so a long chain is kept longer. Decided once per freed chain
    (its deepest block), so a chain keeps one order, tail first. The credit
    goes only to blocks a hit has read: the compute is saved only if the
    prefix is read again, and most never are (a chain's new tail, never
    read, still goes first).
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator, Sequence

from kvcore._eviction.credit import NOT_FREE, WORTHLESS, CreditQueues
from kvcore.eviction import PoolInfo

__all__ = [
    "CHECKPOINT_SHARE",
    "TAIL_TOKENS",
    "ValuePolicy",
    "admit_policy",
    "cost_policy",
    "frequency_policy",
]

#: A continuation's hit may end this many tokens before the previous prompt's end.
TAIL_TOKENS = 512
#: Checkpoints may cost at most this share of the prefix blocks between two of them.
CHECKPOINT_SHARE = 1 / 32
#: Chain depth (tokens) from which attention outweighs the rest of a token's prefill.
DEPTH_SCALE = 8192

_CACHED = 1  # carries a hash (set when cached, cleared when taken or forgotten)
_SUFFIX = 2  # in a group that reads only the end of a hit
_ADMITTED = 4  # a suffix block at a likely hit end


class ValuePolicy:
    """Worthless blocks first, admission for suffix groups, then credit classes.

    Args:
        info: What the pool tells a policy.
        hit_credits: Credit, in turnovers of the pool, of a block hit ``k``
            times: ``hit_credits[min(k, len - 1)]``.
        depth_credit: Credit, in turnovers of the pool, per doubling of a
            freed chain's depth beyond :data:`DEPTH_SCALE` tokens, for the
            blocks of the chain a hit has read (0: none).
        tail_tokens: See the module documentation.
        checkpoint_share: See the module documentation (0: no checkpoints).
        admission: Apply the admission rule to suffix groups (``False``:
            their blocks are kept like any other).
        follow: Requeue admitted suffix blocks behind the prefix block of
            the same position.
    """

    __slots__ = (
        "_align",
        "_depth_levels",
        "_end",
        "_flags",
        "_groups",
        "_hit_levels",
        "_hits",
        "_interval",
        "_prefix_groups",
        "_queues",
        "_read_memo",
        "_share",
        "_suffix_groups",
        "_tail",
        "_view",
        "admission",
        "follow",
    )

    def __init__(
        self,
        info: PoolInfo,
        *,
        hit_credits: Sequence[float] = (0.0,),
        depth_credit: float = 0.0,
        tail_tokens: int = TAIL_TOKENS,
        checkpoint_share: float = CHECKPOINT_SHARE,
        admission: bool = True,
        follow: bool = True,
    ) -> None:
        n = info.num_blocks
        turnover = max(1, n - 1)
        self._hit_levels = len(hit_credits)
        self._depth_levels = 6 if depth_credit else 1
        # Class 1 + hit level × depth levels + depth level.
        self._queues = CreditQueues(
            n,
            [
                round(turnover * (hit + depth_credit * level))
                for hit in hit_credits
                for level in range(self._depth_levels)
            ],
        )
        self._flags = bytearray(n)
        self._hits = bytearray(n)
        self._end = array("i", bytes(4 * n))
        self._groups = info.groups
        self._align = max(1, info.alignment_tokens)
        self._tail = tail_tokens
        self._share = checkpoint_share
        self._interval: int | None = None  # computed on first use (needs the managers)
        self._read_memo: list[dict[int, tuple[range, ...]]] = [{} for _ in info.groups]
        self._view = info.view
        self._suffix_groups = tuple(
            g
            for g, group in enumerate(info.groups)
            if group.tokens_read is not None and group.prefix_cached
        )
        self._prefix_groups = tuple(
            g
            for g, group in enumerate(info.groups)
            if group.tokens_read is None and group.prefix_cached
        )
        self.admission = admission
        self.follow = follow and self._view is not None and bool(self._suffix_groups)

    # -- what the pool reports --------------------------------------------------------

    def take(self, n: int) -> list[int]:
        """The ``n`` free blocks due first (never-used ones, then worthless ones)."""
        blocks = self._queues.take(n)
        flags = self._flags
        for block in blocks:
            flags[block] = 0
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Queue freed blocks in the class their value says, in the given order."""
        queues = self._queues
        flags = self._flags
        hits = self._hits
        depth_level = self._chain_depth_level(blocks) if self._depth_levels > 1 else 0
        depth_levels = self._depth_levels
        last_hit_level = self._hit_levels - 1
        follow = self.follow
        for block in blocks:
            flag = flags[block]
            count = hits[block]
            if not flag & _CACHED or (flag & _SUFFIX and not flag & _ADMITTED and not count):
                queues.push(block, WORTHLESS)
                continue
            if follow and flag & _SUFFIX and self._join_prefix(block):
                continue
            level = count if count < last_hit_level else last_hit_level
            # Depth credit only once a hit has shown the prefix is reused: most
            # blocks never are, and their compute is saved only if they are.
            klass = 1 + level * depth_levels + (depth_level if count else 0)
            queues.push(block, klass)
            if follow and flag == _CACHED:
                self._follow(block, klass)

    def revive(self, block: int) -> None:
        """A hit took a free block back."""
        self._queues.remove(block)

    def hit(self, blocks: Sequence[int]) -> None:
        """Count the hit on every adopted block."""
        hits = self._hits
        for block in blocks:
            if block and hits[block] < 255:
                hits[block] += 1

    def forget(self, blocks: Sequence[int] | None) -> None:
        """Blocks without a hash are worthless; free ones move to the front."""
        if blocks is None:
            self._flags = bytearray(len(self._flags))
            return
        queues = self._queues
        for block in blocks:
            self._flags[block] = 0
            if queues.class_of(block) not in (WORTHLESS, NOT_FREE):
                queues.move(block, WORTHLESS)

    def cached(
        self,
        group: int,
        blocks: Sequence[int],
        start: int,
        stop: int,
        block_hashes: Sequence[Hashable],
        num_prompt_tokens: int,
    ) -> None:
        """Record each newly cached block's depth and, in suffix groups, whether it is admitted."""
        size = self._groups[group].block_size
        flags = self._flags
        hits = self._hits
        end = self._end
        suffix = self.admission and group in self._suffix_groups
        admitted = self._admitted
        for index in range(start, stop):
            block = blocks[index]
            if not block:
                continue
            stop_token = (index + 1) * size
            hits[block] = 0
            end[block] = stop_token
            if not suffix:
                flags[block] = _CACHED
            elif admitted(group, stop_token - size, stop_token, num_prompt_tokens):
                flags[block] = _CACHED | _SUFFIX | _ADMITTED
            else:
                flags[block] = _CACHED | _SUFFIX

    def __iter__(self) -> Iterator[int]:
        """The free blocks, next to be taken first."""
        return iter(self._queues)

    # -- decisions --------------------------------------------------------------------

    def _reads(self, group: int, hit_end: int, first: int, stop: int) -> bool:
        """Whether a hit ending at ``hit_end`` reads tokens of ``[first, stop)`` in ``group``."""
        memo = self._read_memo[group]
        ranges = memo.get(hit_end)
        if ranges is None:
            tokens_read = self._groups[group].tokens_read
            assert tokens_read is not None
            ranges = memo[hit_end] = tokens_read(hit_end)
        return any(r.start < stop and first < r.stop for r in ranges if r)

    def _admitted(self, group: int, first: int, stop: int, num_prompt_tokens: int) -> bool:
        """Whether a likely hit end reads the suffix block covering tokens ``[first, stop)``.

        The tokens a hit reads move right as the hit grows, so for each kind
        of likely end only the smallest candidate above ``first`` needs
        checking: if it does not read the block, no later one does.
        """
        align = self._align
        last_end = (num_prompt_tokens - 1) // align * align  # longest hit on this prompt
        after = (first // align + 1) * align  # first aligned end past ``first``
        candidate = max(after, max(0, last_end - self._tail) // align * align)
        if candidate <= last_end and self._reads(group, candidate, first, stop):
            return True
        interval = self._interval
        if interval is None:
            interval = self._interval = self._checkpoint_interval()
        if interval:
            candidate = (first // interval + 1) * interval
            if candidate <= last_end and self._reads(group, candidate, first, stop):
                return True
        return False

    def _checkpoint_interval(self) -> int:
        """Tokens between checkpoints so that they cost ``checkpoint_share`` of the prefix.

        A checkpoint costs, in every suffix group, the blocks a hit ending
        there reads (a window's worth, or one state); the prefix costs one
        block per block size of tokens in every prefix group. Rounded up to
        the hit alignment; 0 without prefix or suffix groups.
        """
        probe = 1 << 30
        cost = 0
        per_token = 0.0
        for info in self._groups:
            if not info.prefix_cached:
                continue
            if info.tokens_read is None:
                per_token += 1 / info.block_size
            else:
                ranges = [r for r in info.tokens_read(probe) if r]
                if ranges:  # the blocks of the part that ends at the hit
                    last = ranges[-1]
                    size = info.block_size
                    cost += (last.stop - 1) // size - last.start // size + 1
        if not cost or not per_token or self._share <= 0:
            return 0
        align = self._align
        return -(-round(cost / (self._share * per_token)) // align) * align

    def _chain_depth_level(self, blocks: Sequence[int]) -> int:
        """Log2 depth class of the deepest cached prefix block of a freed batch."""
        flags = self._flags
        end = self._end
        deepest = 0
        for block in blocks:
            if flags[block] == _CACHED and end[block] > deepest:
                deepest = end[block]
        return min((deepest // DEPTH_SCALE).bit_length(), self._depth_levels - 1)

    def _join_prefix(self, block: int) -> bool:
        """Queue kept suffix ``block`` behind the free prefix block ending at the same token.

        For a suffix group freed after its prefix group (the order the
        managers are called in). Returns whether such a prefix block was free.
        """
        view = self._view
        queues = self._queues
        block_hash = view.block_hash(block)  # type: ignore[union-attr]
        for group in self._prefix_groups:
            partner = view.cached_block(block_hash, group)  # type: ignore[union-attr]
            if partner is not None:
                klass = queues.class_of(partner)
                if klass != WORTHLESS and klass != NOT_FREE:
                    queues.push_after(block, partner)
                    return True
        return False

    def _follow(self, block: int, klass: int) -> None:
        """Requeue the admitted suffix blocks ending where prefix ``block`` ends, behind it.

        They join the prefix block's class: same deadline, next in line.
        """
        view = self._view
        queues = self._queues
        block_hash = view.block_hash(block)  # type: ignore[union-attr]
        for group in self._suffix_groups:
            partner = view.cached_block(block_hash, group)  # type: ignore[union-attr]
            if partner is not None:
                current = queues.class_of(partner)
                if current != WORTHLESS and current != NOT_FREE:
                    queues.move(partner, klass)


def admit_policy(info: PoolInfo) -> ValuePolicy:
    """Least recently freed first, but window and state blocks kept only where hits end."""
    return ValuePolicy(info)


def frequency_policy(info: PoolInfo) -> ValuePolicy:
    """Admission, then recency and frequency: blocks never hit go first."""
    return ValuePolicy(info, hit_credits=(0.0, 1.0, 2.0))


def cost_policy(info: PoolInfo) -> ValuePolicy:
    """Admission, then recency and prefill compute saved per byte: reused long chains last."""
    return ValuePolicy(info, depth_credit=0.25)
