"""Block ids and undo steps: the vocabulary every layer of the allocator shares.

A leaf module: it imports nothing of kvcore, so the pool, the free queues and
the managers can all use it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["MAX_NUM_BLOCKS", "NULL_BLOCK", "Undo", "UndoLog"]

# A placeholder in block tables for a position whose KV is not kept (a block a
# windowed type no longer reads): never handed out, cached, freed or evicted.
#: Id of the null block.
NULL_BLOCK: Final = 0

#: Most blocks a pool may have: block tables hold int32 block ids.
MAX_NUM_BLOCKS: Final = 2**31 - 1

#: One undo step: ``undo(*arguments)`` reverses one change.
Undo = tuple[Callable[..., object], tuple[Any, ...]]

#: The undo steps of a running transaction, oldest first (replayed newest first).
UndoLog = list[Undo]
