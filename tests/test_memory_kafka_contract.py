"""What the in-memory broker must share with the real ones: each scenario runs against a
``MemoryBroker.like_tansu``, the session's tansu and the session's Apache Kafka, through
txstream's own Kafka code (clients, readers, provisioning, delivery). Where the two real
brokers differ, the scenario says how, and which the in-memory one follows
(docs/deployment.md lists the differences). Then txstream's sink runs on the memory broker:
``send_rows`` with its replay check, and ``BodySource``."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.partitioner import murmur2

from txstream.kafka import (
    KafkaSettings,
    fetch_ends,
    make_consumer,
    make_producer,
    partition_ends,
    read_range,
    read_topic,
)
from txstream.kafka.clients import _CACHED, drop_cached_client
from txstream.kafka.memory import MemoryBroker
from txstream.kafka.provision import (
    EXISTS,
    admin_client,
    broker_auto_create,
    create_topics,
    ensure_topics,
    topic_spec,
    topic_states,
)
from txstream.readback.bodies import BodySource, gone_bodies
from txstream.schema import Kind
from txstream.sinks.delivery import Delivery
from txstream.sinks.kafka_sink import SinkOptions, send_rows
from txstream.topics import Topics
from txstream.wire import H, pack_headers

from kafka_helpers import end_record, half_record, output_row

COUNT = 30


@dataclass
class World:
    settings: KafkaSettings
    prefix: str
    memory: MemoryBroker | None = None
    kind: str = "memory"  # or "tansu", "kafka" (Apache Kafka)

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def create(self, name: str, partitions: int, kind: str = "real") -> str:
        topic = self.topic(name)
        with admin_client(self.settings) as admin:
            assert create_topics(admin, [topic_spec(kind, topic, partitions=partitions)]) == {
                topic: None}
        return topic


def _memory_world() -> Iterator[World]:
    prefix = f"c{uuid.uuid4().hex[:8]}_"
    clock = lambda: int(time.time() * 1000)  # noqa: E731 - the test's clock, not the broker's
    with MemoryBroker.like_tansu(prefix.rstrip("_"), clock, random.Random(5),
                                 in_flight_probability=0.3) as broker:
        yield World(broker.settings, prefix, broker)


@pytest.fixture(params=["memory", pytest.param("tansu", marks=pytest.mark.kafka),
                        pytest.param("kafka", marks=pytest.mark.kafka)])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    prefix = f"c{uuid.uuid4().hex[:8]}_"
    if request.param == "tansu":
        yield World(request.getfixturevalue("tansu_settings"), prefix, kind="tansu")
    elif request.param == "kafka":
        yield World(request.getfixturevalue("apache_kafka_settings"), prefix, kind="kafka")
    else:
        yield from _memory_world()


@pytest.fixture
def memory() -> Iterator[World]:
    yield from _memory_world()


def _produce(settings: KafkaSettings, topic: str, count: int = COUNT) -> list[Any]:
    producer = make_producer(settings)
    try:
        futures = [producer.send(topic, key=f"tx-{i}".encode(), value=f"v{i}".encode(),
                                 headers=[("n", str(i).encode())]) for i in range(count)]
        producer.flush()
        return [f.get(timeout=10) for f in futures]
    finally:
        producer.close()


def _read(consumer: Any, tp: TopicPartition, timeout_s: float = 10.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out += consumer.poll(timeout_ms=50).get(tp, [])
        hw = consumer.highwater(tp)
        if hw is not None and consumer.position(tp) >= hw:
            return out
    raise AssertionError(f"{tp} not read to its end: {len(out)} records")


def test_records_go_where_the_key_says_and_read_back_by_assign_seek_poll(world: World) -> None:
    topic = world.create("t", 3)
    sent = _produce(world.settings, topic)
    for i, meta in enumerate(sent):
        assert meta.partition == (murmur2(f"tx-{i}".encode()) & 0x7FFFFFFF) % 3
    consumer = make_consumer(world.settings)
    assert consumer.partitions_for_topic(topic) == {0, 1, 2}
    assert consumer.partitions_for_topic(world.topic("missing")) == set()
    for p in range(3):
        tp = TopicPartition(topic, p)
        want = [(m.offset, f"tx-{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())])
                for i, m in enumerate(sent) if m.partition == p]
        consumer.assign([tp])
        assert consumer.highwater(tp) is None
        assert consumer.position(tp) == 0  # auto_offset_reset: earliest
        consumer.seek(tp, 0)
        got = [(r.offset, r.key, r.value, r.headers) for r in _read(consumer, tp)]
        assert got == want
        assert consumer.highwater(tp) == consumer.position(tp) == len(want)
        consumer.seek(tp, 1)  # the position only
        assert (consumer.position(tp), consumer.highwater(tp)) == (1, len(want))
        consumer.assign([tp])  # the same set keeps the state
        assert consumer.highwater(tp) == len(want)
        consumer.assign([])
        consumer.assign([tp])
        assert consumer.highwater(tp) is None
    consumer.close()


def test_a_position_past_the_end(world: World) -> None:
    """tansu keeps a position past the end and answers nothing; Apache Kafka answers
    OFFSET_OUT_OF_RANGE, and kafka-python resets it (``auto_offset_reset``: earliest). The
    in-memory broker follows tansu here."""
    topic = world.create("t", 1)
    _produce(world.settings, topic, 3)
    tp = TopicPartition(topic, 0)
    consumer = make_consumer(world.settings)
    consumer.assign([tp])
    consumer.seek(tp, 8)
    if world.kind == "kafka":
        assert [r.offset for r in _read(consumer, tp)] == [0, 1, 2]
    else:
        for _ in range(5):
            assert consumer.poll(timeout_ms=50) == {}
        assert consumer.position(tp) == 8
    consumer.close()


def test_txstreams_readers_read_the_same_records(world: World) -> None:
    topic = world.create("t", 2)
    sent = _produce(world.settings, topic)
    counts = {p: sum(m.partition == p for m in sent) for p in (0, 1)}
    assert partition_ends(world.settings, topic) == counts
    assert partition_ends(world.settings, world.topic("missing")) == {}
    probe = make_consumer(world.settings, fetch_max_wait_ms=1, max_partition_fetch_bytes=1)
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    assert fetch_ends(probe, tps, {(topic, 0): 2}, 10.0) == {(topic, p): counts[p]
                                                              for p in (0, 1)}
    probe.close()
    by_place = {(m.partition, m.offset): f"v{i}".encode() for i, m in enumerate(sent)}
    consumer = make_consumer(world.settings, fetch_max_wait_ms=5)
    ranged = list(read_range(lambda patient: consumer, topic, 0, 2, 5, 10.0))
    assert [(r.offset, r.value) for r in ranged] == [(o, by_place[(0, o)]) for o in (2, 3, 4)]
    past = list(read_range(lambda patient: consumer, topic, 1, 1, 10_000, 10.0,
                           stop_at_end=True))
    assert [r.offset for r in past] == list(range(1, counts[1]))
    consumer.close()
    every = read_topic(world.settings, topic)
    assert [((r.partition, r.offset), r.value) for r in every] == sorted(by_place.items())
    later = read_topic(world.settings, topic, starts={0: counts[0] - 1, 1: counts[1]})
    assert [(r.partition, r.offset) for r in later] == [(0, counts[0] - 1)]


def test_an_end_comes_from_a_fetch_sent_after_it_was_asked_for(world: World) -> None:
    """A kept consumer holds the answer of a fetch it sent ahead; its high watermark is
    that of its time, and must not pass for the end now."""
    topic = world.create("t", 2)
    probe = make_consumer(world.settings, fetch_max_wait_ms=1, max_partition_fetch_bytes=1)
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    assert fetch_ends(probe, tps, {}, 10.0) == {(topic, 0): 0, (topic, 1): 0}
    if world.memory is not None:  # the fetch sent ahead stays out, and answers as of then
        world.memory.in_flight_probability, world.memory.stale_fetch_probability = 1.0, 1.0
    for _ in range(3):
        probe.poll(timeout_ms=0)  # a fetch goes out ahead; its answer waits in the consumer
    time.sleep(0.2)
    if world.memory is not None:
        world.memory.in_flight_probability = 0.0
    sent = _produce(world.settings, topic)
    counts = {(topic, p): sum(m.partition == p for m in sent) for p in (0, 1)}
    assert fetch_ends(probe, tps, {}, 10.0) == counts
    probe.close()


def test_the_provisioning_admin_calls(world: World) -> None:
    half, end = world.topic("half"), world.topic("end")
    specs = [topic_spec("half", half), topic_spec("end", end, partitions=3)]
    with admin_client(world.settings) as admin:
        assert not topic_states(admin, [half])[half].present
        # tansu does not tell; Apache Kafka does (the test broker creates topics on first use)
        assert broker_auto_create(admin) is (True if world.kind == "kafka" else None)
        assert create_topics(admin, specs[:1]) == {half: None}
        assert create_topics(admin, specs[:1]) == {half: EXISTS}
    assert ensure_topics(world.settings, specs, "cmd") == [end]
    assert ensure_topics(world.settings, specs, "cmd") == []
    with admin_client(world.settings) as admin:
        states = topic_states(admin, [half, end], with_configs=True)
    assert (states[half].partitions, states[end].partitions) == (2, 3)
    # Apache Kafka also reports the broker's defaults of the settings txstream shows.
    assert states[half].configs.items() >= {"retention.ms": "604800000",
                                            "message.timestamp.type": "LogAppendTime"}.items()
    if world.kind != "kafka":
        assert len(states[half].configs) == 2


def test_a_log_append_time_topic(world: World) -> None:
    """Apache Kafka stamps a record of a ``LogAppendTime`` topic with its own time (type 1);
    tansu keeps the producer's. The in-memory broker follows tansu here."""
    topic = world.create("half", 1, kind="half")
    producer = make_producer(world.settings)
    before = int(time.time() * 1000)
    meta = producer.send(topic, key=b"k", value=b"v", timestamp_ms=1000).get(timeout=10)
    producer.close()
    [record] = read_topic(world.settings, topic)
    if world.kind == "kafka":
        assert meta.timestamp >= before and (record.timestamp, record.timestamp_type) == (
            meta.timestamp, 1)
    else:
        assert meta.timestamp == 1000
        assert (record.timestamp, record.timestamp_type) == (1000, 0)


