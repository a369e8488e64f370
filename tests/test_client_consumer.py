"""PushConsumer against the real tansu broker.

One consumer (one group join, ~3 s on tansu) serves the whole module; what its listener does
with a message is scripted by the message's id, and each test uses its own ids.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kafka import KafkaConsumer, TopicPartition

from client import ClientStateError, ConfigError, ConsumeStatus, Message, PushConsumer
from txstream.kafka import KafkaSettings, make_producer
from txstream.wire import H, encode_visible, header_dict

from kafka_helpers import read_topic, wait_until

pytestmark = pytest.mark.kafka

RETRY_DELAY_S = 0.3
MAX_RECONSUME = 2


@dataclass
class Script:
    """What the listener does per message id: a list of outcomes, one per delivery."""

    plans: dict[str, list[str]] = field(default_factory=dict)
    calls: list[tuple[str, int, float, Message]] = field(default_factory=list)
    gates: dict[str, threading.Event] = field(default_factory=dict)

    def __call__(self, msgs: list[Message]) -> ConsumeStatus:
        (msg,) = msgs  # consume_batch_max_size=1
        mid = msg.msg_id or ""
        self.calls.append((mid, msg.reconsume_times, time.monotonic(), msg))
        plan = self.plans.get(mid, [])
        step = plan.pop(0) if plan else "ok"
        if step == "later":
            return ConsumeStatus.RECONSUME_LATER
        if step == "raise":
            raise RuntimeError(f"listener failed on {mid}")
        if step == "block":
            assert self.gates[mid].wait(20)
        return ConsumeStatus.CONSUME_SUCCESS

    def calls_of(self, mid: str) -> list[tuple[str, int, float, Message]]:
        return [c for c in self.calls if c[0] == mid]


@dataclass
class Env:
    kafka: KafkaSettings
    topic: str
    consumer: PushConsumer
    script: Script

    def send(self, body: bytes, tags: str | None = "TagA", msg_id: str | None = None,
             keys: str = "K") -> tuple[str, int, int]:
        """Release a message as the coordinator does; return (msg id, partition, offset)."""
        mid = msg_id or uuid.uuid4().hex.upper()
        record = encode_visible(Message(self.topic, body, tags=tags, keys=keys,
                                        properties={"app": "test"}, transaction_id=mid,
                                        msg_id=mid, producer_group="pg",
                                        born_timestamp=1_700_000_000_000))
        producer = make_producer(self.kafka)
        try:
            meta = producer.send(record.topic, key=record.key, value=record.value,
                                 headers=list(record.headers)).get(timeout=10)
        finally:
            producer.close()
        return mid, meta.partition, meta.offset

    def committed(self, partition: int) -> int | None:
        c = KafkaConsumer(bootstrap_servers=self.kafka.bootstrap_servers,
                          group_id=self.consumer.consumer_group, enable_auto_commit=False)
        try:
            return c.committed(TopicPartition(self.topic, partition))
        finally:
            c.close()


@pytest.fixture(scope="module")
def env(kafka: KafkaSettings) -> Iterator[Env]:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"cons_{suffix}", f"cg_{suffix}"
    script = Script()
    consumer = PushConsumer(group, kafka.bootstrap_servers, retry_delay_s=RETRY_DELAY_S,
                            max_reconsume_times=MAX_RECONSUME)
    consumer.subscribe(topic, "TagA || TagB")
    consumer.register_message_listener(script)
    e = Env(kafka, topic, consumer, script)
    e.send(b"warm-up")  # creates the topic before the group is formed
    consumer.start()
    wait_until(lambda: {tp.topic for tp in consumer.assignment} == {topic,
                                                                   consumer.retry_topic},
               timeout_s=30)
    yield e
    consumer.shutdown()


def _consumed(env: Env, mid: str, n: int = 1, timeout_s: float = 20.0) -> list:
    return wait_until(lambda: (c := env.script.calls_of(mid)) and len(c) >= n and c, timeout_s)


def test_tags_are_filtered_on_the_client(env: Env) -> None:
    ids = {tags: env.send(f"tagged {tags}".encode(), tags=tags)[0]
           for tags in ("TagA", "TagB", "TagC", None)}
    marker, _, _ = env.send(b"marker", tags="TagB")  # same key, same partition: comes last
    _consumed(env, marker)
    delivered = {c[0] for c in env.script.calls}
    assert ids["TagA"] in delivered and ids["TagB"] in delivered
    assert ids["TagC"] not in delivered and ids[None] not in delivered


def test_received_message_carries_its_ids_and_properties(env: Env) -> None:
    mid, partition, offset = env.send(b"hello", tags="TagA", keys="KEY7")
    (_, reconsume, _, msg), = _consumed(env, mid)
    assert (msg.topic, msg.body, msg.tags, msg.keys) == (env.topic, b"hello", "TagA", "KEY7")
    assert msg.msg_id == msg.transaction_id == mid
    assert msg.properties == {"app": "test"} and msg.producer_group == "pg"
    assert (msg.queue_id, msg.queue_offset, reconsume) == (partition, offset, 0)
    wait_until(lambda: (env.committed(partition) or 0) >= offset + 1, timeout_s=10)


@pytest.mark.parametrize("failure", ["later", "raise"])
def test_failed_message_is_redelivered_after_the_delay(env: Env, failure: str) -> None:
    mid = uuid.uuid4().hex.upper()
    env.script.plans[mid] = [failure]
    env.send(b"try again", msg_id=mid)
    first, second = _consumed(env, mid, 2)
    assert (first[1], second[1]) == (0, 1)  # reconsume_times
    assert second[2] - first[2] >= RETRY_DELAY_S * 0.9
    again = second[3]
    assert (again.topic, again.body, again.msg_id) == (env.topic, b"try again", mid)
    assert again.properties == {"app": "test"}  # the retry bookkeeping is not shown
    time.sleep(RETRY_DELAY_S * 2)
    assert len(env.script.calls_of(mid)) == 2  # consumed: not delivered again


def test_message_goes_to_the_dead_letter_topic_after_max_attempts(env: Env) -> None:
    mid = uuid.uuid4().hex.upper()
    env.script.plans[mid] = ["later"] * (MAX_RECONSUME + 5)
    _, partition, offset = env.send(b"poison", msg_id=mid)
    dlq = env.consumer.dlq_topic
    assert dlq == f"TXSTREAM_DLQ_{env.consumer.consumer_group}"
    records = wait_until(lambda: [r for r in read_topic(env.kafka, dlq)
                                  if header_dict(r.headers).get(H.UNIQ_KEY) == mid], 20)
    (rec,) = records
    h = header_dict(rec.headers)
    assert rec.value == b"poison"
    assert str(MAX_RECONSUME + 1) in h[H.DLQ_REASON] and "max_reconsume_times" in h[H.DLQ_REASON]
    assert h[H.DLQ_ORIGIN_TOPIC] == env.topic
    assert h["RECONSUME_TIME"] == str(MAX_RECONSUME)
    assert [c[1] for c in env.script.calls_of(mid)] == list(range(MAX_RECONSUME + 1))
    time.sleep(RETRY_DELAY_S * 2)
    assert len(env.script.calls_of(mid)) == MAX_RECONSUME + 1  # and then no more
    wait_until(lambda: (env.committed(partition) or 0) >= offset + 1, timeout_s=10)


def test_a_message_released_twice_reaches_the_listener_once(env: Env) -> None:
    mid = uuid.uuid4().hex.upper()
    env.send(b"once", msg_id=mid)
    env.send(b"once", msg_id=mid)  # the coordinator replayed its release
    env.send(b"once", msg_id=mid, keys="another-key")  # even in another partition
    marker, _, _ = env.send(b"marker")
    _consumed(env, marker)
    time.sleep(0.5)
    assert len(env.script.calls_of(mid)) == 1
    assert env.consumer.stats["duplicates"] >= 2


def test_offset_is_committed_only_after_success(env: Env) -> None:
    mid = uuid.uuid4().hex.upper()
    gate = threading.Event()
    env.script.gates[mid] = gate
    env.script.plans[mid] = ["block"]
    _, partition, offset = env.send(b"slow", msg_id=mid)
    try:
        _consumed(env, mid)
        time.sleep(0.3)
        assert (env.committed(partition) or 0) <= offset
    finally:
        gate.set()
    wait_until(lambda: (env.committed(partition) or 0) >= offset + 1, timeout_s=10)


def test_consumer_state_errors(kafka: KafkaSettings) -> None:
    c = PushConsumer("cg_state", kafka.bootstrap_servers)
    with pytest.raises(ClientStateError, match="subscribe"):
        c.start()
    c.subscribe("some_topic")
    with pytest.raises(ClientStateError, match="listener"):
        c.start()
    with pytest.raises(ConfigError):
        c.subscribe("bad topic!")
    with pytest.raises(ConfigError, match="own retry"):
        c.subscribe(c.retry_topic)
    with pytest.raises(ConfigError):
        PushConsumer("bad group!", kafka.bootstrap_servers)
    with pytest.raises(ConfigError, match="retry delays"):
        PushConsumer("cg", kafka.bootstrap_servers, retry_delay_s=-1)
