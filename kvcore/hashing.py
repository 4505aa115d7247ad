"""Block hashes: the keys of the prefix cache, computed as a manager computes them.

A router or a tool that needs a prompt's block hashes (to ask a cluster index
which engine holds its prefix, say) hashes a :class:`~kvcore.Request` with a
:class:`BlockHasher` of the engine's hash block size and algorithm.
"""

from __future__ import annotations

from kvcore._hashing import HASH_ALGORITHMS, BlockHasher

__all__ = ["BlockHasher", "HASH_ALGORITHMS"]
