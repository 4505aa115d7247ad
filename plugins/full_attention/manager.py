"""The full-attention manager."""

from __future__ import annotations

from kvcore.managers import PrefixManager
from kvcore_plugins.full_attention.spec import FullAttentionSpec

__all__ = ["FullAttentionManager"]


class FullAttentionManager(PrefixManager[FullAttentionSpec]):
    """Keeps every block until the request ends; any cached prefix is a hit.

    All behaviour comes from :class:`kvcore.managers.PrefixManager`: hits are
    found left to right up to the first miss, EAGLE drops the last matched
    block, and nothing is freed before the request finishes.
    """
