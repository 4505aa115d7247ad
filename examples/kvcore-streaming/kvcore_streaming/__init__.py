"""kvcore plugin: StreamingLLM-style attention, attention sinks plus a sliding window.

Each query reads the request's first ``sink_tokens`` tokens (the attention
sinks) and the ``sliding_window - 1`` tokens before it. The blocks between
the sinks and the window are freed as the window moves on, so a request holds
at most the sink blocks and the window's blocks however long it grows.

Planned from a ``config.json``: layers listed as ``"streaming"`` in
``layer_types``, or every layer of a config with ``streaming_sink_tokens``
(no ``layer_types``); both read ``streaming_sink_tokens`` and
``streaming_window``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

import kvcore
from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore.specs import AttentionSpec, TokenLimits, cdiv, positive_int

__all__ = [
    "StreamingManager",
    "StreamingSpec",
    "kvcore_layer_kinds",
    "kvcore_layer_types",
    "kvcore_model_layers",
]


@attrs.frozen(kw_only=True)
class StreamingSpec(AttentionSpec):
    """Attention to the first ``sink_tokens`` tokens and the last ``sliding_window`` tokens.

    Attributes:
        sink_tokens: Leading tokens every query reads (> 0).
        sliding_window: Tokens a query attends to at the end, itself included (> 0).
    """

    kind: ClassVar[str] = "streaming"

    sink_tokens: int = attrs.field(validator=positive_int)
    sliding_window: int = attrs.field(validator=positive_int)

    @property
    def sink_blocks(self) -> int:
        """Blocks holding a sink token: kept for the whole request."""
        return cdiv(self.sink_tokens, self.block_size)

    def tokens_read(self, position: int) -> tuple[range, ...]:
        """The sinks, then the window (which may reach back into the sinks)."""
        sinks = min(self.sink_tokens, position)
        window = max(sinks, position - self.sliding_window + 1)
        if window >= position:
            return (range(sinks),)
        return (range(sinks), range(window, position)) if sinks else (range(window, position),)

    def max_memory_usage_bytes(self, limits: TokenLimits) -> int:
        """The sink blocks, the window plus one step of tokens, and one partly used block."""
        window = min(self.sliding_window - 1 + limits.batched_tokens, limits.max_model_len)
        return (self.sink_blocks + cdiv(window, self.block_size) + 1) * self.page_size_bytes


def _blocks_read(spec: StreamingSpec, position: int) -> set[int]:
    """Block positions holding a token the query at ``position`` reads."""
    size = spec.block_size
    return {
        block
        for read in spec.tokens_read(position)
        for block in range(read.start // size, cdiv(read.stop, size))
    }


def _put_back(table: list[int], freed: list[tuple[int, int]]) -> None:
    for index, block in freed:
        table[index] = block


class StreamingManager(SingleTypeManager[StreamingSpec]):
    """Keeps the sink blocks and the window's blocks; frees the gap between them."""

    frees_skipped_blocks: ClassVar[bool] = True

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Nothing is skipped from the start: the sinks are read by every query."""
        return 0

    def remove_skipped_blocks(self, request_id: str, total_computed_tokens: int) -> None:
        """Free the blocks between the sinks and the next query's window, last first."""
        spec = self.spec
        window_start = max(0, total_computed_tokens - spec.sliding_window + 1)
        stop = window_start // self.block_size
        table = self.req_to_blocks.get(request_id, [])
        freed = []
        for index in range(min(stop, len(table)) - 1, spec.sink_blocks - 1, -1):
            if table[index] == NULL_BLOCK:
                break
            freed.append((index, table[index]))
        if freed:
            self.block_pool.free_blocks([block for _, block in freed])
            for index, _ in freed:
                table[index] = NULL_BLOCK
            # If the operation fails later, the pool undoes it: put the blocks back then.
            self.block_pool.record(_put_back, table, freed)

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        """As the base class, and no further than the window leaving the gap's next block.

        The block after the sinks that is still held is freed once the window
        starts past it: at ``(index + 1) * block_size + sliding_window - 1``
        computed tokens (a step that needs that many tokens has computed at
        most one fewer).
        """
        limit = super().steady_until(request_id, num_computed_tokens)
        table = self.req_to_blocks.get(request_id, [])
        first = range(self.spec.sink_blocks, len(table))
        held = next((index for index in first if table[index] != NULL_BLOCK), None)
        if held is not None:
            freed_at = (held + 1) * self.block_size + self.spec.sliding_window - 1
            limit = min(limit, freed_at)
        return limit

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[StreamingSpec]) -> tuple[list[int], ...]:
        """The longest aligned hit whose sink and window blocks are all cached.

        Tries every length from the longest; each block is looked up once.
        Blocks the hit does not need (the gap) are null blocks.
        """
        size = query.spec.block_size
        groups = query.kv_cache_group_ids
        extra = 1 if query.use_eagle else 0  # EAGLE: the block after the hit too
        looked_up: dict[int, list[int] | None] = {}
        for length in range(query.max_length // size - extra, 0, -1):
            if (length * size) % query.alignment_tokens:
                continue
            needed = _blocks_read(query.spec, length * size) | ({length} if extra else set())
            hits: dict[int, list[int]] = {}
            for index in sorted(needed):
                if index not in looked_up:
                    looked_up[index] = query.cache.get_cached_block(
                        query.block_hashes[index], groups
                    )
                blocks = looked_up[index]
                if blocks is None:
                    break
                hits[index] = blocks
            else:
                return tuple(
                    [hits[i][g] if i in hits else NULL_BLOCK for i in range(length)]
                    for g in range(len(groups))
                )
        return query.no_hit()


@kvcore.hookimpl
def kvcore_layer_types() -> list[kvcore.LayerType[Any]]:
    """Register streaming attention."""
    return [kvcore.LayerType(StreamingSpec, StreamingManager)]


def build_streaming(layer: kvcore.planning.LayerConfig) -> StreamingSpec:
    """A streaming layer: ``streaming_sink_tokens`` sinks and a ``streaming_window`` window."""
    return StreamingSpec(
        block_size=layer.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        dtype=layer.dtype,
        sink_tokens=layer.require_int("streaming_sink_tokens"),
        sliding_window=layer.require_int("streaming_window"),
    )


@kvcore.hookimpl
def kvcore_layer_kinds() -> list[kvcore.planning.LayerKind]:
    """Claim ``"streaming"`` layers."""
    return [kvcore.planning.LayerKind("streaming", build_streaming)]


@kvcore.hookimpl
def kvcore_model_layers(
    model: kvcore.planning.ModelFields,
) -> Sequence[kvcore.planning.ModelLayer] | None:
    """Every layer of a config with ``streaming_sink_tokens`` and no ``layer_types``."""
    if model.layer_types is not None or model.get("streaming_sink_tokens") is None:
        return None
    return model.decoder_layers(["streaming"] * model.num_hidden_layers)
