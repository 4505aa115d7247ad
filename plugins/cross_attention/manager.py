"""The cross-attention manager (encoder-decoder models)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, NoReturn

from kvcore import Request
from kvcore.errors import PrefixCachingNotSupportedError
from kvcore.managers import HitQuery, SingleTypeManager
from kvcore_plugins.cross_attention.spec import CrossAttentionSpec

__all__ = ["CrossAttentionManager"]

# A token count no request reaches.
_NEVER = 1 << 62

_NEVER_CACHED = (
    "CrossAttentionManager: cross-attention blocks hold one request's encoder output "
    "and are never prefix-cached; build the KVCacheManager with enable_caching=False "
    "for a model with cross-attention layers"
)


class CrossAttentionManager(SingleTypeManager[CrossAttentionSpec]):
    """Blocks for a request's encoder tokens, allocated once, never shared.

    The coordinator sizes this group by ``num_encoder_tokens`` rather than by
    decoder tokens: the first allocation takes ``ceil(num_encoder_tokens /
    block_size)`` blocks and later ones take none. Nothing is freed before
    the request ends, and nothing is ever looked up in or added to the prefix
    cache: both raise :class:`~kvcore.errors.PrefixCachingNotSupportedError`.
    """

    supports_prefix_caching: ClassVar[bool] = False
    allocates_for_encoder: ClassVar[bool] = True

    @classmethod
    def find_longest_cache_hit(cls, query: HitQuery[CrossAttentionSpec]) -> NoReturn:
        """Never a hit: encoder states are unique per request.

        Raises:
            PrefixCachingNotSupportedError: always.
        """
        raise PrefixCachingNotSupportedError(_NEVER_CACHED)

    def cache_blocks(self, request: Request, num_tokens: int) -> NoReturn:
        """Never cached.

        Raises:
            PrefixCachingNotSupportedError: always.
        """
        raise PrefixCachingNotSupportedError(_NEVER_CACHED)

    def steady_until(self, request_id: str, num_computed_tokens: int) -> int:
        """Never: the encoder's blocks are allocated once, at admission, and kept to the end."""
        return _NEVER

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[int],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Nothing to adopt: there are no hits, and encoder KV is not loaded externally.

        Raises:
            PrefixCachingNotSupportedError: ``new_computed_blocks`` is not empty.
        """
        if new_computed_blocks:
            raise PrefixCachingNotSupportedError(_NEVER_CACHED)
