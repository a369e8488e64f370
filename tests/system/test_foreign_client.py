"""A producer and a check listener written from docs/wire-format.md alone, with another Kafka
client (confluent-kafka, librdkafka: what Java, Go or C# producers use) and no txstream code,
against the running coordinator: the wire format is the whole contract."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from tests.support.kafka_helpers import wait_until
from txstream.kafka import KafkaSettings
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.topics import Topics

pytestmark = pytest.mark.spark

GROUP = "foreign"
# What the page says, written out as a producer in another language would: header names, the
# check consumer group's name, the topic names.
HALF, END, CHECK = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", \
    "RMQ_SYS_TRANS_CHECK_"
DISCARD, DEAD_LETTER = "TRANS_CHECK_MAX_TIME_TOPIC", "TXSTREAM_DEAD_LETTER"
# The page's producer settings and partitioner (librdkafka's default partitioner is CRC32),
# compressed as a librdkafka application often does.
PRODUCER = {"acks": "all", "enable.idempotence": True, "partitioner": "murmur2_random",
            "compression.type": "lz4"}


def _half(prefix: str, txid: str, real: str, body: bytes, **props: str) -> dict[str, Any]:
    headers = [("TRAN_MSG", b"true"), ("REAL_TOPIC", real.encode()), ("PGROUP", GROUP.encode()),
               ("BORN_TIMESTAMP", str(int(time.time() * 1000)).encode()),
               ("UNIQ_KEY", txid.encode()), ("TAGS", b"TagA"), ("KEYS", f"k-{txid}".encode()),
               *((k, v.encode()) for k, v in props.items())]
    return {"topic": prefix + HALF, "key": txid.encode(), "value": body, "headers": headers}


def _end(prefix: str, txid: str, decision: str, group: str = GROUP,
         extra: tuple[tuple[str, bytes], ...] = (), check: int | None = None) -> dict[str, Any]:
    headers = [("COMMIT_OR_ROLLBACK", decision.encode()), ("PGROUP", group.encode()), *extra]
    if check is not None:
        headers += [("FROM_TRANSACTION_CHECK", b"true"),
                    ("TRANSACTION_CHECK_TIMES", str(check).encode())]
    return {"topic": prefix + END, "key": txid.encode(), "value": b"", "headers": headers}


def _read(servers: str, topic: str) -> list[Any]:
    """Every record of ``topic`` so far, read by assignment (no group to join)."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": servers, "group.id": "unused", "enable.auto.commit": False})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            return []
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in meta.partitions])
        out, quiet = [], time.monotonic()
        while time.monotonic() - quiet < 2:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                out.append(msg)
                quiet = time.monotonic()
        return out
    finally:
        consumer.close()


