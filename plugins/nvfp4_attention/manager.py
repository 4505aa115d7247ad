"""The NVFP4 attention manager."""

from __future__ import annotations

from kvcore.managers import PrefixManager
from kvcore_plugins.nvfp4_attention.spec import NVFP4AttentionSpec

__all__ = ["NVFP4AttentionManager"]


class NVFP4AttentionManager(PrefixManager[NVFP4AttentionSpec]):
    """Keeps every block until the request ends; any cached prefix is a hit.

    The format changes the page, not which tokens are kept: the behaviour is
    full attention's (:class:`kvcore.managers.PrefixManager`).
    """
