"""The router: picks an engine for each request from cached prefix and load."""

from __future__ import annotations

import logging
import random
from collections.abc import Hashable, Sequence

import attrs

from kvcore.cluster._errors import IndexUnavailableError, InvalidConfigError
from kvcore.cluster._index import ClusterIndex

__all__ = ["ROUTER_POLICIES", "EngineLoad", "Route", "Router"]

#: Routing policies, by name.
ROUTER_POLICIES = ("prefix", "round_robin", "least_loaded", "random")

logger = logging.getLogger("kvcore.cluster")


@attrs.frozen(kw_only=True)
class EngineLoad:
    """What an engine reports about its load (as an engine's metrics endpoint would).

    Attributes:
        engine: The engine's id.
        running: Requests running.
        waiting: Requests queued, not yet admitted.
        pending_tokens: Prompt tokens still to compute, over running and
            waiting requests (the prefill work ahead of a new request).
        free_blocks: Blocks free in its pool (evictable cached ones included).
        total_blocks: Usable blocks of its pool.
    """

    engine: str
    running: int = 0
    waiting: int = 0
    pending_tokens: int = 0
    free_blocks: int = 0
    total_blocks: int = 1


@attrs.frozen
class Route:
    """A routing decision.

    Attributes:
        engine: The chosen engine.
        expected_hit_tokens: Tokens the index expects it to hit (0 when
            routing by load only).
        degraded: The index was unreachable: routed by load only.
    """

    engine: str
    expected_hit_tokens: int
    degraded: bool = False


class Router:
    """Chooses an engine per request.

    Policies:

    ``prefix``
        The engine with the least *work ahead of the request's first token*:
        its pending prefill tokens plus the request's tokens it would not find
        cached (the cluster index's estimate). The saving of a hit is thus
        weighed, token for token, against the queue it would wait in. Engines
        that run ``balance_slack`` times the fleet's mean number of requests
        (plus two) are passed over while another engine is not, so hot
        prefixes cannot pile onto one engine. Ties go to the engine with the
        fewest requests, then round robin. When the index is unreachable the
        router logs a warning, routes by load only (as ``least_loaded``), and
        logs again when the index answers.
    ``round_robin``
        Engines in turn.
    ``least_loaded``
        Fewest running plus waiting requests, then fewest pending tokens, then
        the most free blocks.
    ``random``
        Uniformly at random (seeded).

    Args:
        policy: One of :data:`ROUTER_POLICIES`.
        index: The cluster index (required for ``prefix``).
        balance_slack: See ``prefix`` (>= 1).
        seed: Seed of ``random``.
    """

    def __init__(
        self,
        policy: str,
        index: ClusterIndex | None = None,
        *,
        balance_slack: float = 1.25,
        seed: int = 0,
    ) -> None:
        if policy not in ROUTER_POLICIES:
            msg = f"router policy must be one of {', '.join(ROUTER_POLICIES)}, got {policy!r}"
            raise InvalidConfigError(msg)
        if policy == "prefix" and index is None:
            msg = "the 'prefix' router needs a cluster index (index=ClusterIndex(...))"
            raise InvalidConfigError(msg)
        if not balance_slack >= 1:
            msg = f"balance_slack must be >= 1, got {balance_slack!r}"
            raise InvalidConfigError(msg)
        self.policy = policy
        self.index = index
        self.balance_slack = float(balance_slack)
        self._rng = random.Random(seed)
        self._next = 0
        self.degraded = False
        self.degraded_routes = 0

    def route(
        self,
        block_hashes: Sequence[Hashable],
        num_tokens: int,
        loads: Sequence[EngineLoad],
    ) -> Route:
        """Pick the engine for a prompt of ``num_tokens`` tokens with these block hashes.

        Args:
            block_hashes: The prompt's block hashes (see
                :meth:`ClusterIndex.hit_tokens`); unused by load-only policies.
            num_tokens: The prompt's length.
            loads: One entry per engine that may be chosen (live engines).

        Raises:
            InvalidConfigError: ``loads`` is empty.
        """
        if not loads:
            msg = "no engine to route to: loads is empty"
            raise InvalidConfigError(msg)
        policy = self.policy
        if policy == "round_robin":
            choice = loads[self._next % len(loads)]
            self._next += 1
            return Route(choice.engine, 0)
        if policy == "random":
            return Route(loads[self._rng.randrange(len(loads))].engine, 0)
        if policy == "least_loaded":
            return Route(self._least_loaded(loads).engine, 0)
        return self._prefix(block_hashes, num_tokens, loads)

    @staticmethod
    def _least_loaded(loads: Sequence[EngineLoad]) -> EngineLoad:
        return min(
            loads,
            key=lambda load: (load.running + load.waiting, load.pending_tokens, -load.free_blocks),
        )

    def _prefix(
        self, block_hashes: Sequence[Hashable], num_tokens: int, loads: Sequence[EngineLoad]
    ) -> Route:
        assert self.index is not None
        try:
            hits = self.index.hit_tokens(block_hashes, num_tokens, [load.engine for load in loads])
        except IndexUnavailableError as exc:
            if not self.degraded:
                logger.warning(
                    "kvcore router: %s; routing by load only until the index is back", exc
                )
                self.degraded = True
            self.degraded_routes += 1
            return Route(self._least_loaded(loads).engine, 0, degraded=True)
        if self.degraded:
            logger.warning("kvcore router: the cluster index is reachable again; routing by prefix")
            self.degraded = False
        mean = sum(load.running + load.waiting for load in loads) / len(loads)
        limit = self.balance_slack * mean + 2
        candidates = [load for load in loads if load.running + load.waiting <= limit] or list(loads)
        start = self._next % len(loads)
        self._next += 1
        order = {load.engine: (i - start) % len(loads) for i, load in enumerate(loads)}
        best = min(
            candidates,
            key=lambda load: (
                load.pending_tokens + num_tokens - hits.get(load.engine, 0),
                load.running + load.waiting,
                order[load.engine],
            ),
        )
        return Route(best.engine, hits.get(best.engine, 0))
