"""The in-memory Kafka broker (txstream.kafka.memory) behind txstream's client seam: its topics,
records, retention, registry and faults. kafka-python's consumer quirks it reproduces are in
tests/kafka/test_memory_kafka_quirks.py; its Kafka transactions in
tests/kafka/test_memory_kafka_transactions.py; what it shares with tansu and Apache Kafka, and
txstream's sink running on it, in tests/kafka/test_memory_kafka_contract.py."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from tests.support.memory_helpers import Clock, assigned, fill, new_broker
from txstream.errors import BrokerUnavailable, SendFailed
from txstream.kafka import (
    cached_client,
    close_quietly,
    drop_cached_client,
    make_admin,
    make_consumer,
    make_producer,
    read_range,
    wait_for_broker,
)
from txstream.kafka.memory import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    MemoryBroker,
    UnsupportedByMemoryBroker,
)
from txstream.kafka.memory_registry import lookup
from txstream.schema import Kind
from txstream.wire import H

# --- the broker ----------------------------------------------------------------------------


def test_keyed_records_land_where_kafka_pythons_partitioner_puts_them(mem: MemoryBroker) -> None:
    from kafka.partitioner import DefaultPartitioner

    class Cluster:
        def topics(self) -> set[str]:
            return {"t"}

        def partitions_for_topic(self, topic: str) -> set[int]:
            return set(range(5))

        available_partitions_for_topic = partitions_for_topic

    mem.create_topic("t", 5)
    producer = make_producer(mem.settings)
    for i in range(200):
        key = f"tx-{i}".encode()
        want = DefaultPartitioner().partition("t", key, key, None, None, Cluster())
        assert mem.append("t", key, b"v")[0] == want
        assert producer.send("t", key=key, value=b"v").get().partition == want


def test_keyless_placement_replays_with_the_seed(clock: Clock) -> None:
    def placements(seed: int) -> list[int]:
        broker = new_broker(clock, seed)
        broker.create_topic("t", 4)
        return [broker.append("t", None, b"v")[0] for _ in range(50)]

    assert placements(3) == placements(3)
    assert placements(3) != placements(4)


def test_a_re_created_topic_starts_again_at_offset_0(mem: MemoryBroker) -> None:
    fill(mem, "half", 5)
    mem.delete_topic("half")
    assert mem.partition_count("half") is None
    mem.create_topic("half", 2)
    assert mem.append("half", b"k", b"v", partition=0) == (0, 0)


def test_timestamps_create_time_log_append_time_and_tansus(clock: Clock) -> None:
    for tansu, want_type in ((False, LOG_APPEND_TIME), (True, CREATE_TIME)):
        with new_broker(clock, tansu=tansu) as broker:
            broker.create_topic("half", 1, {"message.timestamp.type": "LogAppendTime"})
            broker.create_topic("plain", 1)
            broker.client_clocks["skewed"] = lambda: clock.now - 5000
            producer = make_producer(broker.settings, role="skewed", client_id="skewed")
            meta = [producer.send(t, value=b"v").get() for t in ("half", "plain")]
            clock.now += 10
            stored = [broker.records(t, 0)[0] for t in ("half", "plain")]
            assert stored[1][4:] == (clock.now - 10 - 5000, CREATE_TIME)
            want = clock.now - 10 if want_type == LOG_APPEND_TIME else clock.now - 10 - 5000
            assert stored[0][4:] == (want, want_type)
            assert [m.timestamp for m in meta] == [want, clock.now - 10 - 5000]


def test_retention_drops_old_records_from_the_front(mem: MemoryBroker, clock: Clock) -> None:
    mem.create_topic("t", 1, {"retention.ms": "1000"})
    for age in (900, 800, 100, 5000):  # the last is old, but behind a newer one: it stays
        mem.append("t", b"k", b"v", timestamp=clock.now - age)
    mem.create_topic("forever", 1, {"retention.ms": "-1"})
    mem.append("forever", b"k", b"v", timestamp=0)
    assert mem.apply_retention() == 0
    clock.now += 250
    assert mem.apply_retention() == 2
    assert (mem.start_offset("t", 0), mem.end_offset("t", 0)) == (2, 4)
    assert [r.offset for r in mem.records("t", 0)] == [2, 3]
    assert len(mem.records("forever", 0)) == 1


def test_compaction_keeps_the_last_record_per_key_with_gaps(mem: MemoryBroker) -> None:
    mem.create_topic("check", 1, {"cleanup.policy": "compact,delete"})
    for key in (b"a", b"b", b"a", None, b"b", b"c", b"a"):
        mem.append("check", key, b"v")
    mem.create_topic("plain", 1)
    mem.append("plain", b"a", b"v")
    mem.append("plain", b"a", b"v")
    assert mem.compact("plain") == 0
    assert mem.compact("check") == 3
    assert [r.offset for r in mem.records("check", 0)] == [3, 4, 5, 6]
    # A reader goes over the gaps and ends at the partition's end.
    consumer = make_consumer(mem.settings)
    got = list(read_range(lambda patient: consumer, "check", 0, 0, 7, 5.0))
    assert [r.offset for r in got] == [3, 4, 5, 6]


def test_delete_records_moves_the_log_start(mem: MemoryBroker) -> None:
    fill(mem, "t", 10)
    assert mem.delete_records("t", 0, 4) == 4
    assert mem.start_offset("t", 0) == 4
    with pytest.raises(ValueError):
        mem.delete_records("t", 0, 11)


def test_the_registry_and_unknown_names(clock: Clock) -> None:
    broker = new_broker(clock)
    with broker:
        assert lookup(broker.name) is broker
        with pytest.raises(ValueError), MemoryBroker(broker.name, clock):
            pass
        wait_for_broker(broker.settings)
    assert lookup(broker.name) is None
    with pytest.raises(BrokerUnavailable, match="no memory broker is registered"):
        make_consumer(broker.settings)
    with pytest.raises(BrokerUnavailable):
        wait_for_broker(broker.settings)


def test_groups_are_refused_by_name(mem: MemoryBroker) -> None:
    consumer = make_consumer(mem.settings, group_id="g")
    for call in (lambda: consumer.subscribe(["t"]), consumer.commit,
                 lambda: consumer.committed(TopicPartition("t", 0))):
        with pytest.raises(UnsupportedByMemoryBroker, match="consumer groups"):
            call()
    # Transactions are there (tests/kafka/test_memory_kafka_transactions.py), but their offsets go
    # to a group's coordinator.
    producer = make_producer(mem.settings, transactional_id="t")
    producer.init_transactions()
    producer.begin_transaction()
    with pytest.raises(UnsupportedByMemoryBroker, match="consumer groups"):
        producer.send_offsets_to_transaction({}, "g")


# --- faults --------------------------------------------------------------------------------


def test_a_down_broker_answers_nothing_and_stores_nothing(mem: MemoryBroker) -> None:
    fill(mem, "t", 3)
    producer = make_producer(mem.settings)
    producer.send("t", value=b"before")  # the producer knows the topic now
    producer.flush()
    tp = TopicPartition("t", 0)
    consumer = assigned(mem, tp)
    mem.down = True
    assert consumer.poll(timeout_ms=100) == {}
    assert (consumer.highwater(tp), consumer.position(tp)) == (None, 0)
    future = producer.send("t", value=b"lost")
    with pytest.raises(KafkaTimeoutError):
        producer.send("unknown-to-it", value=b"x")  # no metadata: send itself times out
    with pytest.raises(KafkaTimeoutError):
        producer.flush(timeout=1.0)  # shorter than the delivery timeout: it still waits
    assert not future.is_done
    producer.flush()  # as long as the delivery timeout: the record expires
    assert isinstance(future.exception, KafkaTimeoutError)
    with pytest.raises(BrokerUnavailable):
        make_admin(mem.settings)
    mem.down = False
    assert mem.end_offset("t", 0) == 4
    assert [r.offset for r in consumer.poll(timeout_ms=100)[tp]] == [0, 1, 2, 3]


def test_a_record_waiting_past_its_delivery_timeout_expires(mem: MemoryBroker,
                                                            clock: Clock) -> None:
    mem.create_topic("t", 1)
    producer = make_producer(mem.settings)
    producer.send("t", value=b"a").get()
    mem.down = True
    future = producer.send("t", value=b"b")
    clock.now += 120_000
    mem.down = False
    with pytest.raises(KafkaTimeoutError, match="Expiring"):
        future.get(timeout=0.01)  # the broker is back, but too late
    assert mem.end_offset("t", 0) == 1


def test_an_in_doubt_send_fails_yet_its_record_is_stored(mem: MemoryBroker) -> None:
    from tests.support.kafka_helpers import output_row
    from txstream.sinks.delivery import Delivery

    mem.create_topic("out", 1)
    mem.in_doubt_next(1)
    delivery = Delivery(mem.settings, 10.0)
    delivery.send([(output_row("visible", "out", b"k", b"v"), [("h", b"1")]),
                   (output_row("visible", "out", b"k2", b"v2"), [])])
    with pytest.raises(SendFailed, match="1 of 2 records were not acknowledged"):
        delivery.finish()
    assert [r.value for r in mem.records("out", 0)] == [b"v", b"v2"]


def test_a_record_too_large_is_refused_at_send_and_dead_lettered(mem: MemoryBroker) -> None:
    from tests.support.kafka_helpers import output_row
    from txstream.sinks.delivery import Delivery

    delivery = Delivery(mem.settings, 10.0, dead_letter_topic="dlq", max_message_bytes=2048)
    delivery.send([(output_row("visible", "out", b"k", b"x" * 5000), []),
                   (output_row("visible", "out", b"k", b"small"), [])])
    assert delivery.finish() == {Kind.VISIBLE: 1, Kind.DEAD_LETTER: 1}
    assert [r.value for r in mem.records("out", 0)] == [b"small"]
    [letter] = mem.records("dlq", 0)
    assert b"MessageSizeTooLargeError" in dict(letter.headers)[H.DLQ_REASON]


def test_a_process_killed_in_on_append_leaves_the_broker_whole(mem: MemoryBroker) -> None:
    class Killed(BaseException):
        pass

    mem.create_topic("t", 2)
    seen: list[tuple[str, int, int]] = []

    def kill_at_third(topic: str, partition: int, record: Any) -> None:
        seen.append((topic, partition, record.offset))
        if len(seen) == 3:
            raise Killed

    mem.on_append = kill_at_third
    producer = make_producer(mem.settings)
    for i in range(5):
        producer.send("t", value=f"v{i}".encode(), partition=i % 2)
    with pytest.raises(Killed):
        producer.flush()
    assert [(p, mem.end_offset("t", p)) for p in (0, 1)] == [(0, 1), (1, 1)]
    assert [len(mem.records("t", p)) for p in (0, 1)] == [1, 1]
    assert seen[2] == ("t", 0, 1)  # the record it was appending is not there
    close_quietly(producer)  # what was left is dropped, quietly
    assert mem.end_offset("t", 0) == 1


def test_cached_clients_of_a_memory_broker_are_made_once_and_closed(mem: MemoryBroker) -> None:
    key = ("memory-test", mem.name)
    producer = cached_client(key, lambda: make_producer(mem.settings))
    assert cached_client(key, lambda: pytest.fail("made twice")) is producer
    mem.create_topic("t", 1)
    future = producer.send("t", value=b"v")
    drop_cached_client(key)
    assert future.failed() and mem.end_offset("t", 0) == 0  # a forced close drops it
    with pytest.raises(Exception, match="closed"):
        producer.send("t", value=b"v")