def test_topics_are_created_on_first_use_with_four_partitions(world: World) -> None:
    produced, read = world.topic("produced"), world.topic("read")
    _produce(world.settings, produced, 1)
    consumer = make_consumer(world.settings)
    tp = TopicPartition(read, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    _read(consumer, tp)  # its metadata request names the topic: the broker creates it
    consumer.close()
    with admin_client(world.settings) as admin:
        states = topic_states(admin, [produced, read])
    assert (states[produced].partitions, states[read].partitions) == (4, 4)


def test_a_consumer_keeps_a_topics_partitions_until_it_asks_again(world: World) -> None:
    topic = world.create("t", 3)
    consumer = make_consumer(world.settings)
    assert consumer.partitions_for_topic(topic) == {0, 1, 2}
    with admin_client(world.settings) as admin:
        admin.delete_topics([topic])
        assert create_topics(admin, [topic_spec("real", topic, partitions=1)]) == {topic: None}
    assert consumer.partitions_for_topic(topic) == {0, 1, 2}
    consumer.topics()
    assert consumer.partitions_for_topic(topic) == {0}
    consumer.close()


def test_a_delivery_is_acknowledged_whole(world: World) -> None:
    topic = world.create("out", 1)
    rows = [(output_row(Kind.VISIBLE, topic, f"k{i}".encode(), f"v{i}".encode(),
                        record_id=f"tag.{i}"), [(H.RECORD_ID, f"tag.{i}".encode())])
            for i in range(5)]
    delivery = Delivery(world.settings, 30.0)
    delivery.send(rows)
    assert delivery.finish() == {Kind.VISIBLE: 5}
    got = read_topic(world.settings, topic)
    assert [(r.value, r.headers) for r in got] == [
        (f"v{i}".encode(), [(H.RECORD_ID, f"tag.{i}".encode())]) for i in range(5)]


# --- txstream's sink on the memory broker ----------------------------------------------------


def _process_died() -> None:
    """A simulated process ends: its cached clients go with it (nothing they held is sent)."""
    for key in list(_CACHED):
        drop_cached_client(key)


def test_send_rows_writes_a_batch_replayed_after_a_crash_once(memory: World) -> None:
    world, broker = memory, memory.memory
    assert broker is not None
    topic = world.topic("visible")
    batch_ms = broker.clock()
    rows = [output_row(Kind.VISIBLE, topic, f"k{i}".encode(), f"v{i}".encode(),
                       pack_headers([(H.RECORD_ID, f"tag.{i}".encode())]),
                       record_id=f"tag.{i}", batch_ms=batch_ms) for i in range(6)]

    class Killed(BaseException):
        pass

    appended: list[int] = []

    def crash_at_the_fourth(topic: str, partition: int, record: Any) -> None:
        appended.append(record.offset)
        if len(appended) == 4:
            raise Killed

    broker.on_append = crash_at_the_fourth
    with pytest.raises(Killed):
        send_rows(SinkOptions(kafka=world.settings), rows)
    _process_died()
    broker.on_append = None
    commit = send_rows(SinkOptions(kafka=world.settings), rows)  # the replay
    assert (commit.counts, commit.already_written) == ({Kind.VISIBLE: 3}, 3)
    assert sorted(r.value for r in read_topic(world.settings, topic)) == [
        f"v{i}".encode() for i in range(6)]
    assert send_rows(SinkOptions(kafka=world.settings), rows).already_written == 6
    _process_died()


def test_body_source_reads_held_bodies_back(memory: World) -> None:
    broker = memory.memory
    assert broker is not None
    topics = Topics.with_prefix(memory.prefix)
    broker.create_topic(topics.half, 2)
    at = {}
    for i in range(40):
        record = half_record(topics, f"tx-{i}", "G", "orders", body=f"body {i}".encode())
        at[f"tx-{i}"] = broker.append(record.topic, record.key, record.value, record.headers)
    source = BodySource(memory.settings, topics.half)
    wanted = {p: {o for q, o in at.values() if q == p} | {500} for p in (0, 1)}
    found = source.read(wanted)
    assert {place: rec.value for place, rec in found.items()} == {
        place: f"body {i}".encode() for i, place in enumerate(at.values())}
    assert list(gone_bodies(source, {"tx-7": at["tx-7"], "tx-x": at["tx-8"]})) == ["tx-x"]
    release = output_row(Kind.VISIBLE, memory.topic("orders"), b"K", None,
                         pack_headers([(H.TRANSACTION_ID, b"tx-7")]), body_at=at["tx-7"])
    options = SinkOptions(kafka=memory.settings, dead_letter_topic=topics.dead_letter,
                          half_topic=topics.half)
    assert send_rows(options, [release]).counts == {Kind.VISIBLE: 1}
    assert [r.value for r in read_topic(memory.settings, memory.topic("orders"))] == [b"body 7"]
    _process_died()


def test_the_source_plans_and_reads_batches_on_the_memory_broker(memory: World) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from txstream.message import Decision
    from txstream.sources.event_rows import event_struct
    from txstream.sources.kafka_source import KafkaEventReader, SourceOptions

    broker = memory.memory
    assert broker is not None
    topics = Topics.with_prefix(memory.prefix)
    reader = KafkaEventReader(SourceOptions(kafka=memory.settings, half_topic=topics.half,
                                            end_topic=topics.end), event_struct())
    start = reader.initialOffset()  # creates both topics, two partitions each
    ids = {t: broker.topic_id(t) for t in (topics.half, topics.end)}
    assert start == {topics.half: {"0": 0, "1": 0}, topics.end: {"0": 0, "1": 0},
                     "_ends_read": {"at": 0}, "_topic_ids": ids}
    records = [half_record(topics, f"tx-{i}", "G", "orders") for i in range(12)]
    records += [end_record(topics, f"tx-{i}", "G", Decision.COMMIT_MESSAGE) for i in range(5)]
    for record in records:
        broker.append(record.topic, record.key, record.value, record.headers)
    end = reader.latestOffset(start, ReadAllAvailable())
    ends_read, known = end.pop("_ends_read"), end.pop("_topic_ids")
    assert end == {t: {str(p): broker.end_offset(t, p) for p in (0, 1)}
                   for t in (topics.half, topics.end)}
    assert known == ids
    end["_ends_read"] = ends_read
    rows = sum(batch.num_rows for part in reader.partitions(start, end)
               for batch in reader.read(part))
    assert rows == len(records) + 1  # and the batch's progress row
    reader.commit(end)
    _process_died()
