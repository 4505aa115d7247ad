"""The chunked local attention manager."""

from __future__ import annotations

from typing import ClassVar

from kvcore.errors import InvalidConfigError
from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore_plugins.chunked_local.spec import ChunkedLocalAttentionSpec

__all__ = ["ChunkedLocalAttentionManager"]


class ChunkedLocalAttentionManager(SingleTypeManager[ChunkedLocalAttentionSpec]):
    """Frees the blocks of finished chunks; a hit needs only the current chunk's blocks.

    A token in chunk ``k`` (tokens ``[k·C, (k+1)·C)``, ``C`` =
    ``attention_chunk_size``) sees only earlier tokens of chunk ``k``. So once
    the next token starts a new chunk, every block of the earlier chunks is
    freed and replaced by the null block, and a cache hit counts everything
    before the chunk of its last token as computed without looking it up.
    """

    frees_skipped_blocks: ClassVar[bool] = True

    @classmethod
    def validate_config(
        cls,
        spec: ChunkedLocalAttentionSpec,
        *,
        enable_caching: bool,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> None:
        """Refuse prefix caching with EAGLE, or with a hit alignment other than the block size.

        The hit search does not drop EAGLE's last block and does not align
        its result: the chunk start is a multiple of the block size only.
        Without prefix caching there is no hit search, and both are fine.

        Raises:
            InvalidConfigError: naming the option to change.
        """
        if not enable_caching:
            return
        if use_eagle:
            msg = (
                "ChunkedLocalAttentionManager does not support EAGLE with prefix caching "
                f"(ChunkedLocalAttentionSpec with attention_chunk_size="
                f"{spec.attention_chunk_size}): its hit search cannot drop EAGLE's last "
                "block; pass use_eagle=False or enable_caching=False"
            )
            raise InvalidConfigError(msg)
        if spec.block_size != alignment_tokens:
            msg = (
                "ChunkedLocalAttentionManager needs cache hits aligned to its own block "
                f"size ({spec.block_size} tokens), but the prefix-cached groups' block sizes "
                f"align hits to {alignment_tokens} tokens (their least common multiple); "
                "give the chunked-local group a block size that is a multiple of every "
                "other group's, or pass enable_caching=False"
            )
            raise InvalidConfigError(msg)

    @classmethod
    def find_longest_cache_hit(
        cls, query: HitQuery[ChunkedLocalAttentionSpec]
    ) -> tuple[list[int], ...]:
        """Null blocks up to the start of the last chunk, then cached blocks left to right.

        The token after a hit of ``max_length`` tokens sits in the chunk
        starting at ``S = (max_length // C) × C``; tokens before ``S`` are
        invisible to it, so their blocks are counted as computed (null
        blocks) with no lookup. From block ``S / block_size`` the cached
        blocks are taken until the first miss or ``max_length // block_size``
        blocks. Example: chunk 8, block 4, ``max_length`` 15 gives ``[null,
        null, b]`` if block 2 is cached, else ``[null, null]``; ``max_length``
        16 gives four null blocks (16 tokens) without any lookup.

        ``use_eagle`` and ``alignment_tokens`` are checked when the manager is
        configured (:meth:`validate_config`), never here.
        """
        max_length = query.max_length
        block_size = query.spec.block_size
        chunk = query.spec.attention_chunk_size
        first = (max_length // chunk) * chunk // block_size if max_length > 0 else 0
        hits = query.cache.match_prefix(
            query.block_hashes, first, max_length // block_size, query.kv_cache_group_ids
        )
        return tuple([NULL_BLOCK] * first + blocks for blocks in hits)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the next token's chunk: ``(n // C) × C``.

        Examples with chunk 8: 13 computed tokens skip 8; 8 skip 8 (the next
        token starts chunk 1); 7 skip 0.
        """
        chunk = self.spec.attention_chunk_size
        return (num_computed_tokens // chunk) * chunk
