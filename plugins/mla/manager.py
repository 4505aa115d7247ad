"""The multi-head latent attention (MLA) manager."""

from __future__ import annotations

from kvcore.managers import PrefixManager
from kvcore_plugins.mla.spec import MLAAttentionSpec

__all__ = ["MLAAttentionManager"]


class MLAAttentionManager(PrefixManager[MLAAttentionSpec]):
    """Full-attention behaviour for latent caches: only the page size differs.

    Every block is kept until the request ends and any cached prefix is a
    hit (left to right, downward closed), exactly as
    :class:`kvcore.managers.PrefixManager`. What MLA changes is the page: one
    latent vector (or one packed record, e.g. 656 bytes for ``fp8_ds_mla``)
    per token, which only planning and sizing see.
    """
