"""Free blocks in a few FIFO classes, each with a credit: the engine of the built-in policies.

A block that becomes free is put in a *class* and gets a deadline: the
pool's release clock (blocks released so far) plus its class's *credit*, in
the same unit. The block taken next is the one with the earliest deadline.
Within a class deadlines grow in release order, so each class is a FIFO and
the earliest deadline is at the head of one of them: choosing a victim looks
at one head per class, O(classes), and nothing ever scans the pool.

With one class this is exactly least-recently-freed-first. A class with a
credit of ``c`` keeps its blocks ``c`` released blocks longer than class 0:
a credit of one pool size means "survives about one more turnover of the
pool". Two orders need no credit and are not classes:

- blocks never allocated go first, in id order (they hold nothing); one a
  hit took out of that run early (a pool's ``touch`` of a block nobody
  allocated) is remembered as a *hole* and skipped;
- *worthless* blocks (no hash, or refused by the admission rule) go next,
  least recently freed first.

A *joiner* (a kept window or state block, freed alone) belongs right behind
its *anchor*, the prefix block at the same position, while that block is
free: it goes there when it is freed after its anchor, and when its turn to
be taken comes while its anchor is free (it was freed first). So a chain is
given up prefix block first, then the blocks that need it, and a joiner
whose anchor is in use goes when its own deadline comes.

Per-block state lives in flat arrays indexed by block id: two links, a class,
a deadline and a joiner flag (27 bytes a block, plus the ints the links
refer to).
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Sequence

__all__ = ["JOIN", "NOT_FREE", "WORTHLESS", "Anchors", "CreditQueues"]

#: Class of a block that is not free.
NOT_FREE = 255
#: Class of free blocks that are taken before any valued one.
WORTHLESS = 0
#: Added to a class in a class table: the block is a joiner (see the module doc).
JOIN = 128

#: The candidate anchors of a joiner, in order: the blocks cached under its
#: hash in the prefix groups, whatever their state.
Anchors = Callable[[int], Sequence[int]]


class CreditQueues:
    """Free blocks in FIFO classes with credits; take the earliest deadline first.

    Args:
        num_blocks: Block ids ``0 .. num_blocks - 1``, all free and never
            allocated at the start (none free, with ``free_at_start=False``).
        credits: Credit of each valued class ``1 .. len(credits)``, in
            released blocks (class 0, :data:`WORTHLESS`, has none: it always
            goes first).
    """

    __slots__ = (
        "_class",
        "_clock",
        "_credits",
        "_deadline",
        "_fresh_end",
        "_fresh_start",
        "_holes",
        "_joiner",
        "_next",
        "_prev",
        "_sentinels",
        "anchors",
        "num_classes",
    )

    def __init__(
        self, num_blocks: int, credits: Sequence[int], *, free_at_start: bool = True
    ) -> None:
        self.num_classes = len(credits) + 1
        if self.num_classes > NOT_FREE:
            msg = f"at most {NOT_FREE - 1} valued classes, got {len(credits)}"
            raise ValueError(msg)
        self._credits = (0, *credits)
        # One sentinel per class after the blocks: class k's is num_blocks + k.
        size = num_blocks + self.num_classes
        self._sentinels = tuple(range(num_blocks, size))
        # Only the sentinels need a value (themselves: empty classes); a block's
        # links are written when it is queued. One shared int keeps a pool of a
        # million blocks at two list slots a block.
        self._next = [0] * size
        self._prev = [0] * size
        self._next[num_blocks:] = self._sentinels
        self._prev[num_blocks:] = self._sentinels
        self._class = bytearray([NOT_FREE]) * num_blocks
        self._deadline = array("q", bytes(8 * num_blocks))
        self._fresh_start = 0 if free_at_start else num_blocks
        self._fresh_end = num_blocks
        # Never-allocated blocks inside the fresh run taken out by remove();
        # _fresh_start itself is never one of them.
        self._holes: set[int] = set()
        self._clock = 0
        self._joiner = bytearray(num_blocks)
        #: The candidate anchors of a joiner (see :data:`Anchors`); ``None``:
        #: no joiner ever waits for its anchor at its turn.
        self.anchors: Anchors | None = None

    # -- the pool's operations --------------------------------------------------------

    def take(self, n: int) -> list[int]:
        """Remove and return ``n`` free blocks: never-used ones, worthless ones, then by deadline.

        A joiner whose turn comes while its anchor is free moves right behind
        the anchor instead (same class and deadline) and is taken after it.
        The caller guarantees at least ``n`` blocks are free.
        """
        out: list[int] = []
        n = self._take_fresh(n, out)
        if n:
            n = self._take_worthless(n, out)
        while n:
            n = self._take_valued_run(n, out)
        return out

    def _take_fresh(self, n: int, out: list[int]) -> int:
        """Append up to ``n`` never-allocated blocks to ``out``; return how many are still due."""
        if self._holes:
            return n - self._take_fresh_around_holes(n, out)
        start = self._fresh_start
        fresh = min(n, self._fresh_end - start)
        if fresh:
            self._fresh_start = start + fresh
            out.extend(range(start, start + fresh))
        return n - fresh

    def _take_worthless(self, n: int, out: list[int]) -> int:
        """Append up to ``n`` worthless blocks to ``out``, oldest first; return how many are due."""
        nxt = self._next
        cls = self._class
        sentinel = self._sentinels[WORTHLESS]
        block = nxt[sentinel]
        while n and block != sentinel:
            out.append(block)
            cls[block] = NOT_FREE
            block = nxt[block]
            n -= 1
        nxt[sentinel] = block
        self._prev[block] = sentinel
        return n

    def _take_valued_run(self, n: int, out: list[int]) -> int:
        """Append the run of up to ``n`` blocks due first to ``out``; return how many are due.

        The run comes from the class whose head has the earliest deadline
        (the first class on a tie) and goes on while it stays ahead of every
        other head: before the second head's deadline, or at it if this class
        comes first. It stops early at a joiner that moves behind its anchor.
        """
        best, bound = self._earliest_class()
        nxt = self._next
        deadline = self._deadline
        joiner = self._joiner
        cls = self._class
        block = nxt[best]
        while n and block != best and deadline[block] <= bound:
            if joiner[block]:
                joiner[block] = 0
                anchor = self.free_anchor_of(block)
                if anchor is not None:
                    # Close the run taken so far, then the joiner waits
                    # behind its anchor; the heads are looked at again.
                    nxt[best] = block
                    self._prev[block] = best
                    self._unlink(block)
                    self._insert_after(block, anchor)
                    return n
            out.append(block)
            cls[block] = NOT_FREE
            block = nxt[block]
            n -= 1
        nxt[best] = block
        self._prev[block] = best
        return n

    def _earliest_class(self) -> tuple[int, int]:
        """The sentinel of the valued class due first, and the deadline its run may reach."""
        nxt = self._next
        deadline = self._deadline
        best = -1
        best_deadline = 0
        second: int | None = None
        second_sentinel = 0
        for sentinel in self._sentinels[1:]:
            head = nxt[sentinel]
            if head == sentinel:
                continue
            due = deadline[head]
            if best < 0 or due < best_deadline:
                if best >= 0:
                    second, second_sentinel = best_deadline, best
                best, best_deadline = sentinel, due
            elif second is None or due < second:
                second, second_sentinel = due, sentinel
        if second is None:
            return best, 1 << 62  # no other head: no bound
        if best > second_sentinel:
            return best, second - 1  # a tie goes to the other class
        return best, second

    def _take_fresh_around_holes(self, n: int, out: list[int]) -> int:
        """Append up to ``n`` fresh blocks to ``out``, skipping holes; return how many."""
        holes = self._holes
        block, end = self._fresh_start, self._fresh_end
        taken = 0
        passed = []
        while taken < n and block < end:
            if block in holes:
                passed.append(block)
            else:
                out.append(block)
                taken += 1
            block += 1
        while block in holes:
            passed.append(block)
            block += 1
        holes.difference_update(passed)
        self._fresh_start = block
        return taken

    def push(self, block: int, klass: int) -> None:
        """Make ``block`` free in class ``klass`` (appended at its tail).

        Only valued blocks advance the clock: worthless ones never compete
        with them, so they must not age them either.
        """
        if klass:
            self._clock += 1
            self._deadline[block] = self._clock + self._credits[klass]
        self._class[block] = klass
        sentinel = self._sentinels[klass]
        prv = self._prev
        tail = prv[sentinel]
        self._next[tail] = block
        prv[block] = tail
        self._next[block] = sentinel
        prv[sentinel] = block

    def push_all(self, blocks: Sequence[int], classes: Sequence[int]) -> None:
        """:meth:`push` of each of ``blocks`` in its class (``classes``, same length), in order."""
        clock = self._clock
        credits = self._credits
        deadline = self._deadline
        class_of = self._class
        sentinels = self._sentinels
        nxt = self._next
        prv = self._prev
        for block, klass in zip(blocks, classes, strict=True):
            if klass:
                clock += 1
                deadline[block] = clock + credits[klass]
            class_of[block] = klass
            sentinel = sentinels[klass]
            tail = prv[sentinel]
            nxt[tail] = block
            prv[block] = tail
            nxt[block] = sentinel
            prv[sentinel] = block
        self._clock = clock

    def free_anchor_of(
        self, block: int, taken: set[int] | frozenset[int] = frozenset()
    ) -> int | None:
        """The first of joiner ``block``'s :attr:`anchors` free in a valued class and not taken."""
        if self.anchors is None:
            return None
        class_of = self._class
        for anchor in self.anchors(block):
            if WORTHLESS < class_of[anchor] < NOT_FREE and anchor not in taken:
                return anchor
        return None

    def remove(self, block: int) -> None:
        """Take free ``block`` out of its class (a hit revived it).

        A block never allocated is taken out of the fresh run instead.
        """
        self.remove_all((block,))

    def remove_all(self, blocks: Sequence[int]) -> None:
        """:meth:`remove` each of ``blocks`` (all free), in order."""
        fresh_start = self._fresh_start
        fresh_end = self._fresh_end
        holes = self._holes
        nxt = self._next
        prv = self._prev
        class_of = self._class
        joiner = self._joiner
        for block in blocks:
            if fresh_start <= block < fresh_end and block not in holes:
                self._remove_fresh(block)
                fresh_start = self._fresh_start
                continue
            before = prv[block]
            after = nxt[block]
            nxt[before] = after
            prv[after] = before
            class_of[block] = NOT_FREE
            joiner[block] = 0

    def _remove_fresh(self, block: int) -> None:
        start = self._fresh_start
        if block != start:
            self._holes.add(block)
            return
        start += 1
        holes = self._holes
        while start in holes:
            holes.discard(start)
            start += 1
        self._fresh_start = start

    def push_joiner(self, block: int, klass: int, anchor: int | None) -> None:
        """Make ``block`` free as a joiner: behind free ``anchor``, or without one in ``klass``.

        Behind ``anchor`` it takes the anchor's class and deadline; in
        ``klass`` it is appended as :meth:`push` would. Either way it waits
        behind its anchor again if its turn comes while the anchor is free.
        """
        if anchor is None:
            self.push(block, klass)
            self._joiner[block] = 1
        else:
            self._insert_after(block, anchor)

    def _insert_after(self, block: int, anchor: int) -> None:
        """Link joiner ``block`` right behind free ``anchor``: same class, same deadline."""
        klass = self._class[anchor]
        self._class[block] = klass
        self._deadline[block] = self._deadline[anchor]
        self._joiner[block] = 1
        nxt = self._next
        after = nxt[anchor]
        nxt[anchor] = block
        self._prev[block] = anchor
        nxt[block] = after
        self._prev[after] = block

    def _unlink(self, block: int) -> None:
        """Take linked ``block`` out of its class (its class byte is the caller's)."""
        before = self._prev[block]
        after = self._next[block]
        self._next[before] = after
        self._prev[after] = before

    def move(self, block: int, klass: int) -> None:
        """Move free ``block`` to the tail of class ``klass`` (its deadline restarts)."""
        self.remove(block)
        if klass:
            self._clock -= 1  # a move is not a release
        self.push(block, klass)

    # -- inspection -------------------------------------------------------------------

    def class_of(self, block: int) -> int:
        """The class of free ``block``, or :data:`NOT_FREE`."""
        return self._class[block]

    def is_free(self, block: int) -> bool:
        """Whether ``block`` is free (never allocated, or in a class)."""
        if self._class[block] != NOT_FREE:
            return True
        return self._fresh_start <= block < self._fresh_end and block not in self._holes

    def __iter__(self) -> Iterator[int]:
        """The free blocks in the order :meth:`take` would hand them out."""
        holes = self._holes
        for block in range(self._fresh_start, self._fresh_end):
            if block not in holes:
                yield block
        nxt = self._next
        sentinel = self._sentinels[WORTHLESS]
        block = nxt[sentinel]
        while block != sentinel:
            yield block
            block = nxt[block]
        heads = {}
        for sentinel in self._sentinels[1:]:
            if nxt[sentinel] != sentinel:
                heads[sentinel] = nxt[sentinel]
        deadline = self._deadline
        joiner = self._joiner
        taken: set[int] = set()
        # Joiners that take would move behind an anchor not yet handed out,
        # by anchor, the last moved first (each goes right behind it).
        waiting: dict[int, list[int]] = {}
        while heads:
            sentinel = min(heads, key=lambda s: (deadline[heads[s]], s))
            block = heads[sentinel]
            following = nxt[block]
            if following == sentinel:
                del heads[sentinel]
            else:
                heads[sentinel] = following
            if joiner[block]:
                anchor = self.free_anchor_of(block, taken)
                if anchor is not None:
                    waiting.setdefault(anchor, []).insert(0, block)
                    continue
            yield block
            taken.add(block)
            for moved in waiting.pop(block, ()):
                yield moved
                taken.add(moved)
