"""The in-memory broker's producer, and how :mod:`txstream.kafka.clients` makes clients for a
``memory://NAME`` setting (:func:`memory_producer`, :func:`memory_consumer`,
:func:`memory_admin`), each the :mod:`txstream.kafka.protocols` Protocol of its kind.

The producer is kafka-python 3.0.12's ``KafkaProducer`` as txstream uses it (idempotent,
acks=all, one partition's records in order). A send is checked and placed at once, as
kafka-python does (its errors are raised by ``send``); its record waits in the producer until
``flush()``, a future's ``get()`` or ``close()``, when it is appended (the simulation kills a
process between those, or in ``on_append``). A record that cannot be delivered (broker down,
no such partition) waits; a wait long enough to reach ``delivery_timeout_ms`` since the send,
by the broker's clock (``flush()`` and ``get()`` without a timeout wait that long), expires it
with kafka-python's ``KafkaTimeoutError``; a shorter one raises the timeout and leaves it
waiting.

With a ``transactional_id`` it is kafka-python's transactional producer
(:mod:`txstream.kafka.memory_transactions`): ``init_transactions()`` fences the id's earlier
producer and aborts what it left open; a send needs ``begin_transaction()``; a partition joins
the transaction when its first record is delivered; ``commit_transaction()`` delivers what
waits, then has the broker write a COMMIT marker to each partition; ``abort_transaction()``
drops what waits (``TransactionAbortedError``) and has ABORT markers written. A record that
fails (expired, in doubt) leaves the producer able only to abort, and fails what waits behind
it; one refused because the producer was fenced fails it for good (``ProducerFencedError``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from txstream.errors import BrokerUnavailable
from txstream.kafka.errors import (
    IllegalStateError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    ProducerFencedError,
    TransactionAbortedError,
)
from txstream.kafka.memory import (
    ClientMetadata,
    MemoryBroker,
    StoredRecord,
    UnsupportedByMemoryBroker,
)
from txstream.kafka.memory_admin import MemoryAdmin
from txstream.kafka.memory_consumer import MemoryConsumer
from txstream.kafka.memory_registry import broker_name, lookup
from txstream.kafka.memory_transactions import ProducerToken, TransactionManager
from txstream.kafka.protocols import (
    Admin,
    Consumer,
    OffsetAndMetadata,
    Producer,
    RecordMetadata,
    TopicPartition,
)
from txstream.kafka.settings import KafkaSettings

__all__ = ["MemoryProducer", "RecordFuture", "MemoryClients", "memory_producer",
           "memory_consumer", "memory_admin", "check_memory_broker"]


def _broker(settings: KafkaSettings) -> MemoryBroker:
    broker = lookup(broker_name(settings))
    if broker is None:
        raise KafkaTimeoutError(f"Unable to bootstrap from {settings.bootstrap_servers}: no "
                                "memory broker is registered under that name")
    broker.check_up("bootstrap")
    return broker


# Each a client of the memory broker ``settings`` name, made with kafka-python's keyword
# arguments (unknown ones are refused alike). Their return types hold the fakes to the Protocols.
def memory_producer(settings: KafkaSettings, kwargs: dict[str, Any]) -> Producer:
    return MemoryProducer(_broker(settings), **kwargs)


def memory_consumer(settings: KafkaSettings, kwargs: dict[str, Any]) -> Consumer:
    return MemoryConsumer(_broker(settings), **kwargs)


def memory_admin(settings: KafkaSettings, kwargs: dict[str, Any]) -> Admin:
    return MemoryAdmin(_broker(settings), **kwargs)


def check_memory_broker(settings: KafkaSettings) -> None:
    """``wait_for_broker`` for a memory broker: nothing to wait for, it answers or not."""
    try:
        _broker(settings)
    except Exception as exc:
        raise BrokerUnavailable(f"Kafka broker at {settings.bootstrap_servers} unreachable "
                                f"({type(exc).__name__}: {exc})") from None


class MemoryClients:
    """The :class:`txstream.kafka.clients.ClientFactory` of ``memory://NAME`` settings, plugged
    in by :func:`txstream.kafka.memory_registry.register`."""

    def producer(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Producer:
        return memory_producer(settings, kwargs)

    def consumer(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Consumer:
        return memory_consumer(settings, kwargs)

    def admin(self, settings: KafkaSettings, kwargs: dict[str, Any]) -> Admin:
        return memory_admin(settings, kwargs)

    def wait(self, settings: KafkaSettings) -> None:
        check_memory_broker(settings)


class RecordFuture:
    """kafka-python's ``FutureRecordMetadata`` (a :class:`~txstream.kafka.protocols.SendFuture`):
    ``get()`` waits for the record's delivery."""

    def __init__(self, producer: MemoryProducer) -> None:
        self._producer = producer
        self.is_done = False
        self.value: RecordMetadata | None = None
        self.exception: BaseException | None = None

    def succeeded(self) -> bool:
        return self.is_done and self.exception is None

    def failed(self) -> bool:
        return self.is_done and self.exception is not None

    def success(self, value: RecordMetadata) -> None:
        self.value, self.is_done = value, True

    def failure(self, exception: BaseException) -> None:
        self.exception, self.is_done = exception, True

    def get(self, timeout: float | None = None) -> RecordMetadata:
        if not self.is_done:
            self._producer._deliver(timeout, flushing=False)
        if not self.is_done:
            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")
        if self.exception is not None:
            raise self.exception
        assert self.value is not None  # done without an exception: success() set it
        return self.value


