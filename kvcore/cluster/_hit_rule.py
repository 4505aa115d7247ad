"""How many tokens of a request an engine would hit, by each group's own rule.

The cluster index knows, per engine and KV cache group, which block hashes are
cached. Turning that into a hit length is what the engine's coordinator does
for its own pool: every group's manager class searches with its type's rule
(full attention: the longest cached prefix; sliding window: only the blocks of
the last window; Mamba: one cached state at an aligned position), and the
coordinator reconciles the groups (a fixed point over the candidate length).
The index reuses that code unchanged: it runs the engine layout's hit rule
(the core's :class:`~kvcore._hits.HitRule`) with lookups answered by an
:class:`EngineView` of the index instead of a block pool, so its answer is
exactly the engine's own answer for the same cached blocks.

``hybrid_aware=False`` scores as indexes that know no attention types do: every
group is searched with the full-attention prefix rule (a hit needs every block
of the prefix cached in every group). On models whose groups all use the
full-attention rule both give the same answer.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import attrs

from kvcore._config import KVCacheConfig
from kvcore._hashing import HASH_ALGORITHMS, hashes_at_block_size
from kvcore._hits import HitRule, make_hit_rule
from kvcore._registry import Registry
from kvcore.cluster._backend import Snapshot
from kvcore.cluster._errors import InvalidConfigError
from kvcore.managers import PrefixManager, SingleTypeManager

__all__ = ["EngineView", "FleetLayout", "longest_hit"]

#: A stand-in block id: views answer "cached or not", the hit rule only counts.
_CACHED = 1


class EngineView:
    """One engine's cached blocks, as the index sees them, behind a block pool's lookups.

    The coordinator's hit search calls :meth:`get_cached_block` and
    :meth:`match_prefix` exactly as it calls a :class:`~kvcore.managers.BlockPool`'s;
    the answers come from the index's membership :class:`Snapshot` of the
    request being scored. Block ids in answers are stand-ins (only the count
    matters to the caller).
    """

    __slots__ = ("engine", "snapshot")

    def __init__(self, engine: int) -> None:
        self.engine = engine
        self.snapshot: Snapshot | None = None

    def get_cached_block(
        self, block_hash: Hashable, kv_cache_group_ids: Sequence[int]
    ) -> list[int] | None:
        """``[stand-in] * len(group ids)`` if every group holds ``block_hash``, else ``None``."""
        holds = self.snapshot.holds  # type: ignore[union-attr]
        engine = self.engine
        for group_id in kv_cache_group_ids:
            if not holds(engine, group_id, block_hash):
                return None
        return [_CACHED] * len(kv_cache_group_ids)

    def match_prefix(
        self,
        block_hashes: Sequence[Hashable],
        start: int,
        stop: int,
        kv_cache_group_ids: Sequence[int],
    ) -> tuple[list[int], ...]:
        """The run of hashes from ``start`` held in every group, as stand-in blocks."""
        holds = self.snapshot.holds  # type: ignore[union-attr]
        engine = self.engine
        length = 0
        for index in range(start, min(stop, len(block_hashes))):
            block_hash = block_hashes[index]
            if not all(holds(engine, g, block_hash) for g in kv_cache_group_ids):
                break
            length += 1
        return tuple([_CACHED] * length for _ in kv_cache_group_ids)


@attrs.frozen(kw_only=True)
class FleetLayout:
    """What every engine of a fleet shares: its KV cache groups and how blocks are hashed.

    The cluster index scores requests for engines of one layout (one model,
    one hash algorithm), as a router does for the replicas of one model.

    Attributes:
        config: An engine's KV cache config (its groups matter, not its size).
        registry: The plugins serving the groups (each group's hit rule).
        hash_algorithm: ``"sha256"`` or ``"fast"``, as the engines hash.
        use_eagle: The engines run EAGLE (the last hit block is recomputed).
    """

    config: KVCacheConfig
    registry: Registry
    hash_algorithm: str = "sha256"
    use_eagle: bool = False

    def __attrs_post_init__(self) -> None:
        if self.hash_algorithm not in HASH_ALGORITHMS:
            msg = (
                f"FleetLayout.hash_algorithm must be one of {', '.join(HASH_ALGORITHMS)}, "
                f"got {self.hash_algorithm!r}"
            )
            raise InvalidConfigError(msg)
        if not self.config.kv_cache_groups:
            msg = "FleetLayout.config has no KV cache group: there is nothing to index"
            raise InvalidConfigError(msg)

    def _hit_rule(self, *, hybrid_aware: bool) -> HitRule:
        """The engines' hit rule; with ``hybrid_aware=False``, every group by the prefix rule.

        Raises:
            InvalidConfigError: the layout cannot be prefix-cached.
        """
        specs = [group.kv_cache_spec for group in self.config.kv_cache_groups]
        classes: list[type[SingleTypeManager[Any]]] = [
            self.registry.manager_class(spec) if hybrid_aware else PrefixManager for spec in specs
        ]
        return make_hit_rule(specs, classes, enable_caching=True, use_eagle=self.use_eagle)

    @property
    def hash_block_size(self) -> int:
        """Tokens per entry of a request's block hashes, as the engines' managers hash."""
        return self._hit_rule(hybrid_aware=True).hash_block_size

    def group_hashes(
        self, block_hashes: Sequence[Hashable], hash_block_size: int
    ) -> list[Sequence[Hashable]]:
        """The request's hashes per group, at each group's block size (as events carry them)."""
        return [
            hashes_at_block_size(block_hashes, hash_block_size, group.kv_cache_spec.block_size)
            for group in self.config.kv_cache_groups
        ]


def longest_hit(
    rule: HitRule, view: EngineView, block_hashes: Sequence[Hashable], max_length: int
) -> int:
    """Tokens ``view``'s engine would hit, by the core's own hit search.

    This is the only place the cluster layer calls into the hit search: the
    layout's rule runs every group's ``find_longest_cache_hit`` and the
    cross-group reconciliation, with lookups answered by the view.
    """
    _, num_tokens = rule.find(block_hashes, max_length, view)
    return num_tokens
