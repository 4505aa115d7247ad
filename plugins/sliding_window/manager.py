"""The sliding-window attention manager."""

from __future__ import annotations

from math import gcd
from typing import ClassVar

from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore.specs import cdiv
from kvcore_plugins.sliding_window.spec import SlidingWindowSpec

__all__ = ["SlidingWindowManager", "contiguous_blocks_needed"]


def contiguous_blocks_needed(spec: SlidingWindowSpec, use_eagle: bool) -> int:
    """Cached blocks a hit must end with: those covering the last ``window - 1`` tokens.

    The token being computed is part of its own window, so only
    ``sliding_window - 1`` earlier tokens must be cached. With EAGLE one more
    block is matched and then dropped from the hit.

    Args:
        spec: The group's spec.
        use_eagle: EAGLE's last-block drop applies.
    """
    return cdiv(spec.sliding_window - 1, spec.block_size) + (1 if use_eagle else 0)


class SlidingWindowManager(SingleTypeManager[SlidingWindowSpec]):
    """Frees blocks that slid out of the window; a hit needs only the window's blocks.

    After ``n`` computed tokens the next token attends to tokens
    ``[n - sliding_window + 1, n]``; whole blocks before that are freed and
    replaced by the null block. A cache hit of ``L`` tokens needs the blocks
    holding tokens ``[L - sliding_window + 1, L)`` and nothing before them, so
    the search runs right to left for a run of
    :func:`contiguous_blocks_needed` cached blocks.
    """

    frees_skipped_blocks: ClassVar[bool] = True

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[SlidingWindowSpec]) -> tuple[list[int], ...]:
        """The longest hit whose window blocks are cached, searched right to left.

        A hit of ``k`` blocks is valid when blocks ``[k - needed, k)`` are all
        cached (``needed`` = :func:`contiguous_blocks_needed`) and
        ``k × block_size`` is a multiple of ``alignment_tokens``; the longest
        such ``k`` wins. Blocks before the run are returned as null blocks.
        With no such run, the run of cached blocks starting at block 0 is
        still a hit (everything before it is the prompt start), cut to the
        alignment. With EAGLE, one block past the hit must be cached too: the
        run is one block longer and its last block is dropped.

        The search jumps: when a window fails because block ``j`` misses,
        no window containing ``j`` can succeed, so the next candidate window
        ends just left of ``j`` and its *leftmost* block is probed first. With
        few hits that is about ``max_blocks / needed + needed`` lookups
        instead of ``max_blocks``, with the same result as probing every block.

        Returns:
            Per group id, a list of null blocks followed by the run's cached
            blocks.
        """
        kv_cache_spec = query.spec
        block_size = kv_cache_spec.block_size
        max_blocks = query.max_length // block_size
        if max_blocks <= 0:
            return query.no_hit()
        kv_cache_group_ids = query.kv_cache_group_ids
        block_hashes = query.block_hashes
        alignment_tokens = query.alignment_tokens
        use_eagle = query.use_eagle
        drop = 1 if use_eagle else 0
        # A window of one token needs no earlier block, but the reference still
        # requires the run's last block to be cached; treat it as a run of one.
        run = max(contiguous_blocks_needed(kv_cache_spec, use_eagle), 1)
        # A run may end at block r only if its right edge (after the EAGLE
        # drop) is aligned: (r + 1 - drop) × block_size ≡ 0 (mod alignment).
        stride = alignment_tokens // gcd(alignment_tokens, block_size)
        phase = (drop - 1) % stride
        get = query.cache.get_cached_block
        found: dict[int, list[int]] = {}
        # [known_lo, known_hi]: blocks known to be cached (empty when lo > hi).
        known_lo, known_hi = 0, -1
        hi = (max_blocks - 1) - ((max_blocks - 1 - phase) % stride)
        while hi - run + 1 >= 0:
            lo = hi - run + 1
            if known_lo <= lo <= known_hi:
                start, j = known_lo, known_hi + 1
            else:
                blocks = get(block_hashes[lo], kv_cache_group_ids)
                if blocks is None:
                    # Every window containing block lo fails: jump past it.
                    hi = (lo - 1) - ((lo - 1 - phase) % stride)
                    continue
                found[lo] = blocks
                start, j = lo, lo + 1
            while j <= hi:
                if known_lo <= j <= known_hi:
                    j = known_hi + 1
                    continue
                blocks = get(block_hashes[j], kv_cache_group_ids)
                if blocks is None:
                    break
                found[j] = blocks
                j += 1
            if j > hi:
                return cls._hit(found, lo, hi + 1 - drop, len(kv_cache_group_ids))
            known_lo, known_hi = start, j - 1
            hi = (j - 1) - ((j - 1 - phase) % stride)
        # No full window: the cached run from block 0, up to an aligned right edge.
        j = 0
        while j < max_blocks:
            if known_lo <= j <= known_hi:
                j = known_hi + 1
                continue
            blocks = get(block_hashes[j], kv_cache_group_ids)
            if blocks is None:
                break
            found[j] = blocks
            j += 1
        last = (j - 1) - ((j - 1 - phase) % stride)
        if last < 0:
            return tuple([] for _ in kv_cache_group_ids)
        return cls._hit(found, 0, last + 1 - drop, len(kv_cache_group_ids))

    @staticmethod
    def _hit(
        found: dict[int, list[int]], first: int, length: int, num_groups: int
    ) -> tuple[list[int], ...]:
        """Per group: nulls before ``first``, then the found blocks up to ``length``."""
        return tuple(
            [NULL_BLOCK] * first + [found[i][g] for i in range(first, length)]
            for g in range(num_groups)
        )

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the next token's window: ``max(0, n - sliding_window + 1)``.

        Example: window 4 after 7 computed tokens: the next token (index 7)
        attends to tokens 4–7, so 4 tokens are skipped.
        """
        num_skipped = num_computed_tokens - self.spec.sliding_window + 1
        return num_skipped if num_skipped > 0 else 0