@dataclass
class _Pending:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int
    sent_at: int  # the broker's clock, for delivery_timeout_ms
    future: RecordFuture
    producer: ProducerToken | None  # its transaction's producer


class MemoryProducer:
    """An idempotent, acks=all ``KafkaProducer`` of a :class:`MemoryBroker`. ``clock``: its
    timestamps' clock (``broker.client_clocks[client_id]``, else the broker's)."""

    # It appends on the caller's thread: a flush knows its outcome at once and never stalls,
    # so watching one in wall-clock slices (txstream.sinks.delivery) would only wait for real.
    flushes_in_background = False

    def __init__(self, broker: MemoryBroker, **configs: Any) -> None:
        from kafka import KafkaProducer

        self.config = copy.copy(KafkaProducer.DEFAULT_CONFIG)
        extra = set(configs) - set(self.config)
        if extra:
            raise ValueError(f"Unrecognized configs: {sorted(extra)}")
        self.config.update(configs)
        self._txn = TransactionManager.configured(self.config, configs)
        self._broker = broker
        self.clock = broker.client_clocks.get(str(self.config["client_id"]))
        self._metadata = ClientMetadata(broker, self.config["metadata_max_age_ms"],
                                        self.config["allow_auto_create_topics"])
        self._pending: list[_Pending] = []
        self._closed = False

    def partitions_for(self, topic: str) -> set[int]:
        return set(range(self._wait_on_metadata(topic)))

    def _wait_on_metadata(self, topic: str) -> int:
        count = self._metadata.count(topic, named=True)
        if not count:
            raise KafkaTimeoutError(
                f"Failed to update metadata after {self.config['max_block_ms'] / 1000:.1f} secs.")
        return count

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> RecordFuture:
        from kafka.record.default_records import DefaultRecordBatchBuilder

        if self._closed:
            raise IllegalStateError("KafkaProducer already closed!")
        if value is None and key is None:
            raise ValueError("Need at least one: key or value")
        headers = [] if headers is None else headers
        if not isinstance(headers, list):
            raise TypeError("headers must be list-type")
        if not all(isinstance(h, tuple) and len(h) == 2 and isinstance(h[0], str)
                   and isinstance(h[1], bytes) for h in headers):
            raise TypeError("All headers items must be (str, bytes) tuples")
        for name, data in (("key", key), ("value", value)):
            if type(data) not in (bytes, bytearray, memoryview, type(None)):
                raise TypeError(f"Unsupported type for serialized {name}: {type(data)}")
        count = self._wait_on_metadata(topic)
        if partition is None:
            partition = self._broker.choose_partition(topic, key, count)
        elif not 0 <= partition < count:
            raise ValueError(f"Unrecognized partition {partition} for topic {topic}")
        size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
        if size > self.config["max_request_size"]:
            raise MessageSizeTooLargeError(
                f"The message is {size} bytes when serialized which is larger than the maximum "
                "request size you have configured with the max_request_size configuration")
        producer = self._txn.check_send() if self._txn is not None else None
        clock = self.clock or self._broker.clock
        future = RecordFuture(self)
        self._pending.append(_Pending(
            topic, partition, None if key is None else bytes(key),
            None if value is None else bytes(value), tuple(headers),
            clock() if timestamp_ms is None else timestamp_ms, self._broker.clock(), future,
            producer))
        return future

    def flush(self, timeout: float | None = None) -> None:
        self._deliver(timeout, flushing=True)

    def _deliver(self, timeout: float | None, flushing: bool) -> None:
        """Append what can be, in order per partition; then expire what waited long enough,
        or raise the timeout of ``flush`` for what still waits."""
        self._expire(0)  # kafka-python's sender expired them while they waited
        blocked: set[tuple[str, int]] = set()
        for pending in list(self._pending):
            where = (pending.topic, pending.partition)
            if where not in blocked and not self._append(pending):
                blocked.add(where)  # later records of the partition wait behind it
        self._expire(None if timeout is None else timeout * 1000)
        if self._pending and flushing:
            raise KafkaTimeoutError("Timeout waiting for future")

    def _expire(self, wait_ms: float | None) -> None:
        """Fail the waiting records whose delivery timeout ends within ``wait_ms`` (None: any
        wait, as long as it takes)."""
        now = self._broker.clock()
        limit = self.config["delivery_timeout_ms"]
        for pending in list(self._pending):
            if wait_ms is None or wait_ms >= limit - (now - pending.sent_at):
                self._fail(pending, _expired(pending, limit))

    def _fail(self, pending: _Pending, exc: BaseException) -> None:
        """A waiting record fails; in a transaction, the transaction with it (kafka-python
        then fails what waits behind it with the same error)."""
        self._pending.remove(pending)
        pending.future.failure(exc)
        if pending.producer is not None and self._txn is not None:
            self._txn.failed(exc)

    def _append(self, pending: _Pending) -> bool:
        """Append one waiting record; False if it cannot be delivered now."""
        broker = self._broker
        if self._txn is not None and self._txn.has_error():
            self._fail(pending, self._txn.last_error or TransactionAbortedError())
            return True
        if broker.down:
            return False
        if self.config["allow_auto_create_topics"]:
            broker.maybe_auto_create(pending.topic)  # its retries ask for metadata again
        if not 0 <= pending.partition < (broker.partition_count(pending.topic) or 0):
            return False
        if pending.producer is not None and not self._joined(pending):
            return True
        if broker.refuses(pending.topic, pending.partition):
            return False  # kafka-python retries NOT_ENOUGH_REPLICAS until it expires
        record = broker.stamp(pending.topic, pending.partition, pending.key, pending.value,
                              pending.headers, pending.timestamp)
        try:
            acknowledged = broker.client_append(pending.topic, pending.partition, record,
                                                pending.producer)
        except ProducerFencedError as exc:
            self._fail(pending, exc)
            return True
        if not acknowledged:
            self._fail(pending, _expired(pending, self.config["delivery_timeout_ms"]))
        else:
            self._pending.remove(pending)
            pending.future.success(_metadata(pending, record))
        return True

    def _joined(self, pending: _Pending) -> bool:
        """AddPartitionsToTxn before the partition's records; False (the record failed) if
        the producer was fenced."""
        assert pending.producer is not None and self._txn is not None
        try:
            self._broker.join_transaction(pending.producer, pending.topic, pending.partition)
        except ProducerFencedError as exc:
            self._fail(pending, exc)
            return False
        self._txn.started = True
        return True

    def close(self, timeout: float | None = None, null_logger: bool = False) -> None:
        """Deliver what waits within ``timeout``; ``timeout=0`` drops it (kafka-python's
        forced close: the futures fail) and raises the flush's timeout, as kafka-python."""
        if self._closed:
            return
        if timeout != 0:
            self._deliver(timeout, flushing=True)
        self._closed = True
        dropped, self._pending = self._pending, []
        for pending in dropped:
            pending.future.failure(KafkaError("Producer is closed forcefully."))
        if dropped:
            raise KafkaTimeoutError("Timeout waiting for future")

    # --- Kafka transactions (memory_transactions.TransactionManager) -------------------------

    def _transactional(self, error: str) -> TransactionManager:
        if self._txn is None:
            raise IllegalStateError(error)
        return self._txn

    def init_transactions(self) -> None:
        """InitProducerId: fences the id's earlier producer, aborts what it left open."""
        self._transactional("Cannot call init_transactions without setting a "
                            "transactional_id.").init(self._broker, self.config["max_block_ms"])

    def begin_transaction(self) -> None:
        self._transactional("Cannot use transactional methods without enabling "
                            "transactions").begin()

    def commit_transaction(self) -> None:
        """Deliver what waits (as long as that takes), then EndTxn: COMMIT markers. A record
        that failed fails the commit with its error: only an abort may follow."""
        txn = self._transactional("Cannot commit transaction since transactions are not "
                                  "enabled")
        txn.begin_commit()
        self._deliver(None, flushing=False)
        txn.end(self._broker, commit=True)

    def abort_transaction(self) -> None:
        """Drop what waits, then EndTxn: ABORT markers (the records stay in the log, aborted)."""
        txn = self._transactional("Cannot abort transaction since transactions are not "
                                  "enabled.")
        txn.begin_abort()
        for pending in list(self._pending):
            self._fail(pending, TransactionAbortedError())
        txn.end(self._broker, commit=False)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                                    group_metadata: object) -> None:
        raise UnsupportedByMemoryBroker("send_offsets_to_transaction: the memory broker has "
                                        "no consumer groups")


def _expired(pending: _Pending, limit: int) -> Exception:
    return KafkaTimeoutError(f"Expiring 1 record(s) for {pending.topic}-{pending.partition}: "
                             f"{limit} ms has passed since batch creation")


def _metadata(pending: _Pending, record: StoredRecord) -> RecordMetadata:
    from kafka.producer.future import RecordMetadata as KafkaRecordMetadata

    headers = pending.headers
    metadata: RecordMetadata = KafkaRecordMetadata(
        pending.topic, pending.partition, TopicPartition(pending.topic, pending.partition),
        record.offset, record.timestamp, None,
        len(pending.key) if pending.key is not None else -1,
        len(pending.value) if pending.value is not None else -1,
        sum(len(k.encode()) + len(v) for k, v in headers) if headers else -1)
    return metadata
