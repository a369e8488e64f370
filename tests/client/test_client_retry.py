"""The push consumer's retry topic against the real tansu broker: each retry record is delivered
when it is due, whatever lies before it in its partition, also across a restart.

A retry record carries when it is due (``TXSTREAM_RETRY_DUE_MS``, epoch ms); every test checks
that no delivery came before it. The messages of a test share one key, so their retry records
share one partition of the retry topic.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition

from tests.support.kafka_helpers import produce, read_topic, wait_until
from txstream.client import ConsumeFromWhere, ConsumeStatus, Message, PushConsumer
from txstream.client.retry import RetryHeaders
from txstream.kafka import KafkaSettings
from txstream.outputs import encode_visible
from txstream.wire import H, header_dict

pytestmark = pytest.mark.kafka

SHORT_S = 0.5  # the first retry's delay
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET


def now_ms() -> int:
    return int(time.time() * 1000)


def send(kafka: KafkaSettings, topic: str, mid: str) -> None:
    """Release message ``mid`` as the coordinator does, keyed as every other of the test."""
    produce(kafka, [encode_visible(Message(topic, mid.encode(), keys="K", transaction_id=mid,
                                           msg_id=mid, producer_group="pg",
                                           born_timestamp=now_ms()))])


def committed(kafka: KafkaSettings, group: str, tp: TopicPartition) -> int | None:
    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group,
                      enable_auto_commit=False)
    try:
        return c.committed(tp)
    finally:
        c.close()


@dataclass
class Deliveries:
    """A listener that fails each message ``fails[id]`` times, then consumes it, and records
    every call as (message id, reconsume times, wall-clock ms)."""

    fails: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, msgs: list[Message]) -> ConsumeStatus:
        (msg,) = msgs
        mid = msg.msg_id or ""
        with self.lock:
            self.calls.append((mid, msg.reconsume_times, now_ms()))
            n = len(self.of(mid))
        return (ConsumeStatus.RECONSUME_LATER if n <= self.fails.get(mid, 0)
                else ConsumeStatus.CONSUME_SUCCESS)

    def of(self, mid: str) -> list[tuple[str, int, int]]:
        return [c for c in self.calls if c[0] == mid]

    def when(self, mid: str, nth: int, timeout_s: float = 30.0) -> int:
        """Wall-clock ms of ``mid``'s ``nth`` delivery (1: the first), once it came."""
        return wait_until(lambda: len(c := self.of(mid)) >= nth and c, timeout_s)[nth - 1][2]


@dataclass(frozen=True)
class Retry:
    partition: int
    offset: int
    attempt: int
    due_ms: int


def retries(kafka: KafkaSettings, retry_topic: str, mid: str) -> list[Retry]:
    """The retry records of message ``mid``, in offset order."""
    out = []
    for r in read_topic(kafka, retry_topic):
        h = header_dict(r.headers)
        if h.get(H.UNIQ_KEY) == mid:
            out.append(Retry(r.partition, r.offset, int(h[RetryHeaders.RECONSUME_TIMES]),
                             int(h[RetryHeaders.DUE_MS])))
    return out


def retry_of(kafka: KafkaSettings, retry_topic: str, mid: str, attempt: int) -> Retry:
    return wait_until(lambda: next((r for r in retries(kafka, retry_topic, mid)
                                    if r.attempt == attempt), None), timeout_s=20)


def assert_none_early(kafka: KafkaSettings, retry_topic: str, d: Deliveries) -> None:
    """Every redelivery came at or after the due time of its retry record."""
    for mid in {c[0] for c in d.calls}:
        dues = {r.attempt: r.due_ms for r in retries(kafka, retry_topic, mid)}
        for _, attempt, at in d.of(mid):
            if attempt:
                assert at >= dues[attempt], (mid, attempt, at - dues[attempt])


def start(kafka: KafkaSettings, group: str, topic: str, d: Deliveries, **options: Any
          ) -> PushConsumer:
    """A started consumer that reads ``topic`` and its group's retry topic."""
    consumer = PushConsumer(group, kafka.bootstrap_servers, consume_from_where=FIRST,
                            consume_thread_min=4, consume_thread_max=4, **options)
    consumer.subscribe(topic)
    consumer.register_message_listener(d)
    consumer.start()
    try:
        wait_until(lambda: {tp.topic for tp in consumer.assignment}
                   == {topic, consumer.retry_topic}, timeout_s=30)
    except BaseException:
        consumer.shutdown()
        raise
    return consumer


def new_ids(n: int) -> list[str]:
    return [uuid.uuid4().hex.upper() for _ in range(n)]


