"""Everything a block pool holds, as one comparable value (for "nothing changed" tests)."""

from __future__ import annotations

from kvcore._block_pool import BlockPool


def pool_state(pool: BlockPool) -> tuple[object, ...]:
    """Reference counts, free queue order, hashes, groups, maps, reservations, events, counts."""
    return (
        tuple(pool._ref),
        tuple(pool.free_block_ids()),
        tuple(pool._hash),
        tuple(pool._group),
        tuple(
            (dict(cached), {h: tuple(b) for h, b in dups.items()})
            for cached, dups in zip(pool._cached, pool._dups, strict=True)
        ),
        tuple(pool._reserved),
        pool.peek_events(),
        pool.get_num_free_blocks(),
        pool.num_evicted,
    )
