"""What the in-memory broker must share with the real ones: each scenario runs against a
``MemoryBroker.like_tansu``, the session's tansu and the session's Apache Kafka, through
txstream's own Kafka code (clients, readers, provisioning, delivery). Where the two real
brokers differ, the scenario says how, and which the in-memory one follows
(docs/deployment.md lists the differences); in Kafka transactions it follows Apache Kafka, and
a scenario tansu cannot run runs on the memory broker and Apache Kafka only (``isolating``).
Then txstream's sink runs on the memory broker: ``send_rows`` with its replay check, in a Kafka
transaction too, and ``BodySource``."""

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

from tests.support.kafka_helpers import end_record, half_record, output_row, release_rows
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

COUNT = 30


@dataclass
class World:
    settings: KafkaSettings
    prefix: str
    memory: MemoryBroker | None = None
    kind: str = "memory"  # or "memory-tansu", "tansu", "kafka" (Apache Kafka)

    @property
    def like_kafka(self) -> bool:
        """Answers as Apache Kafka does where it and tansu differ (the memory broker made
        without ``like_tansu`` does)."""
        return self.kind in ("kafka", "memory")

    def topic(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def create(self, name: str, partitions: int, kind: str = "real") -> str:
        topic = self.topic(name)
        with admin_client(self.settings) as admin:
            assert create_topics(admin, [topic_spec(kind, topic, partitions=partitions)]) == {
                topic: None}
        return topic


def _memory_world(like_tansu: bool = True) -> Iterator[World]:
    """An in-memory broker as tansu answers, or as Apache Kafka does (the test broker's four
    partitions a topic on first use)."""
    prefix = f"c{uuid.uuid4().hex[:8]}_"
    clock = lambda: int(time.time() * 1000)  # noqa: E731 - the test's clock, not the broker's
    if like_tansu:
        made = MemoryBroker.like_tansu(prefix.rstrip("_"), clock, random.Random(5),
                                       in_flight_probability=0.3)
    else:
        made = MemoryBroker(prefix.rstrip("_"), clock, random.Random(5), default_partitions=4,
                            in_flight_probability=0.3)
    with made as broker:
        yield World(broker.settings, prefix, broker,
                    kind="memory-tansu" if like_tansu else "memory")


@pytest.fixture(params=["memory", "memory-tansu", pytest.param("tansu", marks=pytest.mark.kafka),
                        pytest.param("kafka", marks=pytest.mark.kafka)])
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    prefix = f"c{uuid.uuid4().hex[:8]}_"
    if request.param == "tansu":
        yield World(request.getfixturevalue("tansu_settings"), prefix, kind="tansu")
    elif request.param == "kafka":
        yield World(request.getfixturevalue("apache_kafka_settings"), prefix, kind="kafka")
    else:
        yield from _memory_world(like_tansu=request.param == "memory-tansu")


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
    in-memory broker follows Apache Kafka, or tansu when made ``like_tansu``."""
    topic = world.create("t", 1)
    _produce(world.settings, topic, 3)
    tp = TopicPartition(topic, 0)
    consumer = make_consumer(world.settings)
    consumer.assign([tp])
    consumer.seek(tp, 8)
    if world.like_kafka:
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
        assert broker_auto_create(admin) is (True if world.like_kafka else None)
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
    tansu keeps the producer's. The in-memory broker follows Apache Kafka, or tansu when made
    ``like_tansu``."""
    topic = world.create("half", 1, kind="half")
    producer = make_producer(world.settings)
    before = int(time.time() * 1000)
    meta = producer.send(topic, key=b"k", value=b"v", timestamp_ms=1000).get(timeout=10)
    producer.close()
    [record] = read_topic(world.settings, topic)
    if world.like_kafka:
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



def _sink_topics(memory: World) -> tuple[Topics, str, SinkOptions]:
    broker = memory.memory
    assert broker is not None
    topics, real = Topics.with_prefix(memory.prefix), memory.topic("orders")
    for topic in (real, topics.history, topics.dead_letter):
        broker.create_topic(topic, 1)  # one partition each: the tests read partition 0
    return topics, real, SinkOptions(kafka=memory.settings,
                                     transactional_id=f"txstream-{memory.prefix}",
                                     dead_letter_topic=topics.dead_letter)


def _notes(settings: KafkaSettings, topics: Topics) -> list[str]:
    from txstream.outputs import decode_history

    return [f"{n['transaction_id']}:{n['event']}" for r in read_topic(settings, topics.history)
            for n in decode_history(r.value)]


def test_send_rows_in_a_transaction_killed_before_its_commit_leaves_nothing(
        memory: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink task killed mid-transaction leaves nothing a read_committed reader sees, nor
    holds it back once the replay's producer aborted the transaction; the replay releases
    each message once (tests/sinks/test_transactional_sink.py, on the memory broker)."""
    from txstream.sinks.transactional import TransactionalDelivery

    broker = memory.memory
    assert broker is not None
    topics, real, options = _sink_topics(memory)

    class Killed(Exception):
        pass

    def die(self: TransactionalDelivery) -> None:  # the releases sent and acknowledged
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(TransactionalDelivery, "_note_dead_letters", die)
        with pytest.raises(Killed):
            send_rows(options, release_rows(real, topics))
    _process_died()  # its producer is gone, its transaction left open
    assert [r.value for r in broker.records(real, 0)] == [b"body 0", b"body 1", b"body 2"]
    assert partition_ends(memory.settings, real) == {0: 0}  # the last stable offset
    assert read_topic(memory.settings, real) == [] and _notes(memory.settings, topics) == []

    commit = send_rows(options, release_rows(real, topics))  # the task run again: a replay
    assert commit.counts == {Kind.VISIBLE: 3, Kind.HISTORY: 3} and commit.already_written == 0
    assert broker.transactions_of(real, 0).aborted == {0, 1, 2}  # the killed attempt's
    assert [r.value for r in read_topic(memory.settings, real)] == [b"body 0", b"body 1",
                                                                     b"body 2"]
    assert _notes(memory.settings, topics) == ["tx-0:released", "tx-1:released",
                                               "tx-2:released"]
    # Once more (the batch's commit was lost): the replay check finds all of it.
    again = send_rows(options, release_rows(real, topics))
    assert (again.already_written, again.counts) == (6, {})
    assert len(read_topic(memory.settings, real)) == 3 and len(_notes(memory.settings,
                                                                      topics)) == 3
    _process_died()


def test_send_rows_takes_back_a_transactional_id_another_producer_fenced(
        memory: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker process ran this partition's task of a later batch: its producer of the
    same transactional id fenced this process's cached one, which makes a new one."""
    from txstream.kafka.transactions import make_transactional_producer

    topics, real, options = _sink_topics(memory)
    monkeypatch.setattr("txstream.sinks.kafka_sink.replay_suspected", lambda: False)
    rows = release_rows(real, topics, n=2)
    send_rows(options, rows[:2])
    other = make_transactional_producer(memory.settings, f"{options.transactional_id}-0")
    other.close()
    commit = send_rows(options, rows[2:])
    assert commit.counts == {Kind.VISIBLE: 1, Kind.HISTORY: 1}
    assert [r.value for r in read_topic(memory.settings, real)] == [b"body 0", b"body 1"]
    assert _notes(memory.settings, topics) == ["tx-0:released", "tx-1:released"]
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


# --- Kafka transactions (KIP-98) -------------------------------------------------------------
# The memory broker follows Apache Kafka in all of them (txstream.kafka.memory_transactions):
# with --transactions auto txstream writes in transactions only where a broker isolates them.


@pytest.fixture(params=["memory", pytest.param("kafka", marks=pytest.mark.kafka)])
def isolating(request: pytest.FixtureRequest) -> Iterator[World]:
    """The memory broker and Apache Kafka, for the scenarios tansu cannot run: it takes the
    transactional calls, but a fenced producer's ``commit_transaction`` never returns on it
    (kafka-python waits for an EndTxn answer it does not get: tried for 30 s), and its
    ``read_committed`` readers get aborted records (tests/kafka/test_transactions_probe.py)."""
    if request.param == "kafka":
        yield World(request.getfixturevalue("apache_kafka_settings"), f"c{uuid.uuid4().hex[:8]}_",
                    kind="kafka")
    else:
        yield from _memory_world()


def _transactional(world: World) -> Any:
    from txstream.kafka.transactions import make_transactional_producer

    return make_transactional_producer(world.settings, f"{world.prefix}tx")


def _end_offsets(world: World, tps: list[TopicPartition], level: str) -> dict[int, int]:
    consumer = make_consumer(world.settings, isolation_level=level)
    try:
        return {tp.partition: end for tp, end in consumer.end_offsets(tps).items()}
    finally:
        consumer.close()


def _read_from_0(world: World, tp: TopicPartition, level: str) -> tuple[list[bytes], int]:
    """The values a new reader at ``level`` returns of ``tp`` from 0 to its end (its
    ``highwater()``), and its position then."""
    consumer = make_consumer(world.settings, isolation_level=level)
    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        return [r.value for r in _read(consumer, tp)], consumer.position(tp)
    finally:
        consumer.close()


def test_committed_and_aborted_transactions_at_both_isolation_levels(world: World) -> None:
    """A committed transaction and an aborted one across two partitions. Each ends with a
    marker that takes an offset; a reader that read to the end is past it. tansu's
    read_committed readers get the aborted records too; the rest is the same on it."""
    from txstream.kafka import TopicReader

    topic = world.create("t", 2)
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    producer = _transactional(world)
    try:
        producer.begin_transaction()
        for value, p in ((b"c0", 0), (b"c1", 1), (b"c2", 0)):
            producer.send(topic, value=value, partition=p)
        producer.commit_transaction()
        producer.begin_transaction()
        for value, p in ((b"a0", 0), (b"a1", 1)):
            producer.send(topic, value=value, partition=p)
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close()
    # Partition 0: c0 c2 COMMIT a0 ABORT; partition 1: c1 COMMIT a1 ABORT.
    ends = {0: 5, 1: 4}
    everything = {0: [b"c0", b"c2", b"a0"], 1: [b"c1", b"a1"]}
    committed = everything if world.kind == "tansu" else {0: [b"c0", b"c2"], 1: [b"c1"]}
    for level, wanted in (("read_committed", committed), ("read_uncommitted", everything)):
        assert _end_offsets(world, tps, level) == ends
        assert {tp.partition: _read_from_0(world, tp, level) for tp in tps} == {
            p: (wanted[p], ends[p]) for p in (0, 1)}
        with TopicReader(world.settings, [topic], isolation_level=level) as reader:
            got = reader.read_new()
            assert reader.positions() == {(topic, p): ends[p] for p in (0, 1)}
        assert sorted((r.partition, r.value) for r in got) == sorted(
            (p, v) for p in (0, 1) for v in wanted[p])
    assert partition_ends(world.settings, topic) == ends


def test_an_open_transaction_holds_read_committed_readers_back_until_it_commits(
        world: World) -> None:
    """The last stable offset: a read_committed reader stops at the open transaction's first
    record, records after it (another producer's) wait with it. tansu holds readers back too,
    but answers a read_committed ListOffsets wrongly (docs/deployment.md: its end offsets are;
    txstream reads ends by fetching)."""
    topic = world.create("t", 1)
    tp = TopicPartition(topic, 0)
    _produce(world.settings, topic, 1)
    producer = _transactional(world)
    try:
        producer.begin_transaction()
        producer.send(topic, value=b"open", partition=0).get(timeout=10)
        _produce(world.settings, topic, 1)  # v0 again, after the open transaction's record
        assert partition_ends(world.settings, topic) == {0: 1}
        assert _read_from_0(world, tp, "read_committed") == ([b"v0"], 1)
        assert _read_from_0(world, tp, "read_uncommitted") == ([b"v0", b"open", b"v0"], 3)
        if world.kind != "tansu":
            assert _end_offsets(world, [tp], "read_committed") == {0: 1}
        assert _end_offsets(world, [tp], "read_uncommitted") == {0: 3}
        reader = make_consumer(world.settings)  # txstream's default: read_committed
        reader.assign([tp])
        reader.seek(tp, 0)
        assert [r.value for r in _read(reader, tp)] == [b"v0"]
        producer.commit_transaction()  # its marker at 3
        later: list[bytes] = []
        deadline = time.monotonic() + 10  # the reader's high watermark is its last fetch's
        while reader.position(tp) < 4 and time.monotonic() < deadline:
            later += [r.value for r in reader.poll(timeout_ms=50).get(tp, [])]
        assert later == [b"open", b"v0"]
        assert (reader.position(tp), reader.highwater(tp)) == (4, 4)
        reader.close()
    finally:
        producer.close()
    assert partition_ends(world.settings, topic) == {0: 4}
    assert _end_offsets(world, [tp], "read_committed") == {0: 4}


def test_a_second_producer_of_the_id_fences_the_first_and_aborts_its_transaction(
        isolating: World) -> None:
    from txstream.kafka.errors import KafkaError, ProducerFencedError
    from txstream.kafka.transactions import fenced

    world = isolating
    topic = world.create("t", 1)
    tp = TopicPartition(topic, 0)
    old = _transactional(world)
    new = None
    try:
        old.begin_transaction()
        old.send(topic, value=b"zombie", partition=0).get(timeout=10)
        assert partition_ends(world.settings, topic) == {0: 0}  # held back
        new = _transactional(world)  # its init_transactions aborts the old one's: a marker
        assert partition_ends(world.settings, topic) == {0: 2}
        assert _read_from_0(world, tp, "read_committed") == ([], 2)
        assert _read_from_0(world, tp, "read_uncommitted") == ([b"zombie"], 2)
        with pytest.raises(ProducerFencedError):
            old.commit_transaction()
        for call in (old.begin_transaction, old.abort_transaction,
                     lambda: old.send(topic, value=b"late", partition=0)):
            with pytest.raises(KafkaError) as raised:
                call()
            assert fenced(raised.value), raised.value  # its fatal error state, naming the fence
        new.begin_transaction()
        new.send(topic, value=b"new", partition=0)
        new.commit_transaction()
    finally:
        old.close()
        if new is not None:
            new.close()
    assert _read_from_0(world, tp, "read_committed") == ([b"new"], 4)
