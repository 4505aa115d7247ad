"""The Mamba / linear-attention state manager."""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import ClassVar

from kvcore.errors import InvalidConfigError
from kvcore.managers import NULL_BLOCK, HitQuery, SingleTypeManager
from kvcore_plugins.mamba.spec import MambaSpec

__all__ = ["MambaManager"]


class MambaManager(SingleTypeManager[MambaSpec]):
    """Keeps only the latest state of a request; a hit is one cached state.

    Block ``i`` of a request's table holds the state after ``(i + 1) ×
    block_size`` tokens. Computing the next token needs only the state after
    the last computed one, so every block before it is freed (skipped tokens
    = ``n - 1``). Each allocation also reserves ``num_speculative_blocks``
    extra blocks for the states of speculative tokens.

    Prefix caching works only in ``mamba_cache_mode="align"``; in ``"none"``
    the group is not cacheable and a config asking for prefix caching is
    refused.
    """

    #: The state is not produced by the draft model: EAGLE never drops a block.
    eagle_drops_last_block: ClassVar[bool] = False
    #: Every state but the latest is freed as the request advances.
    frees_skipped_blocks: ClassVar[bool] = True

    @classmethod
    def is_prefix_cacheable(cls, spec: MambaSpec) -> bool:
        """Only in ``"align"`` mode are states at block boundaries cached."""
        return spec.mamba_cache_mode == "align"

    @classmethod
    def validate_config(
        cls,
        spec: MambaSpec,
        *,
        enable_caching: bool,
        use_eagle: bool,
        alignment_tokens: int,
    ) -> None:
        """Refuse prefix caching for a ``"none"``-mode group.

        Raises:
            InvalidConfigError: prefix caching is on and
                ``spec.mamba_cache_mode`` is ``"none"``.
        """
        if enable_caching and spec.mamba_cache_mode == "none":
            msg = (
                "MambaSpec.mamba_cache_mode is 'none' (one state per request, never "
                "cached) but prefix caching is on; set mamba_cache_mode='align' (with "
                "block_size equal to the attention block size) or pass enable_caching=False"
            )
            raise InvalidConfigError(msg)

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[MambaSpec]) -> tuple[list[int], ...]:
        """The latest cached state at an aligned position, searched right to left.

        A hit of ``(i + 1) × block_size`` tokens needs only block ``i`` (the
        state after those tokens), and ``(i + 1) × block_size`` must be a
        multiple of ``alignment_tokens``. Only aligned positions are probed.
        EAGLE drops nothing (the draft model has no state layers).

        Returns:
            Per group id, ``i`` null blocks followed by the cached state
            block, or an empty list when no aligned state is cached.
        """
        block_size = query.spec.block_size
        max_blocks = query.max_length // block_size
        alignment_tokens = query.alignment_tokens
        kv_cache_group_ids = query.kv_cache_group_ids
        block_hashes = query.block_hashes
        # Position i qualifies when (i + 1) × block_size ≡ 0 (mod alignment).
        stride = alignment_tokens // gcd(alignment_tokens, block_size)
        get = query.cache.get_cached_block
        for i in range((max_blocks // stride) * stride - 1, -1, -stride):
            blocks = get(block_hashes[i], kv_cache_group_ids)
            if blocks is not None:
                return tuple([NULL_BLOCK] * i + [block] for block in blocks)
        return tuple([] for _ in kv_cache_group_ids)

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Every token but the last computed one: ``n - 1``."""
        return num_computed_tokens - 1

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[int],
        total_computed_tokens: int,
    ) -> int:
        """As the base class, with ``num_speculative_blocks`` more blocks of room."""
        num_tokens += self.block_size * self.spec.num_speculative_blocks
        return super().get_num_blocks_to_allocate(
            request_id, num_tokens, new_computed_blocks, total_computed_tokens
        )

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[int]:
        """As the base class, with ``num_speculative_blocks`` more blocks of room."""
        return super().allocate_new_blocks(
            request_id, num_tokens + self.block_size * self.spec.num_speculative_blocks
        )
