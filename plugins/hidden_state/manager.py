"""The hidden-state cache manager."""

from __future__ import annotations

from kvcore.managers import PrefixManager
from kvcore_plugins.hidden_state.spec import HiddenStateCacheSpec

__all__ = ["HiddenStateCacheManager"]


class HiddenStateCacheManager(PrefixManager[HiddenStateCacheSpec]):
    """Full-attention behaviour for a group of hidden-state layers.

    The group has its own block table (planning never merges hidden-state
    layers with attention layers); its blocks are kept until the request
    ends and any cached prefix is a hit, exactly as
    :class:`kvcore.managers.PrefixManager`.
    """
