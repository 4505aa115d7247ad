"""What the cluster index reports: submission results and counters."""

from __future__ import annotations

import attrs

__all__ = ["IndexStats", "SubmitResult"]


class SubmitResult:
    """What :meth:`ClusterIndex.submit` did with a batch (string constants)."""

    #: The batch was in order and is queued for the backend, with any held
    #: batches it unblocked.
    APPLIED = "applied"
    #: The batch is ahead of a gap and held until the missing batches arrive.
    BUFFERED = "buffered"
    #: The batch was seen already (a replay) and is ignored.
    DUPLICATE = "duplicate"
    #: A new incarnation of the engine (or, for a publisher that announces
    #: none, numbering that started over at a later time): the old entries
    #: are dropped and the new one is followed from its sequence number 0.
    RESTARTED = "restarted"
    #: The batch comes from an incarnation the engine has replaced (a late
    #: replay) and is ignored.
    STALE = "stale"


@attrs.define
class IndexStats:
    """Counters of one index since it was made.

    Attributes:
        batches: Batches applied by the backend.
        events: KV events in the batches taken (validated).
        block_ops: Block stores and removals in the batches applied.
        duplicates: Batches ignored as already seen (sent again after a
            backend failure included).
        restarts: Engine restarts detected (a new incarnation, or numbering
            starting over).
        resyncs: Times an engine's entries were dropped because events were lost.
        expired: Engines dropped for missing heartbeats.
        rejected: Batches refused: invalid (:class:`InvalidEventError`), or
            refused by the backend (over the engine's pool, broken keys).
        stale: Batches ignored as coming from a replaced incarnation.
        conflicts: Batches refused because two incarnations claim one engine id.
        dropped: Queued batches dropped because the backend stayed
            unreachable past ``max_pending`` / ``max_pending_bytes`` (each
            engine concerned resynced).
        apply_s: Wall time spent applying batches in the backend, in seconds.
        queries: Hit queries answered.
        query_s: Wall time spent answering them, in seconds.
        unavailable: Backend calls that failed (Redis down or refusing).
    """

    batches: int = 0
    events: int = 0
    block_ops: int = 0
    duplicates: int = 0
    restarts: int = 0
    resyncs: int = 0
    expired: int = 0
    rejected: int = 0
    stale: int = 0
    conflicts: int = 0
    dropped: int = 0
    apply_s: float = 0.0
    queries: int = 0
    query_s: float = 0.0
    unavailable: int = 0
