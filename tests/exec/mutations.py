"""Deliberate bookkeeping bugs, each applied with pytest's monkeypatch.

Every mutation names the tiny model it is run on (one whose groups contain
the code it breaks) and how it breaks the bookkeeping; ``test_mutations``
runs each through the executor and through the bookkeeping checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kvcore import KVCacheTensor
from kvcore._block_pool import BlockPool
from kvcore._hashing import BlockHasher, hashes_at_block_size
from kvcore._hits import HybridHitRule
from kvcore._kv_cache_manager import KVCacheManager
from kvcore.executor import EngineRequest
from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore_plugins.chunked_local import ChunkedLocalAttentionManager
from kvcore_plugins.cross_attention import CrossAttentionManager
from kvcore_plugins.mamba import MambaManager
from kvcore_plugins.sink_full_attention import SinkFullAttentionManager
from kvcore_plugins.sliding_window import SlidingWindowManager


@attrs.frozen
class Mutation:
    """A bookkeeping bug: where it is, and the model that exercises that code."""

    name: str
    model: str
    apply: Callable[[Any], None]  # receives pytest's monkeypatch
    why: str
    executor_catches: bool
    bookkeeping_catches: bool
    use_eagle: bool = False
    requests: Callable[[int], list[EngineRequest]] | None = None  # of max_model_len


def _prompts_differing_in_a_block_s_last_token(max_model_len: int) -> list[EngineRequest]:
    first = list(range(1, 31))
    second = list(first)
    second[15] = 99  # the last token of block 3 (4-token blocks)
    return [
        EngineRequest(request_id="a", prompt_token_ids=first, max_output_tokens=4),
        EngineRequest(request_id="b", prompt_token_ids=second, max_output_tokens=4, arrival_step=3),
    ]


def _window_frees_one_token_too_many(mp: Any) -> None:
    original = SlidingWindowManager.get_num_skipped_tokens
    mp.setattr(
        SlidingWindowManager, "get_num_skipped_tokens", lambda self, n: original(self, n) + 1
    )


def _window_frees_one_token_too_few(mp: Any) -> None:
    original = SlidingWindowManager.get_num_skipped_tokens
    mp.setattr(
        SlidingWindowManager,
        "get_num_skipped_tokens",
        lambda self, n: max(0, original(self, n) - 1),
    )


def _window_hit_one_block_short(mp: Any) -> None:
    import kvcore_plugins.sliding_window.manager as module

    original = module.contiguous_blocks_needed
    mp.setattr(module, "contiguous_blocks_needed", lambda spec, eagle: original(spec, eagle) - 1)


def _chunk_freed_one_token_early(mp: Any) -> None:
    def skipped(self: Any, n: int) -> int:
        chunk = self.spec.attention_chunk_size
        return ((n + 1) // chunk) * chunk

    mp.setattr(ChunkedLocalAttentionManager, "get_num_skipped_tokens", skipped)


def _mamba_frees_the_live_state(mp: Any) -> None:
    mp.setattr(MambaManager, "get_num_skipped_tokens", lambda self, n: n)


def _mamba_hit_reads_the_previous_checkpoint(mp: Any) -> None:
    original = MambaManager.find_longest_cache_hit.__func__  # type: ignore[attr-defined]

    def earlier(cls: Any, query: HitQuery[Any]) -> Any:
        hits = original(cls, query)
        index = len(hits[0]) - 1
        if index >= 1:
            previous = query.cache.get_cached_block(
                query.block_hashes[index - 1], query.kv_cache_group_ids
            )
            if previous is not None:
                # The hit's length, with the state of one block boundary earlier.
                return tuple([NULL_BLOCK] * index + [block] for block in previous)
        return hits

    mp.setattr(MambaManager, "find_longest_cache_hit", classmethod(earlier))


def _stale_cache_entry_on_reuse(mp: Any) -> None:
    # Reallocating a cached free block forgets to drop its hash from the map.
    def take(self: BlockPool, num_blocks: int) -> list[int]:
        blocks = self._queue.take(num_blocks) if num_blocks else []
        self._num_free -= num_blocks
        for block in blocks:
            self._ref[block] = 1
        return blocks

    mp.setattr(BlockPool, "_take", take)


def _hash_ignores_the_last_token_of_a_block(mp: Any) -> None:
    def update(self: BlockHasher, request: Any) -> None:
        hashes = request.block_hashes
        tokens = request._all_token_ids
        size = self.block_size
        start = len(hashes) * size
        parent = hashes[-1] if hashes else None
        for offset in range(start, len(tokens) - size + 1, size):
            parent = hash((parent, tuple(tokens[offset : offset + size - 1])))
            hashes.append(parent)

    mp.setattr(BlockHasher, "update", update)


def _layers_of_a_run_share_their_pages(mp: Any) -> None:
    mp.setattr(
        KVCacheTensor,
        "page_offset",
        lambda self, layer, block: self.offset + block * self.block_stride,
    )


def _sink_blocks_not_reserved(mp: Any) -> None:
    def reserve_blocks(self: BlockPool, num_blocks: int) -> list[int]:
        return self.free_block_ids()[:num_blocks]  # named, but left in the free queue

    mp.setattr(BlockPool, "reserve_blocks", reserve_blocks)


def _cross_attention_sized_by_decoder_tokens(mp: Any) -> None:
    mp.setattr(CrossAttentionManager, "allocates_for_encoder", False)


def _freed_window_blocks_left_in_the_table(mp: Any) -> None:
    def remove_skipped_blocks(self: Any, request_id: str, total: int) -> None:
        skipped = self.get_num_skipped_tokens(total)
        table = self.req_to_blocks.get(request_id)
        if skipped <= 0 or not table:
            return
        count = min(skipped // self.block_size, len(table))
        freed = getattr(self, "_mutation_freed", None)
        if freed is None:
            freed = self._mutation_freed = set()
        removed = [b for b in table[:count] if b and (request_id, b) not in freed]
        freed.update((request_id, b) for b in removed)
        if removed:
            self.block_pool.free_blocks(removed[::-1])

    mp.setattr(SingleTypeManager, "remove_skipped_blocks", remove_skipped_blocks)


def _hybrid_hit_not_trimmed(mp: Any) -> None:
    # Full attention keeps the blocks it hit past the length every group agreed on.
    original = HybridHitRule.find

    def untrimmed(self: Any, block_hashes: Any, max_length: int, cache: Any) -> Any:
        hits, length = original(self, block_hashes, max_length, cache)
        hits = list(hits)
        for group in self._spec_groups:
            if group.downward_closed:
                longer = group.manager_cls.find_longest_cache_hit(
                    HitQuery(
                        hashes_at_block_size(block_hashes, self.hash_block_size, group.block_size),
                        max_length,
                        group.group_ids,
                        cache,
                        group.spec,
                        False,
                        group.block_size,
                    )
                )
                for group_id, blocks in zip(group.group_ids, longer, strict=True):
                    hits[group_id] = blocks
        return tuple(hits), length

    mp.setattr(HybridHitRule, "find", untrimmed)


def _eagle_keeps_the_last_hit_block(mp: Any) -> None:
    original = KVCacheManager.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.coordinator.hit_rule.use_eagle = False

    mp.setattr(KVCacheManager, "__init__", init)


def _lookahead_slots_ignored(mp: Any) -> None:
    original = KVCacheManager.allocate_slots

    def allocate_slots(self: Any, request: Any, num_new: int, *args: Any, **kwargs: Any) -> Any:
        kwargs["num_lookahead_tokens"] = 0
        return original(self, request, num_new, *args, **kwargs)

    mp.setattr(KVCacheManager, "allocate_slots", allocate_slots)


def _sink_blocks_at_the_pool_tail(mp: Any) -> None:
    # Sinks reserved, but the manager records other block ids than it reserved.
    original = SinkFullAttentionManager.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.sink_blocks = [b + len(self.sink_blocks) for b in self.sink_blocks]

    mp.setattr(SinkFullAttentionManager, "__init__", init)


MUTATIONS = [
    Mutation(
        "sliding window frees one token too many",
        "tiny-gemma",
        _window_frees_one_token_too_many,
        "off-by-one in get_num_skipped_tokens: a block still in the window is freed",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "sliding window frees one token too few",
        "tiny-gemma",
        _window_frees_one_token_too_few,
        "off-by-one the safe way: a block is freed one step late; only memory is lost",
        executor_catches=False,
        bookkeeping_catches=False,
    ),
    Mutation(
        "sliding-window hit one block short",
        "tiny-gemma",
        _window_hit_one_block_short,
        (
            "a hit accepted with the window's first block not cached (a null block in the "
            "window); allocate_slots' hit check refuses it too"
        ),
        executor_catches=True,
        bookkeeping_catches=True,
    ),
    Mutation(
        "chunk freed one token early",
        "tiny-hybrid",
        _chunk_freed_one_token_early,
        "the last token of a chunk finds its chunk's blocks freed",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "Mamba frees the live state",
        "tiny-qwen-next",
        _mamba_frees_the_live_state,
        "skipped tokens n instead of n - 1: the block holding the current state is freed",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "Mamba hit reads the previous checkpoint",
        "tiny-qwen-next",
        _mamba_hit_reads_the_previous_checkpoint,
        (
            "a hit of L tokens hands out the block holding the state after L - block_size; "
            "allocate_slots' hit check sees it cached under another position's hash"
        ),
        executor_catches=True,
        bookkeeping_catches=True,
    ),
    Mutation(
        "stale cache entry on block reuse",
        "tiny-gemma",
        _stale_cache_entry_on_reuse,
        "a reallocated block keeps its old hash in the map: later hits read overwritten KV",
        executor_catches=True,
        bookkeeping_catches=True,
    ),
    Mutation(
        "hash ignores a block's last token",
        "tiny-gemma",
        _hash_ignores_the_last_token_of_a_block,
        "two prompts differing in the last token of a block share a hash",
        executor_catches=True,
        bookkeeping_catches=False,
        requests=_prompts_differing_in_a_block_s_last_token,
    ),
    Mutation(
        "layers of a run share their pages",
        "tiny-gemma",
        _layers_of_a_run_share_their_pages,
        "KVCacheTensor.page_offset drops the layer term: a wrong page offset in the views",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "sink blocks not reserved",
        "tiny-sink",
        _sink_blocks_not_reserved,
        "the sink blocks are named but stay in the free queue and get reallocated",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "sink manager records the wrong blocks",
        "tiny-sink",
        _sink_blocks_at_the_pool_tail,
        "the sink blocks the attention reads are not the ones reserved",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "cross attention sized by decoder tokens",
        "tiny-whisper",
        _cross_attention_sized_by_decoder_tokens,
        "the encoder's blocks are allocated for the decoder's token count",
        executor_catches=True,
        bookkeeping_catches=False,
    ),
    Mutation(
        "freed window blocks left in the table",
        "tiny-gemma",
        _freed_window_blocks_left_in_the_table,
        "remove_skipped_blocks frees blocks but does not replace them by the null block",
        executor_catches=True,
        bookkeeping_catches=True,
    ),
    Mutation(
        "hybrid hit not trimmed",
        "tiny-gemma",
        _hybrid_hit_not_trimmed,
        (
            "full attention keeps hit blocks past the length every group agreed on: "
            "allocate_slots' hit check refuses blocks that cover more than the hit length"
        ),
        executor_catches=True,
        bookkeeping_catches=True,
    ),
    Mutation(
        "EAGLE keeps the last hit block",
        "tiny-gemma",
        _eagle_keeps_the_last_hit_block,
        (
            "the last matched block is not dropped; the drop protects the draft model's "
            "hidden states, and the reference model has no draft layers"
        ),
        executor_catches=False,
        bookkeeping_catches=False,
        use_eagle=True,
    ),
    Mutation(
        "lookahead slots ignored",
        "tiny-gemma",
        _lookahead_slots_ignored,
        (
            "allocate_slots gives no lookahead slots; they hold the drafter's own KV, which "
            "the reference model has no layer for (a step's draft tokens are new tokens)"
        ),
        executor_catches=False,
        bookkeeping_catches=True,
        use_eagle=True,
    ),
]
