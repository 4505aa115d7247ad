"""KV cache events: what a router or an external cache index needs to follow.

The pool queues one event per state change of the prefix cache when events are
enabled; ``KVCacheManager.take_events()`` hands them over and clears the queue.
Hashes are the raw block hashes kvcore computed (``bytes`` for sha256,
``int`` for the fast hash).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import attrs

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "KVCacheEvent"]


def _hash_tuple(hashes: Iterable[Hashable]) -> tuple[Hashable, ...]:
    return tuple(hashes)


def _token_tuple(tokens: Iterable[int]) -> tuple[int, ...]:
    return tuple(tokens)


@attrs.frozen(kw_only=True)
class BlockStored:
    """Full blocks of one request were added to the prefix cache of one group.

    Attributes:
        block_hashes: Hashes of the newly cached blocks, in token order. Null
            blocks in the range (skipped by windowed attention) are not cached
            and have no entry.
        parent_block_hash: Hash of the block just before the first block of
            the range, or ``None`` when the range starts at token 0.
        token_ids: The token ids of the whole range, ``block_size`` per block.
        block_size: Tokens per block of the group.
        lora_id: Integer id of the request's LoRA adapter, if any.
        lora_name: Name of the request's LoRA adapter, if any.
        group_idx: Index of the KV cache group the blocks belong to.
        kind: Attention kind of the group (``"full_attention"``,
            ``"sliding_window"``, ...), or ``None`` for a pool built without
            group kinds.
        medium: Where the blocks live; always ``"GPU"`` for now.
    """

    block_hashes: tuple[Hashable, ...] = attrs.field(converter=_hash_tuple)
    parent_block_hash: Hashable | None
    token_ids: tuple[int, ...] = attrs.field(converter=_token_tuple)
    block_size: int
    lora_id: int | None = None
    lora_name: str | None = None
    group_idx: int = 0
    kind: str | None = None
    medium: str = "GPU"


@attrs.frozen(kw_only=True)
class BlockRemoved:
    """A cached block was evicted: its hash no longer leads to it.

    Attributes:
        block_hashes: The hash that was removed (one per event).
        group_idx: Index of the KV cache group the block belonged to.
        medium: Where the block lived; always ``"GPU"`` for now.
    """

    block_hashes: tuple[Hashable, ...] = attrs.field(converter=_hash_tuple)
    group_idx: int = 0
    medium: str = "GPU"


@attrs.frozen
class AllBlocksCleared:
    """The whole prefix cache was reset (``reset_prefix_cache`` succeeded)."""


#: Any event the pool can queue.
KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared
