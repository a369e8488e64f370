"""The in-memory broker's Kafka transactions (txstream.kafka.memory_transactions): the
producer's states and errors as kafka-python's, the broker's bookkeeping (open transactions and
the last stable offset, aborted records, markers) through its transaction timeout, retention,
compaction and faults, and the consumer at both isolation levels. The scenarios it shares with
Apache Kafka are in tests/kafka/test_memory_kafka_contract.py."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import (
    IllegalStateError,
    InvalidTransactionTimeoutError,
    KafkaConfigurationError,
    KafkaError,
    KafkaTimeoutError,
    ProducerFencedError,
    TransactionAbortedError,
)

from tests.support.memory_helpers import Clock, assigned, offsets
from txstream.kafka import make_consumer, make_producer
from txstream.kafka.memory import MemoryBroker
from txstream.kafka.transactions import fenced


def _producer(mem: MemoryBroker, tid: str = "tx", **options: Any) -> Any:
    producer = make_producer(mem.settings, transactional_id=tid, **options)
    producer.init_transactions()
    return producer


def _in_transaction(producer: Any, topic: str, values: list[bytes], partition: int = 0
                    ) -> list[Any]:
    producer.begin_transaction()
    futures = [producer.send(topic, value=v, partition=partition) for v in values]
    producer.flush()
    return futures


def _read(mem: MemoryBroker, tp: TopicPartition, level: str, max_records: int = 500
          ) -> tuple[list[int], int, int | None]:
    """Offsets a consumer at ``level`` returns reading ``tp`` from 0 to its end; its position
    and high watermark then."""
    consumer = assigned(mem, tp, isolation_level=level)
    out: list[int] = []
    for _ in range(50):
        out += offsets(consumer.poll(timeout_ms=10, max_records=max_records), tp)
        hw = consumer.highwater(tp)
        if hw is not None and consumer.position(tp) >= hw:
            break
    position, hw = consumer.position(tp), consumer.highwater(tp)
    consumer.close()
    return out, position, hw


# --- the producer --------------------------------------------------------------------------


def test_configs_and_calls_out_of_order_are_refused_as_kafka_python_does(
        mem: MemoryBroker) -> None:
    with pytest.raises(KafkaConfigurationError, match="without enable_idempotence"):
        make_producer(mem.settings, transactional_id="a", enable_idempotence=False)
    with pytest.raises(KafkaConfigurationError, match="acks=1"):
        make_producer(mem.settings, transactional_id="a", acks=1)
    with pytest.raises(IllegalStateError, match="without setting a transactional_id"):
        make_producer(mem.settings).init_transactions()
    mem.create_topic("t", 1)
    producer = make_producer(mem.settings, transactional_id="a")
    with pytest.raises(IllegalStateError, match="before completing a call to init_transactions"):
        producer.send("t", value=b"x")
    with pytest.raises(KafkaError, match="from state UNINITIALIZED to state IN_TRANSACTION"):
        producer.begin_transaction()
    producer.init_transactions()
    producer.init_transactions()  # once done, again does nothing: the epoch stays
    with pytest.raises(IllegalStateError, match="Cannot call send in state READY"):
        producer.send("t", value=b"x")
    with pytest.raises(KafkaError, match="from state READY to state COMMITTING"):
        producer.commit_transaction()
    with pytest.raises(InvalidTransactionTimeoutError):
        make_producer(mem.settings, transactional_id="b",
                      transaction_timeout_ms=900_001).init_transactions()


def test_commit_and_abort_write_a_marker_per_partition(mem: MemoryBroker) -> None:
    mem.create_topic("t", 2)
    producer = _producer(mem)
    producer.begin_transaction()
    for p in (0, 1, 0):
        producer.send("t", value=f"c{p}".encode(), partition=p)
    producer.commit_transaction()  # delivers what waits first
    assert [mem.end_offset("t", p) for p in (0, 1)] == [3, 2]  # the markers take offsets
    _in_transaction(producer, "t", [b"a0", b"a1"], partition=1)
    producer.abort_transaction()
    assert [mem.transactions_of("t", p).markers for p in (0, 1)] == [{2: True},
                                                                      {1: True, 4: False}]
    assert mem.transactions_of("t", 1).aborted == {2, 3}
    assert [r.value for r in mem.records("t", 1)] == [b"c1", b"a0", b"a1"]  # aborted, kept
    # An empty transaction joins no partition: it ends without a request, so no marker.
    producer.begin_transaction()
    producer.abort_transaction()
    producer.begin_transaction()
    producer.commit_transaction()
    assert [mem.end_offset("t", p) for p in (0, 1)] == [3, 5]


def test_both_isolation_levels_read_to_the_end_past_markers(mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    mem.append("t", None, b"plain")  # outside any transaction: committed for both
    producer = _producer(mem)
    _in_transaction(producer, "t", [b"c1", b"c2"])
    producer.commit_transaction()  # marker at 3
    _in_transaction(producer, "t", [b"a1", b"a2"])
    producer.abort_transaction()  # marker at 6
    tp = TopicPartition("t", 0)
    assert _read(mem, tp, "read_committed") == ([0, 1, 2], 7, 7)
    assert _read(mem, tp, "read_uncommitted") == ([0, 1, 2, 4, 5], 7, 7)
    # A poll that takes exactly the records before a marker leaves the position on it, as
    # kafka-python's iterator; the next poll steps over it and the aborted records.
    consumer = assigned(mem, tp, isolation_level="read_committed")
    batches = [offsets(consumer.poll(timeout_ms=10, max_records=3), tp) for _ in range(3)]
    assert [b for b in batches if b] == [[0, 1, 2]]
    assert consumer.position(tp) == 7
    assert consumer.end_offsets([tp]) == consumer.beginning_offsets([tp]) | {tp: 7}


def test_an_open_transaction_holds_read_committed_readers_back(mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    mem.append("t", None, b"before")
    producer = _producer(mem)
    _in_transaction(producer, "t", [b"open"])
    mem.append("t", None, b"after")  # another writer's, after the open transaction's record
    tp = TopicPartition("t", 0)
    assert mem.last_stable_offset("t", 0) == 1
    assert _read(mem, tp, "read_committed") == ([0], 1, 1)
    assert _read(mem, tp, "read_uncommitted") == ([0, 1, 2], 3, 3)
    latest = assigned(mem, tp, offset=None, isolation_level="read_committed",
                      auto_offset_reset="latest")
    assert latest.position(tp) == 1  # a reset to latest: the last stable offset
    assert latest.end_offsets([tp]) == {tp: 1}
    producer.commit_transaction()
    assert _read(mem, tp, "read_committed") == ([0, 1, 2], 4, 4)


# --- fencing and the transaction timeout ---------------------------------------------------


def test_a_new_producer_of_the_id_fences_the_old_and_aborts_its_transaction(
        mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    old = _producer(mem)
    _in_transaction(old, "t", [b"zombie"])
    new = _producer(mem)
    assert mem.transactions_of("t", 0).aborted == {0}
    assert mem.last_stable_offset("t", 0) == mem.end_offset("t", 0) == 2
    late = old.send("t", value=b"late", partition=0)  # the old one does not know yet
    old.flush()
    assert isinstance(late.exception, ProducerFencedError)
    for call in (old.commit_transaction, old.begin_transaction, old.abort_transaction,
                 lambda: old.send("t", value=b"x")):
        with pytest.raises(KafkaError) as raised:
            call()
        assert fenced(raised.value)  # kafka-python's fatal error state, naming the fence
    _in_transaction(new, "t", [b"new"])
    new.commit_transaction()
    assert _read(mem, TopicPartition("t", 0), "read_committed")[0] == [2]


@pytest.mark.parametrize("end", ["commit_transaction", "abort_transaction"])
def test_a_fenced_producer_learns_it_at_the_end_of_its_transaction(mem: MemoryBroker,
                                                                  end: str) -> None:
    mem.create_topic("t", 1)
    old = _producer(mem)
    _in_transaction(old, "t", [b"zombie"])
    _producer(mem)
    with pytest.raises(ProducerFencedError):
        getattr(old, end)()


def test_a_transaction_open_past_its_timeout_is_aborted_by_the_broker(
        mem: MemoryBroker, clock: Clock) -> None:
    mem.create_topic("t", 1)
    producer = _producer(mem, transaction_timeout_ms=10_000)
    producer.begin_transaction()
    clock.now += 60_000  # begun long ago: the timeout runs from its first partition's record
    producer.send("t", value=b"slow", partition=0).get()
    assert mem.transactions.open_since("tx") == clock.now
    clock.now += 10_000
    assert mem.last_stable_offset("t", 0) == 0  # not past the timeout yet
    clock.now += 1
    assert mem.last_stable_offset("t", 0) == 2  # aborted, as soon as anyone looks
    assert mem.transactions_of("t", 0).aborted == {0}
    with pytest.raises(ProducerFencedError):  # the coordinator bumped the epoch as it aborted
        producer.commit_transaction()
    again = _producer(mem, transaction_timeout_ms=10_000)
    _in_transaction(again, "t", [b"again"])
    again.commit_transaction()
    assert _read(mem, TopicPartition("t", 0), "read_committed")[:2] == ([2], 4)


# --- retention, compaction, deleted records ------------------------------------------------


def test_retention_below_an_open_transaction(mem: MemoryBroker, clock: Clock) -> None:
    mem.create_topic("t", 1, {"retention.ms": "1000"})
    producer = _producer(mem, transaction_timeout_ms=60_000)
    _in_transaction(producer, "t", [b"aborted"])
    producer.abort_transaction()
    _in_transaction(producer, "t", [b"open-1"])  # at 2
    clock.now += 500
    mem.append("t", None, b"young")  # at 3
    clock.now += 600
    assert mem.apply_retention() == 2  # the records older than a second: up to the young one
    txn = mem.transactions_of("t", 0)
    assert (mem.start_offset("t", 0), txn.aborted, txn.markers) == (3, set(), {})
    # The transaction is still open: the last stable offset is the log start, not below it.
    assert mem.last_stable_offset("t", 0) == 3
    assert _read(mem, TopicPartition("t", 0), "read_committed") == ([], 3, 3)
    producer.send("t", value=b"open-2", partition=0)
    producer.commit_transaction()
    assert _read(mem, TopicPartition("t", 0), "read_committed") == ([3, 4], 6, 6)


def test_delete_records_below_an_open_transaction(mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    producer = _producer(mem)
    _in_transaction(producer, "t", [b"a", b"b", b"c"])
    mem.delete_records("t", 0, 2)
    assert (mem.start_offset("t", 0), mem.last_stable_offset("t", 0)) == (2, 2)
    producer.abort_transaction()
    assert mem.transactions_of("t", 0).aborted == {2}
    assert _read(mem, TopicPartition("t", 0), "read_committed") == ([], 4, 4)


def test_compaction_drops_aborted_records_and_stops_at_the_last_stable_offset(
        mem: MemoryBroker) -> None:
    mem.create_topic("t", 1, {"cleanup.policy": "compact"})
    mem.append("t", b"k", b"k-1")  # 0
    producer = _producer(mem)
    producer.begin_transaction()
    producer.send("t", key=b"k", value=b"k-aborted", partition=0).get()  # 1
    producer.abort_transaction()  # marker at 2
    mem.append("t", b"j", b"j-1")  # 3
    producer.begin_transaction()
    producer.send("t", key=b"j", value=b"j-open", partition=0).get()  # 4: open
    mem.append("t", b"j", b"j-2")  # 5: above the last stable offset, not cleaned
    assert mem.compact("t") == 1
    assert [r.value for r in mem.records("t", 0)] == [b"k-1", b"j-1", b"j-open", b"j-2"]
    assert mem.transactions_of("t", 0).aborted == set()
    producer.commit_transaction()  # marker at 6
    assert mem.compact("t") == 2
    assert [r.offset for r in mem.records("t", 0)] == [0, 5]
    assert _read(mem, TopicPartition("t", 0), "read_committed") == ([0, 5], 7, 7)


# --- faults within a transaction -----------------------------------------------------------


def test_a_refused_partition_leaves_the_transaction_only_an_abort(
        mem: MemoryBroker, clock: Clock) -> None:
    mem.create_topic("t", 2)
    producer = _producer(mem)
    producer.begin_transaction()
    mem.refuse_appends("t", 1, clock.now + 1_000_000)
    stored = producer.send("t", value=b"stored", partition=0)
    refused = producer.send("t", value=b"refused", partition=1)
    behind = producer.send("t", value=b"behind", partition=1)
    with pytest.raises(KafkaTimeoutError, match="Expiring"):
        producer.commit_transaction()  # waits out the delivery timeout, then fails
    assert stored.succeeded() and refused.failed() and behind.failed()
    with pytest.raises(KafkaError, match="error state"):
        producer.commit_transaction()
    with pytest.raises(KafkaError, match="failed with errors"):
        producer.send("t", value=b"x", partition=0)
    producer.abort_transaction()
    assert mem.transactions_of("t", 0).aborted == {0}
    assert mem.end_offset("t", 1) == 1  # joined, so it got its marker: written by the broker
    _in_transaction(producer, "t", [b"next"])  # the producer goes on
    producer.commit_transaction()
    assert _read(mem, TopicPartition("t", 0), "read_committed")[0] == [2]


def test_an_in_doubt_record_is_in_the_log_and_aborted_with_its_transaction(
        mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    producer = _producer(mem)
    producer.begin_transaction()
    mem.in_doubt_next(1)
    [lost, behind] = [producer.send("t", value=v, partition=0) for v in (b"in doubt", b"b")]
    producer.flush()
    assert isinstance(lost.exception, KafkaTimeoutError)
    assert isinstance(behind.exception, KafkaTimeoutError)  # failed behind it, not sent
    assert [r.value for r in mem.records("t", 0)] == [b"in doubt"]
    producer.abort_transaction()
    tp = TopicPartition("t", 0)
    assert _read(mem, tp, "read_committed") == ([], 2, 2)
    assert _read(mem, tp, "read_uncommitted")[0] == [0]


def test_abort_drops_what_waits(mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    producer = _producer(mem)
    producer.begin_transaction()
    waiting = producer.send("t", value=b"never sent", partition=0)
    producer.abort_transaction()
    assert isinstance(waiting.exception, TransactionAbortedError)
    assert mem.end_offset("t", 0) == 0


def test_the_end_of_a_transaction_waits_for_a_broker_that_is_down(mem: MemoryBroker) -> None:
    mem.create_topic("t", 1)
    producer = _producer(mem)
    other = make_producer(mem.settings, transactional_id="other")
    _in_transaction(producer, "t", [b"v"])
    mem.down = True
    with pytest.raises(KafkaTimeoutError, match="broker is down"):
        producer.commit_transaction()
    mem.down = False
    producer.commit_transaction()  # tried again: it goes on with the commit under way
    assert _read(mem, TopicPartition("t", 0), "read_committed")[0] == [0]
    mem.down = True
    with pytest.raises(KafkaTimeoutError, match="initializing transactional state"):
        other.init_transactions()
    mem.down = False
    other.init_transactions()  # tried again once the broker is back


def test_a_kill_in_on_append_leaves_the_transaction_open_till_the_next_producer(
        mem: MemoryBroker) -> None:
    class Killed(BaseException):
        pass

    def kill(topic: str, partition: int, record: Any) -> None:
        if record.value == b"second":
            raise Killed

    mem.create_topic("t", 1)
    producer = _producer(mem)
    producer.begin_transaction()
    for value in (b"first", b"second"):
        producer.send("t", value=value, partition=0)
    mem.on_append = kill
    with pytest.raises(Killed):
        producer.flush()
    mem.on_append = None
    assert (mem.end_offset("t", 0), mem.last_stable_offset("t", 0)) == (1, 0)
    _producer(mem)  # the process's successor
    assert _read(mem, TopicPartition("t", 0), "read_committed") == ([], 2, 2)
    consumer = make_consumer(mem.settings)
    assert consumer.config["isolation_level"] == "read_committed"  # txstream's default
