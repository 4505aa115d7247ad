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

This module imports pyzmq, from kvcore's ``fleet`` extra.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from kvcore.cluster._errors import EventFormatError, InvalidConfigError, require
from kvcore.cluster._index import ClusterIndex
from kvcore.cluster._wire import EventBatch, decode_batch, encode_batch, merge_removals

zmq = require("zmq", "KV events over ZMQ")

__all__ = ["END_OF_REPLAY", "EventPublisher", "EventSubscriber"]

#: The sequence number that ends a replay.
END_OF_REPLAY = -1


def _seq_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


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
    ) -> None:
        if type(buffer_steps) is not int or buffer_steps < 1:
            msg = f"buffer_steps must be a positive integer, got {buffer_steps!r}"
            raise InvalidConfigError(msg)
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
        """Send one batch (runs of removals merged); returns its sequence number.

        Raises:
            InvalidConfigError: the publisher is closed.
        """
        if not self._running:
            msg = "this EventPublisher is closed; make a new one"
            raise InvalidConfigError(msg)
        if batch.data_parallel_rank is None and self._rank is not None:
            batch = EventBatch(batch.ts, batch.events, self._rank)
        payload = encode_batch(
            EventBatch(batch.ts, merge_removals(batch.events), batch.data_parallel_rank)
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
            if len(frames) != 3:
                continue  # not a replay request: (identity, empty, start sequence)
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
    """

    def __init__(
        self,
        engine: str,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
    ) -> None:
        self.engine = engine
        self._context = zmq.Context.instance()
        self._sub = self._context.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._sub.connect(endpoint)
        self._replay_endpoint = replay_endpoint
        self.received = 0
        self.replayed = 0
        self.bad_payloads = 0

    def receive(self, timeout_ms: int = 0) -> tuple[int, EventBatch] | None:
        """The next ``(sequence, batch)``, or ``None`` if none arrives in ``timeout_ms``.

        A payload that is not an event batch is counted and skipped.
        """
        while self._sub.poll(timeout_ms):
            _, seq, payload = self._sub.recv_multipart()
            try:
                batch = decode_batch(payload)
            except EventFormatError:
                self.bad_payloads += 1
                continue
            self.received += 1
            return int.from_bytes(seq, "big", signed=True), batch
        return None

    def replay(self, first_seq: int, timeout_ms: int = 1000) -> list[tuple[int, EventBatch]]:
        """Ask the publisher for its buffered batches from ``first_seq`` on.

        Returns what it still has (possibly nothing), in order; an empty list
        too when there is no replay endpoint or it does not answer in time.
        """
        if self._replay_endpoint is None:
            return []
        socket = self._context.socket(zmq.DEALER)
        try:
            socket.connect(self._replay_endpoint)
            socket.send_multipart((b"", _seq_bytes(first_seq)))
            out = []
            while socket.poll(timeout_ms):
                _, seq_bytes, payload = socket.recv_multipart()
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == END_OF_REPLAY:
                    break
                out.append((seq, decode_batch(payload)))
            self.replayed += len(out)
            return out
        finally:
            socket.close(linger=0)

    def pump(self, index: ClusterIndex, timeout_ms: int = 0, max_batches: int = 10_000) -> int:
        """Move received batches into ``index``; fill gaps from the replay endpoint.

        When the index is held up by a gap, the missing batches are asked for
        once; if the publisher no longer has them the index resyncs (the
        engine's entries are dropped, never left stale).

        Returns:
            The number of batches received from the PUB socket.
        """
        count = 0
        while count < max_batches:
            item = self.receive(timeout_ms if count == 0 else 0)
            if item is None:
                break
            seq, batch = item
            index.submit(self.engine, seq, batch.ts, batch.events)
            count += 1
        missing = index.missing(self.engine)
        if missing is not None:
            for seq, batch in self.replay(missing):
                index.submit(self.engine, seq, batch.ts, batch.events)
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