def test_a_retry_due_later_does_not_hold_back_one_due_sooner(kafka: KafkaSettings,
                                                             unique: str) -> None:
    topic, group, long_s = f"{unique}_ahead", f"{unique}_cg", 10.0
    a, b = new_ids(2)
    d = Deliveries({a: 2, b: 1})  # a's second retry waits long_s, b's first SHORT_S
    send(kafka, topic, a)
    consumer = start(kafka, group, topic, d, retry_delay_s=[SHORT_S, long_s])
    retry_topic = consumer.retry_topic
    try:
        a_long = retry_of(kafka, retry_topic, a, 2)
        send(kafka, topic, b)
        b_short = retry_of(kafka, retry_topic, b, 1)
        # b's retry record lies behind a's, in the same partition.
        assert b_short.partition == a_long.partition
        assert b_short.offset > a_long.offset
        assert d.when(b, 2) - d.when(b, 1) < long_s * 1000 / 2  # ~SHORT_S, not a's due
        assert len(d.of(a)) == 2  # a waits for its own due time
        # Held, a pins the retry partition's commit point: a restart reads it again.
        retry_tp = TopicPartition(retry_topic, a_long.partition)
        wait_until(lambda: committed(kafka, group, retry_tp) == a_long.offset, timeout_s=10)
        assert d.when(a, 3, timeout_s=long_s + 20) >= a_long.due_ms
        wait_until(lambda: committed(kafka, group, retry_tp) == b_short.offset + 1,
                   timeout_s=10)
    finally:
        consumer.shutdown()
    assert [c[1] for c in d.of(a)] == [0, 1, 2] and [c[1] for c in d.of(b)] == [0, 1]
    assert_none_early(kafka, retry_topic, d)


def test_retries_pending_at_a_restart_are_delivered_when_due(kafka: KafkaSettings,
                                                             unique: str) -> None:
    topic, group, long_s = f"{unique}_restart", f"{unique}_cg", 15.0
    a, c, b = new_ids(3)
    d = Deliveries({a: 2, c: 2, b: 1})
    delays = [SHORT_S, long_s]
    send(kafka, topic, a)
    send(kafka, topic, c)
    first = start(kafka, group, topic, d, retry_delay_s=delays)
    retry_topic = first.retry_topic
    try:
        a_long = retry_of(kafka, retry_topic, a, 2)
        c_long = retry_of(kafka, retry_topic, c, 2)
        send(kafka, topic, b)
        d.when(b, 2)  # b's retry, behind a's and c's, consumed while they wait
    finally:
        first.shutdown()
    assert (len(d.of(a)), len(d.of(c))) == (2, 2)  # both still waiting
    retry_tp = TopicPartition(retry_topic, a_long.partition)
    pinned = committed(kafka, group, retry_tp)
    assert pinned is not None and pinned <= min(a_long.offset, c_long.offset)

    second = start(kafka, group, topic, d, retry_delay_s=delays)
    try:
        # The restarted consumer read them before they were due: holding them is tested.
        assert now_ms() < min(a_long.due_ms, c_long.due_ms)
        assert d.when(a, 3, timeout_s=long_s + 20) >= a_long.due_ms
        assert d.when(c, 3, timeout_s=long_s + 20) >= c_long.due_ms
        end = max(r.offset for m in (a, b, c) for r in retries(kafka, retry_topic, m)) + 1
        wait_until(lambda: committed(kafka, group, retry_tp) == end, timeout_s=10)
    finally:
        second.shutdown()
    # Nothing lost, the waiting ones delivered once each. b's retry record, consumed past the
    # commit point they pinned, may come again: at least once.
    for mid in (a, c):
        assert [x[1] for x in d.of(mid)] == [0, 1, 2]
    assert [x[1] for x in d.of(b)][:2] == [0, 1] and {x[1] for x in d.of(b)} == {0, 1}
    assert_none_early(kafka, retry_topic, d)


def test_a_waiting_retry_the_span_reached_is_requeued(kafka: KafkaSettings,
                                                      unique: str) -> None:
    topic, group, long_s, span = f"{unique}_span", f"{unique}_cg", 8.0, 3
    a, *bs = new_ids(5)
    d = Deliveries({a: 2, **{b: 1 for b in bs}})
    send(kafka, topic, a)
    consumer = start(kafka, group, topic, d, retry_delay_s=[SHORT_S, long_s],
                     consume_concurrently_max_span=span)
    retry_topic = consumer.retry_topic
    try:
        a_long = retry_of(kafka, retry_topic, a, 2)
        for b in bs:
            send(kafka, topic, b)
        for b in bs:  # more than the span behind a: none waits for a's due time
            assert d.when(b, 2) - d.when(b, 1) < long_s * 1000 / 2, b
        assert consumer.stats["requeued"] >= 1
        assert d.when(a, 3, timeout_s=long_s + 20) >= a_long.due_ms
        retry_tp = TopicPartition(retry_topic, a_long.partition)
        end = max(r.offset for m in (a, *bs) for r in retries(kafka, retry_topic, m)) + 1
        wait_until(lambda: committed(kafka, group, retry_tp) == end, timeout_s=10)
    finally:
        consumer.shutdown()
    copies = [r for r in retries(kafka, retry_topic, a) if r.attempt == 2]
    assert len(copies) >= 2 and {r.due_ms for r in copies} == {a_long.due_ms}
    assert [x[1] for x in d.of(a)] == [0, 1, 2]  # the copy, not both
    assert_none_early(kafka, retry_topic, d)
