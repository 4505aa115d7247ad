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
request moves past it, long before the prefix it belongs to. An admitted
suffix block waits behind the prefix block ending at the same token (found
through the pool's map: same hash, other group) while that block is free:
freed after it, it is queued right behind it; freed before it, it moves
there when its own turn to be evicted comes and the prefix block is free by
then (one map lookup per admitted block, none per prefix block). A chain is
then given up from its tail: prefix block, the state or window there, the
prefix block before it, and so on; a hit falls back to the deepest position
that still has both.

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
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

from kvcore._blocks import UndoLog
from kvcore._eviction.credit import JOIN, NOT_FREE, WORTHLESS, CreditQueues
from kvcore.eviction import PoolInfo, PoolView

__all__ = [
    "BUILTIN_OPTIONS",
    "CHECKPOINT_SHARE",
    "TAIL_TOKENS",
    "ValuePolicy",
    "ValueRules",
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
#: A block's state byte holds the flags above in its low bits and its hit
#: count, saturating at MAX_HITS, in the bits above them: the class of a
#: freed block is one table lookup of one byte.
_HIT = 32
MAX_HITS = 7
_HIT_BITS = MAX_HITS * _HIT  # the hit count's bits, and their value at saturation


class ValueRules:
    """The decisions of the value policies, without per-block state.

    What a freed block's class is (by its state byte and its chain's depth),
    which suffix blocks are admitted, where a joiner's prefix block is: the
    parts of :class:`ValuePolicy` that a compiled twin of its queues reuses.

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
        follow: Kept suffix blocks wait behind the prefix block of the same
            position while it is free (only with ``admission``: without it
            no suffix block is told apart).

    Attributes:
        credits: The credit of each valued class ``1 ..``, in released blocks.
        free_at_start: Whether every block is free (never used) at the start.
    """

    __slots__ = (
        "_align",
        "_block_sizes",
        "_class_tables",
        "_decode_flags",
        "_depth_levels",
        "_groups",
        "_hit_levels",
        "_interval",
        "_prefix_groups",
        "_read_memo",
        "_share",
        "_suffix_groups",
        "_tail",
        "_view",
        "admission",
        "credits",
        "follow",
        "free_at_start",
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
        turnover = max(1, info.num_blocks - 1)
        if not 1 <= len(hit_credits) <= MAX_HITS + 1:
            msg = f"hit_credits needs 1 to {MAX_HITS + 1} levels, got {len(hit_credits)}"
            raise ValueError(msg)
        self._hit_levels = len(hit_credits)
        self._depth_levels = 6 if depth_credit else 1
        self._class_tables: list[bytearray | None] = [None] * self._depth_levels
        # Class 1 + hit level × depth levels + depth level; class tables
        # mark joiners' entries with JOIN plus a class, so classes stay
        # below JOIN.
        if len(hit_credits) * self._depth_levels >= JOIN:
            msg = f"at most {JOIN - 1} credit classes, got {len(hit_credits) * self._depth_levels}"
            raise ValueError(msg)
        self.credits = [
            round(turnover * (hit + depth_credit * level))
            for hit in hit_credits
            for level in range(self._depth_levels)
        ]
        self.free_at_start = info.free_at_start
        self._groups = info.groups
        self._align = max(1, info.alignment_tokens)
        self._tail = tail_tokens
        self._share = checkpoint_share
        self._interval: int | None = None  # computed on first use (needs the managers)
        self._read_memo: list[dict[int, tuple[tuple[int, int], ...]]] = [{} for _ in info.groups]
        self._view: PoolView | None = info.view
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
        self._block_sizes = tuple(group.block_size for group in info.groups)
        # Without admission no suffix block is marked, so none could follow.
        self.follow = follow and admission and info.view is not None and bool(self._suffix_groups)
        # The flags of a block cached past its prompt, by group.
        self._decode_flags = bytes(
            _CACHED | _SUFFIX if admission and g in self._suffix_groups else _CACHED
            for g in range(len(info.groups))
        )

    def compiled_parts(self) -> dict[str, object]:
        """What a compiled twin of :class:`ValuePolicy` takes, by its argument names.

        Every class table (one per depth level, 256 bytes each, joined), the
        per-group flags and block sizes, the prefix groups a joiner's anchors
        are looked up in, whether joiners follow them at all, and the
        decision that stays in Python: the admitted suffix blocks of a prompt.
        """
        return {
            "credits": self.credits,
            "free_at_start": self.free_at_start,
            "tables": b"".join(
                self._class_tables[level] or self._build_class_table(level)
                for level in range(self._depth_levels)
            ),
            "decode_flags": self._decode_flags,
            "suffix_groups": bytes(
                self.admission and g in self._suffix_groups for g in range(len(self._groups))
            ),
            "block_sizes": self._block_sizes,
            "admitted": self._admitted_indices,
            "prefix_groups": bytes(self._prefix_groups),
            "follow": self.follow,
        }

    def _build_class_table(self, depth_level: int) -> bytearray:
        """:meth:`_class_table`, built once per depth level."""
        table = self._class_tables[depth_level] = self._class_table(depth_level)
        return table

    def _class_table(self, depth_level: int) -> bytearray:
        """The class of a freed block by its state byte, for a chain of ``depth_level``.

        When suffix blocks wait behind prefix blocks, a kept suffix block is
        marked :data:`JOIN` plus its class: a joiner of the prefix block
        under its hash (see :mod:`kvcore._eviction.credit`).
        """
        table = bytearray(256)
        for count in range(MAX_HITS + 1):
            valued = self._valued_class(count, depth_level)
            for flag in range(_HIT):
                if not flag & _CACHED or (flag & _SUFFIX and not flag & _ADMITTED and not count):
                    klass = WORTHLESS
                elif not self.follow:
                    klass = valued
                elif flag & _SUFFIX:
                    klass = JOIN | valued
                else:
                    klass = valued
                table[count * _HIT | flag] = klass
        return table

    def _valued_class(self, count: int, depth_level: int) -> int:
        """The class of a valued block hit ``count`` times, freed in a chain of ``depth_level``.

        Depth credit only once a hit has shown the prefix is reused: most
        blocks never are, and their compute is saved only if they are.
        """
        last_hit_level = self._hit_levels - 1
        level = count if count < last_hit_level else last_hit_level
        return 1 + level * self._depth_levels + (depth_level if count else 0)

    def _anchors(self, block: int) -> list[int]:
        """The prefix blocks cached under joiner ``block``'s hash, in prefix-group order."""
        view = self._view
        assert view is not None  # follow needs it
        block_hash = view.block_hash(block)
        return [
            anchor
            for group in self._prefix_groups
            if (anchor := view.cached_block(block_hash, group)) is not None
        ]

    # -- decisions --------------------------------------------------------------------

    def _blocks_read(self, group: int, hit_end: int) -> tuple[tuple[int, int], ...]:
        """Block index ranges ``[lo, hi)`` of ``group`` that a hit ending at ``hit_end`` reads."""
        memo = self._read_memo[group]
        ranges = memo.get(hit_end)
        if ranges is None:
            tokens_read = self._groups[group].tokens_read
            assert tokens_read is not None
            size = self._groups[group].block_size
            ranges = memo[hit_end] = tuple(
                (r.start // size, (r.stop - 1) // size + 1) for r in tokens_read(hit_end) if r
            )
        return ranges

    def _admitted_indices(
        self, group: int, start: int, stop: int, num_prompt_tokens: int
    ) -> list[int]:
        """Indices in ``[start, stop)`` of the suffix blocks a likely hit end reads.

        Block ``i`` covers tokens ``[i × bs, (i + 1) × bs)``. For each kind of
        likely end (the prompt's tail, a checkpoint) only the smallest
        candidate past the block's first token needs checking: the tokens a
        hit reads move right as the hit grows, so if it does not read the
        block, no later one does. Blocks sharing that candidate are handled
        together, so the work is per candidate, not per block, except in the
        last ``tail_tokens`` of the prompt.
        """
        size = self._groups[group].block_size
        align = self._align
        last_end = (num_prompt_tokens - 1) // align * align  # longest hit on this prompt
        # Only blocks starting before the longest hit can be read by it.
        stop = min(stop, -(-last_end // size))
        if start >= stop:
            return []
        blocks_read = self._blocks_read
        admitted: set[int] = set()
        # Tail: a block starting before ``tail_start`` has the candidate
        # ``tail_start``; a later one the first aligned end past its start.
        tail_start = max(0, last_end - self._tail) // align * align
        split = min(stop, max(start, -(-tail_start // size)))
        if start < split:
            for lo, hi in blocks_read(group, tail_start):
                admitted.update(range(max(lo, start), min(hi, split)))
        for index in range(split, stop):
            candidate = (index * size // align + 1) * align
            for lo, hi in blocks_read(group, candidate):
                if lo <= index < hi:
                    admitted.add(index)
                    break
        interval = self._interval
        if interval is None:
            interval = self._interval = self._checkpoint_interval()
        if interval:
            # Blocks starting in [k × interval, (k + 1) × interval) have the
            # checkpoint (k + 1) × interval.
            k = start * size // interval
            while True:
                checkpoint = (k + 1) * interval
                if checkpoint > last_end:
                    break
                run_lo = max(start, -(-(k * interval) // size))
                run_hi = min(stop, -(-checkpoint // size))
                if run_lo >= stop:
                    break
                for lo, hi in blocks_read(group, checkpoint):
                    admitted.update(range(max(lo, run_lo), min(hi, run_hi)))
                k += 1
        return sorted(admitted)

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

    def _depth_level(self, chain_end: int) -> int:
        """Log2 depth class of a chain ending at token ``chain_end``, capped at the last level."""
        return min((chain_end // DEPTH_SCALE).bit_length(), self._depth_levels - 1)


class ValuePolicy(ValueRules):
    """Worthless blocks first, admission for suffix groups, then credit classes.

    The free queue of the ``admit``, ``frequency`` and ``cost`` policies:
    :class:`ValueRules` decides, and the per-block state lives here (a state
    byte, a chain end and the :class:`~kvcore._eviction.credit.CreditQueues`).
    The arguments are those of :class:`ValueRules`.
    """

    __slots__ = ("_end", "_queues", "_state", "journal")

    def __init__(self, info: PoolInfo, **options: Any) -> None:
        super().__init__(info, **options)
        n = info.num_blocks
        self._queues = CreditQueues(n, self.credits, free_at_start=self.free_at_start)
        self._state = bytearray(n)
        self._end = array("i", bytes(4 * n))
        if self.follow:
            self._queues.anchors = self._anchors
        self.journal: UndoLog | None = None

    # -- what the pool reports --------------------------------------------------------

    def take(self, n: int) -> list[int]:
        """The ``n`` free blocks due first (never-used ones, then worthless ones)."""
        blocks = self._queues.take(n)
        state = self._state
        # A taken block starts over: no hash, never hit.
        for block in blocks:
            state[block] = 0
        if self.journal is not None:
            self.journal.append((self.release, (blocks,)))
        return blocks

    def release(self, blocks: Sequence[int]) -> None:
        """Queue freed blocks in the class their value says, in the given order."""
        state = self._state
        depth_level = self._chain_depth_level(blocks) if self._depth_levels > 1 else 0
        table = self._class_tables[depth_level] or self._build_class_table(depth_level)
        classes = [table[state[block]] for block in blocks]
        if self.journal is not None:
            self.journal.append((self._unrelease, (blocks,)))
        if max(classes, default=WORTHLESS) < JOIN:
            self._queues.push_all(blocks, classes)
            return
        # A joiner (a kept suffix block, whose place depends on its prefix
        # block) is placed alone, after everything before it.
        start = 0
        for index, klass in enumerate(classes):
            if klass >= JOIN:
                if start < index:
                    self._queues.push_all(blocks[start:index], classes[start:index])
                block = blocks[index]
                queues = self._queues
                queues.push_joiner(block, klass - JOIN, queues.free_anchor_of(block))
                start = index + 1
        if start < len(blocks):
            self._queues.push_all(blocks[start:], classes[start:])

    def revive(self, blocks: Sequence[int]) -> None:
        """A hit took free ``blocks`` back."""
        self._queues.remove_all(blocks)
        if self.journal is not None:
            self.journal.append((self.release, (blocks,)))

    def withdraw(self, blocks: Sequence[int]) -> None:
        """Free ``blocks`` leave for good (their large page leaves the class): out of the queues."""
        self.revive(blocks)

    def _unrelease(self, blocks: Sequence[int]) -> None:
        """Undo of :meth:`release`: the blocks are taken out of the queues again."""
        self._queues.remove_all(blocks[::-1])

    def hit(self, blocks: Sequence[int]) -> None:
        """Count the hit on every adopted block."""
        state = self._state
        for block in blocks:
            if block:
                value = state[block]
                if value < _HIT_BITS:  # the count is not saturated
                    # (A suffix block read by a hit is valued from now on.)
                    state[block] = value + _HIT

    def forget(self, blocks: Sequence[int] | None) -> None:
        """Blocks without a hash are worthless; free ones move to the front."""
        if blocks is None:
            self._state = bytearray(len(self._state))
            return
        queues = self._queues
        for block in blocks:
            self._state[block] = 0
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
        """Record each newly cached block's depth and, in suffix groups, whether it is admitted.

        A block is never hit while uncached (``take`` and ``forget`` reset
        its count), so only its flags (and, for the cost policy, the token
        its chain ends at) are written here.
        """
        if self.journal is not None:
            self.journal.append((self.forget, ([block for block in blocks[start:stop] if block],)))
        size = self._block_sizes[group]
        if stop - start == 1 and start * size >= num_prompt_tokens:
            # One block past the prompt (a decode step's): never admitted,
            # and its flags depend only on the group.
            block = blocks[start]
            if block:
                flag = self._state[block] = self._decode_flags[group]
                if self._depth_levels > 1 and flag == _CACHED:
                    self._end[block] = stop * size  # a prefix block: its chain end
            return
        flags = self._state
        suffix = self.admission and group in self._suffix_groups
        if self._depth_levels > 1 and not suffix:
            # Only a prefix block's chain end is read (flagged _SUFFIX, a
            # kept window or state block never counts as a chain's depth).
            end = self._end
            for block, chain_end in zip(
                blocks[start:stop],
                range((start + 1) * size, (stop + 1) * size, size),
                strict=True,
            ):
                end[block] = chain_end
        if not suffix:
            for block in blocks[start:stop]:
                flags[block] = _CACHED
        else:
            for block in blocks[start:stop]:
                flags[block] = _CACHED | _SUFFIX
            for index in self._admitted_indices(group, start, stop, num_prompt_tokens):
                flags[blocks[index]] = _CACHED | _SUFFIX | _ADMITTED
        # Null blocks in the range are not cached; the null block is never
        # released or taken, but keep its state clean.
        flags[0] = 0

    def class_of(self, block: int) -> int:
        """The credit class of free ``block`` (0: worthless), or 255 if it is not in one."""
        return self._queues.class_of(block)

    def __iter__(self) -> Iterator[int]:
        """The free blocks, next to be taken first."""
        return iter(self._queues)

    def _chain_depth_level(self, blocks: Sequence[int]) -> int:
        """Log2 depth class of the deepest cached prefix block of a freed batch."""
        flags = self._state
        end = self._end
        deepest = 0
        for block in blocks:
            if flags[block] & (_CACHED | _SUFFIX) == _CACHED and end[block] > deepest:
                deepest = end[block]
        return self._depth_level(deepest)


def admit_policy(info: PoolInfo) -> ValuePolicy:
    """Least recently freed first, but window and state blocks kept only where hits end."""
    return ValuePolicy(info, **BUILTIN_OPTIONS[admit_policy])


def frequency_policy(info: PoolInfo) -> ValuePolicy:
    """Admission, then recency and frequency: blocks never hit go first."""
    return ValuePolicy(info, **BUILTIN_OPTIONS[frequency_policy])


def cost_policy(info: PoolInfo) -> ValuePolicy:
    """Admission, then recency and prefill compute saved per byte: reused long chains last."""
    return ValuePolicy(info, **BUILTIN_OPTIONS[cost_policy])


#: The :class:`ValueRules` options of each built-in value policy, by factory
#: (a compiled twin of the queues is built from the same rules).
BUILTIN_OPTIONS: Mapping[Callable[[PoolInfo], object], Mapping[str, Any]] = {
    admit_policy: {},
    frequency_policy: {"hit_credits": (0.0, 1.0, 2.0)},
    cost_policy: {"depth_credit": 0.25},
}
