"""KV events over ZMQ, as vLLM publishes them: a PUB socket and a replay endpoint.

Every batch goes out as a three-frame message ``(topic, sequence, payload)``:
the topic bytes, the sequence number as 8 bytes big-endian (consecutive from
0 per publisher), and the msgpack payload of :func:`~kvcore.cluster.encode_batch`.
The publisher keeps the last ``buffer_steps`` payloads; a subscriber that
missed some sends the first sequence number it wants (8 bytes big-endian) to
the replay endpoint (a ROUTER socket) and receives ``(sequence, payload)``
frames for every buffered batch from there, then ``(-1, b"")``. This is vLLM's
``ZmqEventPublisher`` protocol, so kvcore's subscriber also reads vLLM engines
and vLLM-format consumers read kvcore engines.

The subscriber takes what arrives as untrusted: a message of the wrong shape
(not three frames, a sequence frame that is not 8 bytes or not below 2**53,
a payload that is not a batch) is counted and skipped, a batch the index
refuses is counted and logged, messages are bounded in size, and a replay
answer is bounded in count and time.

This module imports pyzmq, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import deque
from typing import Any, Final

from kvcore.cluster._errors import (
    EngineConflictError,
    EventFormatError,
    InvalidConfigError,
    InvalidEventError,
    require,
)
from kvcore.cluster._index import ClusterIndex
from kvcore.cluster._validate import (
    BATCH_BLOCKS_PER_POOL_BLOCK,
    MAX_BATCH_HASHES,
    check_incarnation,
)
from kvcore.cluster._wire import (
    EventBatch,
    decode_batch,
    encode_batch,
    merge_removals,
    split_events,
)

zmq = require("zmq", "KV events over ZMQ")

__all__ = ["END_OF_REPLAY", "EventPublisher", "EventSubscriber"]

logger = logging.getLogger("kvcore.cluster")

#: The sequence number that ends a replay.
END_OF_REPLAY = -1
# Sequence numbers a subscriber accepts: 8-byte frames below this.
_SEQ_END: Final = 2**53
# Malformed messages one receive() skips before it returns (a flood cannot hold it).
_MAX_SKIPPED: Final = 10_000


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def _seq_of(frame: bytes) -> int | None:
    """The sequence number of an 8-byte frame, or ``None`` if it is not one."""
    if len(frame) != 8:
        return None
    seq = int.from_bytes(frame, "big", signed=True)
    return seq if 0 <= seq < _SEQ_END else None


class EventPublisher:
    """Publishes one engine's event batches on a ZMQ PUB socket, with replay.

    ``publish`` sends from the calling thread (the engine's step loop); a
    background thread answers replay requests. Sending never blocks: past the
    high-water mark ZMQ drops messages for slow subscribers, which notice the
    gap in sequence numbers and ask for a replay.

    Args:
        endpoint: Where the PUB socket binds, e.g. ``tcp://127.0.0.1:5557``.
        replay_endpoint: Where the replay ROUTER socket binds (``None``: no
            replay).
        topic: Topic frame of every message.
        buffer_steps: Batches kept for replay.
        hwm: The PUB socket's send high-water mark.
        data_parallel_rank: Stamped on batches that carry none.
        incarnation: This engine run's id, carried by every batch so that
            an index tells a restart from a replay (default: 16 random hex
            digits; 1-64 characters of ``A-Z a-z 0-9 _ . -``).
        num_blocks: The engine's pool size, carried by every batch: an index
            keeps at most that many entries for it (``None``: not announced).

    The replay endpoint answers anyone who can connect to it with the buffered
    batches: bind it to an address only the routers reach.
    """

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        data_parallel_rank: int | None = None,
        incarnation: str | None = None,
        num_blocks: int | None = None,
    ) -> None:
        if type(buffer_steps) is not int or buffer_steps < 1:
            msg = f"buffer_steps must be a positive integer, got {buffer_steps!r}"
            raise InvalidConfigError(msg)
        if incarnation is None:
            incarnation = secrets.token_hex(8)
        try:
            check_incarnation(incarnation)
        except InvalidEventError as exc:
            raise InvalidConfigError(str(exc)) from None
        if num_blocks is not None and (type(num_blocks) is not int or num_blocks < 1):
            msg = f"num_blocks must be a positive integer (the engine's pool), got {num_blocks!r}"
            raise InvalidConfigError(msg)
        self.incarnation = incarnation
        self.num_blocks = num_blocks
        self._context = zmq.Context.instance()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.bind(endpoint)
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self._topic = topic.encode()
        self._rank = data_parallel_rank
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._next_seq = 0
        self._running = True
        self._replay: Any = None
        self._thread: threading.Thread | None = None
        self.replay_endpoint: str | None = None
        if replay_endpoint is not None:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.bind(replay_endpoint)
            self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
            self._thread = threading.Thread(
                target=self._serve_replay, name="kvcore-event-replay", daemon=True
            )
            self._thread.start()

    @property
    def next_seq(self) -> int:
        """The sequence number the next batch will get."""
        return self._next_seq

    def publish(self, batch: EventBatch) -> int:
        """Send one step's batch (runs of removals merged); returns its sequence number.

        A step of more block hashes than a cluster index takes in one batch
        (16,384, or 4 per block of the announced pool) goes out as several
        consecutive batches, in order; the number returned is the last one's.

        Raises:
            InvalidConfigError: the publisher is closed.
        """
        if not self._running:
            msg = "this EventPublisher is closed; make a new one"
            raise InvalidConfigError(msg)
        rank = batch.data_parallel_rank if batch.data_parallel_rank is not None else self._rank
        limit = MAX_BATCH_HASHES
        if self.num_blocks is not None:
            limit = min(limit, BATCH_BLOCKS_PER_POOL_BLOCK * self.num_blocks)
        seq = self._next_seq
        for events in split_events(merge_removals(batch.events), limit):
            payload = encode_batch(
                EventBatch(
                    batch.ts,
                    events,
                    rank,
                    incarnation=self.incarnation,
                    num_blocks=self.num_blocks,
                )
            )
            seq = self._next_seq
            self._next_seq += 1
            with self._lock:
                self._buffer.append((seq, payload))
            self._pub.send_multipart((self._topic, _seq_bytes(seq), payload))
        return seq

    def _serve_replay(self) -> None:
        poller = zmq.Poller()
        poller.register(self._replay, zmq.POLLIN)
        while self._running:
            if not poller.poll(50):
                continue
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                continue  # not a replay request: (identity, empty, 8-byte start sequence)
            identity, _, start = frames
            first = int.from_bytes(start, "big", signed=True)
            with self._lock:
                wanted = [(seq, payload) for seq, payload in self._buffer if seq >= first]
            for seq, payload in wanted:
                self._replay.send_multipart((identity, b"", _seq_bytes(seq), payload))
            self._replay.send_multipart((identity, b"", _seq_bytes(END_OF_REPLAY), b""))

    def close(self) -> None:
        """Stop the replay thread and close the sockets."""
        self._running = False
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def __enter__(self) -> EventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventSubscriber:
    """Receives one engine's batches (kvcore's or vLLM 0.14's) and feeds a cluster index.

    Args:
        engine: The engine's id in the index.
        endpoint: The publisher's PUB endpoint.
        replay_endpoint: Its replay endpoint (``None``: gaps are resynced).
        topic: Topic to subscribe to (``""``: all).
        max_message_bytes: Larger messages are refused by ZMQ, which drops
            the connection that sent one (default 16 MiB).

    Attributes:
        received: Batches received from the PUB socket.
        replayed: Batches received from the replay endpoint.
        bad_frames: Messages skipped for their shape (frame count, sequence frame).
        bad_payloads: Messages skipped because the payload is not a batch.
        rejected: Batches the index refused (:class:`~kvcore.cluster.InvalidEventError`,
            :class:`~kvcore.cluster.EngineConflictError`).
    """

    def __init__(
        self,
        engine: str,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        max_message_bytes: int = 16 << 20,
    ) -> None:
        if type(max_message_bytes) is not int or max_message_bytes < 1:
            msg = f"max_message_bytes must be a positive integer, got {max_message_bytes!r}"
            raise InvalidConfigError(msg)
        self.engine = engine
        self.max_message_bytes = max_message_bytes
        self._context = zmq.Context.instance()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)
        self._replay_endpoint = replay_endpoint
        self.received = 0
        self.replayed = 0
        self.bad_frames = 0
        self.bad_payloads = 0
        self.rejected = 0

    def _parse(self, seq_frame: bytes, payload: bytes) -> tuple[int, EventBatch] | None:
        """``(sequence, batch)`` of a message's last two frames, or ``None`` (counted)."""
        seq = _seq_of(seq_frame)
        if seq is None:
            self.bad_frames += 1
            return None
        try:
            batch = decode_batch(payload)
        except EventFormatError:
            self.bad_payloads += 1
            return None
        return seq, batch

    def receive(self, timeout_ms: int = 0) -> tuple[int, EventBatch] | None:
        """The next ``(sequence, batch)``, or ``None`` if none arrives in ``timeout_ms``.

        A malformed message (see the module documentation) is counted and
        skipped; after 10,000 of them in a row the call returns ``None``.
        """
        skipped = 0
        while skipped < _MAX_SKIPPED and self._sub.poll(timeout_ms):
            frames = self._sub.recv_multipart()
            item = self._parse(frames[1], frames[2]) if len(frames) == 3 else None
            if item is None:
                if len(frames) != 3:
                    self.bad_frames += 1
                skipped += 1
                continue
            self.received += 1
            return item
        return None

    def replay(
        self, first_seq: int, timeout_ms: int = 1000, max_batches: int = 100_000
    ) -> list[tuple[int, EventBatch]]:
        """Ask the publisher for its buffered batches from ``first_seq`` on.

        Returns what it still has (possibly nothing), in order; an empty list
        too when there is no replay endpoint or it does not answer in time.
        The answer is cut at ``max_batches`` batches or ``timeout_ms`` in all
        (an endpoint that never ends its answer cannot hold the caller);
        malformed answers are counted and skipped, and so are batches before
        ``first_seq``.
        """
        if self._replay_endpoint is None:
            return []
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        deadline = time.monotonic() + timeout_ms / 1000
        try:
            socket.connect(self._replay_endpoint)
            socket.send_multipart((b"", _seq_bytes(first_seq)))
            out: list[tuple[int, EventBatch]] = []
            while len(out) < max_batches:
                left_ms = round((deadline - time.monotonic()) * 1000)
                if left_ms <= 0 or not socket.poll(left_ms):
                    break
                frames = socket.recv_multipart()
                if len(frames) != 3:
                    self.bad_frames += 1
                    continue
                if frames[1] == _seq_bytes(END_OF_REPLAY):
                    break
                item = self._parse(frames[1], frames[2])
                if item is not None and item[0] >= first_seq:
                    out.append(item)
            self.replayed += len(out)
            return out
        finally:
            socket.close(linger=0)

    def _submit(self, index: ClusterIndex, seq: int, batch: EventBatch) -> None:
        try:
            index.submit(
                self.engine,
                seq,
                batch.ts,
                batch.events,
                incarnation=batch.incarnation,
                num_blocks=batch.num_blocks,
            )
        except (InvalidEventError, EngineConflictError) as exc:
            self.rejected += 1
            if self.rejected & (self.rejected - 1) == 0:  # the 1st, 2nd, 4th, 8th...
                logger.warning(
                    "kvcore subscriber %r: batch %d refused (%d so far): %s",
                    self.engine,
                    seq,
                    self.rejected,
                    exc,
                )

    def pump(self, index: ClusterIndex, timeout_ms: int = 0, max_batches: int = 10_000) -> int:
        """Move received batches into ``index``; fill gaps from the replay endpoint.

        When the index is held up by a gap, the missing batches are asked for
        once; if the publisher no longer has them the index resyncs (the
        engine's entries are dropped, never left stale). A batch the index
        refuses is counted in ``rejected`` and logged (the first, second,
        fourth... time), not raised.

        Returns:
            The number of batches received from the PUB socket.
        """
        count = 0
        while count < max_batches:
            item = self.receive(timeout_ms if count == 0 else 0)
            if item is None:
                break
            self._submit(index, *item)
            count += 1
        missing = index.missing(self.engine)
        if missing is not None:
            for seq, batch in self.replay(missing, max_batches=max(1, index.max_pending)):
                self._submit(index, seq, batch)
            if index.missing(self.engine) is not None:
                index.resync(self.engine)
        return count

    def close(self) -> None:
        """Close the socket."""
        self._sub.close(linger=0)

    def __enter__(self) -> EventSubscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