class Checker(threading.Thread):
    """Answers its group's check requests: the transaction's planned decision, else UNKNOW."""

    def __init__(self, servers: str, prefix: str, plan: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.servers, self.prefix, self.plan = servers, prefix, plan
        self.asked: list[tuple[str, int]] = []
        self.stop = threading.Event()
        self.producer = confluent_kafka.Producer({"bootstrap.servers": servers, **PRODUCER})

    def run(self) -> None:
        topic = f"{self.prefix}{CHECK}{GROUP}"
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": self.servers, "group.id": f"{topic}.checkers",
            "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000})
        consumer.subscribe([topic])
        try:
            while not self.stop.is_set():
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                headers = dict(msg.headers() or [])
                txid, times = msg.key().decode(), int(headers["TRANSACTION_CHECK_TIMES"])
                self.asked.append((txid, times))
                decision = self.plan.get(txid, "UNKNOW")
                self.producer.produce(**_end(self.prefix, txid, decision, check=times))
                self.producer.flush(10)
        finally:
            consumer.close()


@pytest.fixture
def coordinator(spark: Any, kafka: KafkaSettings, checkpoint_dir: Path) -> Iterator[str]:
    prefix = f"f{uuid.uuid4().hex[:8]}_"
    query = start_coordinator(spark, RunConfig(
        kafka=kafka, topics=Topics.with_prefix(prefix), checkpoint_dir=checkpoint_dir,
        policy=Policy(transaction_timeout=2_000, check_interval=2_000, check_max=3,
                      orphan_end_timeout=3_000),
        query_name=f"foreign-{prefix}"))
    yield prefix
    query.stop()


def test_a_client_written_from_the_wire_format_alone(coordinator: str,
                                                     kafka: KafkaSettings) -> None:
    servers, prefix, real = kafka.bootstrap_servers, coordinator, f"{coordinator}orders"
    admin = AdminClient({"bootstrap.servers": servers})
    # The page: the producer creates its group's check topic before its checker subscribes.
    created = admin.create_topics([NewTopic(f"{prefix}{CHECK}{GROUP}", 2)])
    for future in created.values():
        future.result(10)
    plan = {"checked-commit": "COMMIT_MESSAGE", "unknown-forever": "UNKNOW"}
    checker = Checker(servers, prefix, plan)
    checker.start()
    producer = confluent_kafka.Producer({"bootstrap.servers": servers, **PRODUCER})
    foreign_end = _end(prefix, "wrong-group", "COMMIT_MESSAGE", group="intruders",
                       extra=(("X-Trace", b"abc"),))
    orphan = _end(prefix, "no-half", "COMMIT_MESSAGE", extra=(("X-Trace", b"def"),))
    for record in (
        _half(prefix, "commit", real, b"body-commit", color="red", REMARK="gift"),
        _end(prefix, "commit", "COMMIT_MESSAGE"),
        _half(prefix, "rollback", real, b"body-rollback"),
        _end(prefix, "rollback", "ROLLBACK_MESSAGE"),
        _half(prefix, "checked-commit", real, b"body-checked"),
        _end(prefix, "checked-commit", "UNKNOW"),
        _half(prefix, "unknown-forever", real, b"body-unknown"),
        _half(prefix, "wrong-group", real, b"body-wrong"), foreign_end, orphan,
    ):
        producer.produce(**record)
    assert producer.flush(10) == 0
    try:
        visible = wait_until(lambda: (v := _read(servers, real)) and len(v) >= 2 and v,
                             timeout_s=120)
        discarded = wait_until(lambda: [m for m in _read(servers, prefix + DISCARD)
                                        if m.key() == b"unknown-forever"], timeout_s=120)
        dead = wait_until(lambda: (d := _read(servers, prefix + DEAD_LETTER)) and len(d) >= 2
                          and d, timeout_s=60)
    finally:
        checker.stop.set()
        checker.join(10)
        del checker.producer, producer  # librdkafka's clients end when collected
    released = {m.key(): (m.value(), dict(m.headers())) for m in visible}
    assert set(released) == {b"k-commit", b"k-checked-commit"}  # once each, no rollback
    body, headers = released[b"k-commit"]
    assert body == b"body-commit" and headers["TAGS"] == b"TagA"
    assert headers["color"] == b"red" and headers["REMARK"] == b"gift"
    assert headers["UNIQ_KEY"] == b"commit" and headers["__transactionId__"] == b"commit"
    [gone] = discarded
    reason = dict(gone.headers())["DISCARD_REASON"].decode()
    assert "check_max=3" in reason and gone.value() == b"body-unknown"
    assert [t for t, _ in checker.asked if t == "unknown-forever"][:3] == ["unknown-forever"] * 3
    by_key = {m.key(): m for m in dead}
    for sent, code in ((foreign_end, "WRONG_GROUP"), (orphan, "NO_HALF_MESSAGE")):
        letter = by_key[sent["key"]]
        got = letter.headers()
        assert letter.value() == b"" and got[:len(sent["headers"])] == sent["headers"]
        assert dict(got)["DLQ_CODE"] == code.encode()
