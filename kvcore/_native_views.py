"""The native digest map seen as the specification's containers.

When a :class:`~kvcore._native_pool.NativeBlockPool` keeps its prefix map as
digests in C (every hash a ``bytes`` of one width), the Python pool's code
still reads and writes ``_hash`` (the hash each block carries) and
``_cached[g]`` (hash -> the block a lookup finds, per group) on its rare
steps: handing a hash on to a duplicate, undoing a cache entry, the
invariant checks, inspection. These two classes give that code the list and
the dicts it expects, each item a call into the core. The hot loops never
use them: they run in C on the arrays.

One difference from a dict beside a list, made so that the C table stays
consistent between any two calls: an entry always carries its hash.
``cached[h] = b`` also gives ``b`` the hash ``h``, and ``hashes[b] = None``
(or another hash) also removes ``b``'s entry.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, MutableMapping, Sequence
from typing import Any, overload

__all__ = ["NativeHashes", "NativePrefixMap"]


class NativeHashes(Sequence[Hashable | None]):
    """The hash each block carries (``None``: not cached), read from the core."""

    __slots__ = ("_core",)

    def __init__(self, core: Any) -> None:
        self._core = core

    def __len__(self) -> int:
        return self._core.num_blocks  # type: ignore[no-any-return]

    @overload
    def __getitem__(self, block: int) -> Hashable | None: ...

    @overload
    def __getitem__(self, block: slice) -> list[Hashable | None]: ...

    def __getitem__(self, block: int | slice) -> Hashable | list[Hashable | None] | None:
        if isinstance(block, slice):
            return [self._core.hash_at(b) for b in range(len(self))[block]]
        if block < 0:
            block += len(self)
        return self._core.hash_at(block)  # type: ignore[no-any-return]

    def __setitem__(self, block: int, block_hash: Hashable | None) -> None:
        self._core.set_hash(block, block_hash)

    def __iter__(self) -> Iterator[Hashable | None]:
        return map(self._core.hash_at, range(len(self)))

    def count(self, value: Any) -> int:
        """How many blocks carry ``value`` (``None``: how many carry no hash; O(1))."""
        if value is None:
            return len(self) - self._core.num_hashed  # type: ignore[no-any-return]
        return sum(1 for block_hash in self if block_hash == value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class NativePrefixMap(MutableMapping[Hashable, int]):
    """One group's hash -> block map (the block a lookup finds first), read from the core."""

    __slots__ = ("_core", "_group")

    def __init__(self, core: Any, group: int) -> None:
        self._core = core
        self._group = group

    def get(self, block_hash: Hashable, default: Any = None) -> Any:
        block = self._core.map_get(self._group, block_hash)
        return default if block is None else block

    def __getitem__(self, block_hash: Hashable) -> int:
        block = self._core.map_get(self._group, block_hash)
        if block is None:
            raise KeyError(block_hash)
        return block  # type: ignore[no-any-return]

    def __contains__(self, block_hash: object) -> bool:
        return self._core.map_get(self._group, block_hash) is not None

    def __setitem__(self, block_hash: Hashable, block: int) -> None:
        self._core.map_set(self._group, block_hash, block)

    def __delitem__(self, block_hash: Hashable) -> None:
        self._core.map_del(self._group, block_hash)

    def __len__(self) -> int:
        return self._core.map_len(self._group)  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[Hashable]:
        return (block_hash for block_hash, _ in self._core.map_items(self._group))

    def items(self) -> Any:
        """The (hash, block) entries, in the table's order (a list)."""
        return self._core.map_items(self._group)
