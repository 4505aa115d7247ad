"""Argument checks of the engine-facing manager: counts and cache hits.

:class:`~kvcore.KVCacheManager` runs the O(1) checks inline on its hot path
and calls these only when a value needs a closer look (a count that is not a
plain ``int``, a cache hit to adopt). Each either returns clean values or
raises a request error naming the argument, before anything changes.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kvcore._hashing import hashes_at_block_size
from kvcore.errors import InvalidCacheHitError, InvalidRequestError

if TYPE_CHECKING:
    from kvcore._coordinator import KVCacheCoordinator
    from kvcore._request import Request
    from kvcore.managers import SingleTypeManager

__all__ = ["check_cache_hit", "checked_count"]

_INT = {int}


def checked_count(name: str, value: object) -> int:
    """``value`` as an ``int`` >= 0 (numpy integers accepted), else a request error.

    ``bool`` and ``float`` are refused even when integral: a float count
    would turn the pool's counters into floats.
    """
    if isinstance(value, bool | float):
        value_ok = None
    else:
        try:
            value_ok = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            value_ok = None
    if value_ok is None or value_ok < 0:
        msg = f"{name} must be an integer >= 0, got {value!r}"
        raise InvalidRequestError(msg)
    return value_ok


def check_cache_hit(
    coordinator: KVCacheCoordinator,
    request: Request,
    hits: Sequence[Sequence[int]],
    num_hit_tokens: int,
    num_computed_tokens: int,
) -> None:
    """Check that ``hits`` are this request's cache hit of ``num_hit_tokens`` tokens.

    One list per group, each covering exactly ``num_hit_tokens``; and every
    block the group will adopt (those from its first not-skipped position
    after ``num_computed_tokens`` computed tokens, local and external) is a
    block of the pool cached, in that group, under the hash its position
    implies for this request. Blocks a windowed type no longer reads are
    never adopted and not looked at (the search returns the null block
    there); a null block elsewhere must stand for tokens the type does not
    read (its ``spec.tokens_read``). O(groups + adopted blocks), no scan of
    the pool.

    The request's ``block_hashes`` must be up to date.

    Raises:
        InvalidCacheHitError: naming the group, the position and the block.
    """
    managers = coordinator.managers
    if len(hits) != len(managers):
        msg = (
            f"request {request.request_id!r}: new_computed_blocks has {len(hits)} groups, "
            f"this manager has {len(managers)}; pass what get_computed_blocks returned"
        )
        raise InvalidCacheHitError(msg)
    if not coordinator.enable_caching:
        if num_hit_tokens or any(hits):
            msg = (
                f"request {request.request_id!r}: cache-hit blocks were given, but prefix "
                "caching is disabled; pass num_new_computed_tokens=0 and no blocks"
            )
            raise InvalidCacheHitError(msg)
        return
    pool = coordinator.block_pool
    hash_of = pool._hash
    group_of = pool._group
    single_group = len(managers) == 1
    for group_id, (manager, blocks) in enumerate(zip(managers, hits, strict=True)):
        size = manager.block_size
        if len(blocks) * size != num_hit_tokens:
            msg = (
                f"request {request.request_id!r}: num_new_computed_tokens={num_hit_tokens} "
                f"but group {group_id}'s {len(blocks)} hit blocks of {size} tokens cover "
                f"{len(blocks) * size}; pass what get_computed_blocks returned"
            )
            raise InvalidCacheHitError(msg)
        if not blocks:
            continue
        first = max(0, manager.get_num_skipped_tokens(num_computed_tokens) // size)
        if first >= len(blocks):
            continue
        kept = blocks[first:]
        expected = hashes_at_block_size(request.block_hashes, coordinator.hash_block_size, size)
        if len(expected) < len(blocks):
            msg = (
                f"request {request.request_id!r}: group {group_id} has {len(blocks)} hit "
                f"blocks, but the request's tokens fill only {len(expected)}"
            )
            raise InvalidCacheHitError(msg)
        # C-level passes for the common (valid) case; the slow walk names the culprit.
        # With one group, a block cached under the right hash is in that group.
        try:
            valid = (
                min(kept) > 0
                and list(map(hash_of.__getitem__, kept)) == expected[first : len(blocks)]
                and (
                    single_group
                    or list(map(group_of.__getitem__, kept)).count(group_id) == len(kept)
                )
                and {*map(type, kept)} == _INT
            )
        except (TypeError, IndexError):
            valid = False
        if not valid:
            _check_hit_slowly(
                pool, request, manager, blocks, expected, first, group_id, num_computed_tokens
            )


def _check_hit_slowly(
    pool: object,
    request: Request,
    manager: SingleTypeManager[Any],
    blocks: Sequence[int],
    expected: Sequence[object],
    first: int,
    group_id: int,
    num_computed_tokens: int,
) -> None:
    """Walk the hit block by block: raise for the first bad one, or return.

    A null block passes where the type does not read the block's tokens at
    the first token to compute (its declared rule, ``spec.tokens_read``): the
    gap of a sinks-plus-window type, say. Everywhere else it is refused.
    """
    num_blocks = pool.num_blocks  # type: ignore[attr-defined]
    hash_of = pool._hash  # type: ignore[attr-defined]
    group_of = pool._group  # type: ignore[attr-defined]
    size = manager.block_size
    reads: tuple[range, ...] | None = None
    prefix = f"request {request.request_id!r}: cache hit"
    for position in range(first, len(blocks)):
        block = blocks[position]
        where = f"at position {position} of group {group_id}"
        if block.__class__ is not int or not 0 <= block < num_blocks:
            msg = (
                f"{prefix}: block {block!r} {where} is not a block of this pool "
                f"(ids 0..{num_blocks - 1}); pass what get_computed_blocks returned"
            )
            raise InvalidCacheHitError(msg)
        if block == 0:
            if reads is None:
                reads = tuple(manager.spec.tokens_read(num_computed_tokens))
            start, stop = position * size, (position + 1) * size
            if any(r.start < stop and r.stop > start for r in reads if r):
                msg = (
                    f"{prefix}: position {position} of group {group_id} is the null block, "
                    "but the group reads those tokens; pass what get_computed_blocks returned"
                )
                raise InvalidCacheHitError(msg)
            continue
        if hash_of[block] != expected[position] or group_of[block] != group_id:
            msg = (
                f"{prefix}: block {block} {where} is not cached under this request's hash "
                "for that position (it comes from another request's lookup, or was "
                "evicted since); look the request up again with get_computed_blocks"
            )
            raise InvalidCacheHitError(msg)
