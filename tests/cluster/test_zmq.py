"""KV events over ZMQ: three-frame messages, sequence numbers, replay, gaps filled."""

from __future__ import annotations

import time

import pytest
import zmq
from clusterhelpers import Engine, full, layout, prompt_hits

import kvcore
from kvcore.cluster import ClusterIndex, EventBatch, EventPublisher, EventSubscriber
from kvcore.testing import admit

ENDPOINT = "tcp://127.0.0.1:*"


@pytest.fixture
def publisher():
    pub = EventPublisher(ENDPOINT, ENDPOINT, topic="kv@e0", buffer_steps=3)
    yield pub
    pub.close()


def stored(n: int) -> kvcore.events.BlockStored:
    return kvcore.events.BlockStored(
        block_hashes=[n], parent_block_hash=None, token_ids=[n] * 4, block_size=4
    )


def connected(publisher, **kwargs) -> EventSubscriber:
    subscriber = EventSubscriber("e0", publisher.endpoint, publisher.replay_endpoint, **kwargs)
    # A PUB socket drops messages until the subscription has reached it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        publisher.publish(EventBatch(0.0, []))
        if subscriber.receive(50) is not None:
            return subscriber
    pytest.fail("the subscriber never connected")


def test_messages_are_topic_sequence_payload_frames(publisher):
    raw = zmq.Context.instance().socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"kv@e0")
    raw.connect(publisher.endpoint)
    try:
        # A PUB socket drops messages until the subscription has reached it:
        # publish until one arrives, and fail (not hang) if none does.
        deadline = time.monotonic() + 5
        arrived = False
        while not arrived and time.monotonic() < deadline:
            seq = publisher.publish(EventBatch(1.0, [stored(seq_hint := 1)]))
            arrived = bool(raw.poll(50))
        assert arrived, "no message reached the SUB socket within 5 s"
        topic, seq_frame, payload = raw.recv_multipart(zmq.NOBLOCK)
        assert topic == b"kv@e0"
        assert seq_frame == seq.to_bytes(8, "big")
        assert kvcore.cluster.decode_batch(payload).events == [stored(seq_hint)]
    finally:
        raw.close(linger=0)


def test_replay_returns_the_buffered_batches_from_a_sequence_number(publisher):
    subscriber = connected(publisher)
    try:
        first = publisher.next_seq
        for n in range(5):
            publisher.publish(EventBatch(float(n), [stored(n)]))
        # The buffer keeps the last 3: asking from an older one returns what is left.
        replayed = subscriber.replay(first)
        assert [seq for seq, _ in replayed] == [first + 2, first + 3, first + 4]
        assert [b.events for _, b in replayed] == [[stored(n)] for n in (2, 3, 4)]
        assert subscriber.replay(first + 4)[0][0] == first + 4
        assert subscriber.replay(first + 9) == []
    finally:
        subscriber.close()


def test_a_subscriber_fills_a_gap_from_the_replay_endpoint():
    with EventPublisher(ENDPOINT, ENDPOINT) as publisher:
        engine = Engine("e0", [full()])
        index = ClusterIndex(layout([full()]))
        # The subscriber connects late: it misses the first batches (a gap from 0).
        for n in range(3):
            admit(engine.manager, kvcore.Request(f"r{n}", list(range(100 * n, 100 * n + 8))))
            publisher.publish(EventBatch(float(n), engine.manager.take_events()))
        subscriber = EventSubscriber("e0", publisher.endpoint, publisher.replay_endpoint)
        try:
            deadline = time.monotonic() + 5
            received = 0
            while time.monotonic() < deadline and received == 0:
                late = kvcore.Request(f"late{time.monotonic_ns()}", list(range(900, 908)))
                admit(engine.manager, late)
                engine.manager.free(late)
                publisher.publish(EventBatch(9.0, engine.manager.take_events()))
                received = subscriber.pump(index, timeout_ms=50)
            assert received >= 1
            assert index.missing("e0") is None
            assert subscriber.replayed >= 3
            for n in range(3):
                assert prompt_hits(index, list(range(100 * n, 100 * n + 9)))["e0"] == 8
            assert index.cached_blocks("e0") == engine.manager.block_pool.num_cached_blocks()
        finally:
            subscriber.close()


def test_a_gap_the_publisher_no_longer_has_is_resynced():
    with EventPublisher(ENDPOINT, ENDPOINT, buffer_steps=1) as publisher:
        index = ClusterIndex(layout([full()]))
        publisher.publish(EventBatch(0.0, [stored(1)]))
        subscriber = connected(publisher)  # batches 0.. are gone from the buffer of 1
        try:
            publisher.publish(EventBatch(5.0, [stored(2)]))
            assert subscriber.pump(index, timeout_ms=1000) == 1
            assert index.missing("e0") is None
            assert index.stats.resyncs == 1
            assert index.cached_blocks("e0") == 1  # what came after the gap
        finally:
            subscriber.close()


def test_garbage_payloads_are_counted_and_skipped(publisher):
    subscriber = connected(publisher)
    try:
        publisher._pub.send_multipart((b"kv@e0", (99).to_bytes(8, "big"), b"not msgpack"))
        publisher.publish(EventBatch(2.0, [stored(5)]))
        seq, batch = subscriber.receive(1000)
        assert batch.events == [stored(5)]
        assert subscriber.bad_payloads == 1
    finally:
        subscriber.close()


def test_a_step_of_more_hashes_than_a_batch_takes_goes_out_as_several():
    big = kvcore.events.BlockStored(
        block_hashes=range(20_000), parent_block_hash=None, token_ids=[], block_size=4
    )
    index = ClusterIndex(layout([full()], num_blocks=30_000))
    with EventPublisher(ENDPOINT, ENDPOINT) as publisher:
        subscriber = EventSubscriber("e0", publisher.endpoint, publisher.replay_endpoint)
        try:
            first = publisher.next_seq
            assert publisher.publish(EventBatch(1.0, [big])) == first + 1  # 16,384 + 3,616
            # Until the subscription reaches the PUB socket its messages are
            # dropped: empty batches after it make the gap seen, and replayed.
            deadline = time.monotonic() + 10
            while index.cached_blocks("e0") < 20_000:
                assert time.monotonic() < deadline, "the batches never arrived"
                publisher.publish(EventBatch(2.0, []))
                subscriber.pump(index, timeout_ms=50)
            assert index.cached_blocks("e0") == 20_000
            assert index.stats.rejected == 0
            assert subscriber.replayed >= 2 or subscriber.received >= 2
        finally:
            subscriber.close()
