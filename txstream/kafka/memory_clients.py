"""The in-memory broker's producer and admin client, and how :mod:`txstream.kafka.clients`
makes clients for a ``memory://NAME`` setting (:func:`memory_client`).

The producer is kafka-python 3.0.12's ``KafkaProducer`` as txstream uses it (idempotent,
acks=all, one partition's records in order). A send is checked and placed at once, as
kafka-python does (its errors are raised by ``send``); its record waits in the producer until
``flush()``, a future's ``get()`` or ``close()``, when it is appended (the simulation kills a
process between those, or in ``on_append``). A record that cannot be delivered (broker down,
no such partition) waits; a wait long enough to reach ``delivery_timeout_ms`` since the send,
by the broker's clock (``flush()`` and ``get()`` without a timeout wait that long), expires it
with kafka-python's ``KafkaTimeoutError``; a shorter one raises the timeout and leaves it
waiting.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kafka.future import Future

from txstream.errors import BrokerUnavailable
from txstream.kafka.memory import (
    MEMORY_SCHEME,
    ClientMetadata,
    MemoryBroker,
    StoredRecord,
    UnsupportedByMemoryBroker,
    broker_name,
    lookup,
)
from txstream.kafka.memory_consumer import MemoryConsumer
from txstream.kafka.settings import KafkaSettings

__all__ = ["MemoryProducer", "MemoryAdmin", "RecordFuture", "memory_client", "check_memory_broker"]


def _broker(settings: KafkaSettings) -> MemoryBroker:
    from kafka.errors import KafkaTimeoutError

    broker = lookup(broker_name(settings))
    if broker is None:
        raise KafkaTimeoutError(f"Unable to bootstrap from {settings.bootstrap_servers}: no "
                                "memory broker is registered under that name")
    broker.check_up("bootstrap")
    return broker


def memory_client(settings: KafkaSettings, kind: str, kwargs: dict[str, Any]) -> Any:
    """A client of ``kind`` (producer, consumer, admin) of the memory broker ``settings``
    name, made with kafka-python's keyword arguments (unknown ones are refused alike)."""
    broker = _broker(settings)
    made = {"producer": MemoryProducer, "consumer": MemoryConsumer, "admin": MemoryAdmin}[kind]
    return made(broker, **kwargs)


def check_memory_broker(settings: KafkaSettings) -> None:
    """``wait_for_broker`` for a memory broker: nothing to wait for, it answers or not."""
    try:
        _broker(settings)
    except Exception as exc:
        raise BrokerUnavailable(f"Kafka broker at {settings.bootstrap_servers} unreachable "
                                f"({type(exc).__name__}: {exc})") from None


class RecordFuture(Future):  # type: ignore[misc]
    """kafka-python's ``FutureRecordMetadata``: ``get()`` waits for the record's delivery."""

    def __init__(self, producer: MemoryProducer) -> None:
        super().__init__()
        self._producer = producer

    def get(self, timeout: float | None = None) -> Any:
        if not self.is_done:
            self._producer._deliver(timeout, flushing=False)
        if not self.is_done:
            from kafka.errors import KafkaTimeoutError

            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")
        if self.failed():
            raise self.exception
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


class MemoryProducer:
    """An idempotent, acks=all ``KafkaProducer`` of a :class:`MemoryBroker`. ``clock``: its
    timestamps' clock (``broker.client_clocks[client_id]``, else the broker's)."""

    def __init__(self, broker: MemoryBroker, **configs: Any) -> None:
        from kafka import KafkaProducer

        self.config = copy.copy(KafkaProducer.DEFAULT_CONFIG)
        extra = set(configs) - set(self.config)
        if extra:
            raise ValueError(f"Unrecognized configs: {sorted(extra)}")
        if configs.get("transactional_id"):
            raise UnsupportedByMemoryBroker("the memory broker has no Kafka transactions")
        self.config.update(configs)
        self._broker = broker
        self.clock = broker.client_clocks.get(str(self.config["client_id"]))
        self._metadata = ClientMetadata(broker, self.config["metadata_max_age_ms"],
                                        self.config["allow_auto_create_topics"])
        self._pending: list[_Pending] = []
        self._closed = False

    def partitions_for(self, topic: str) -> set[int]:
        return set(range(self._wait_on_metadata(topic)))

    def _wait_on_metadata(self, topic: str) -> int:
        from kafka.errors import KafkaTimeoutError

        count = self._metadata.count(topic, named=True)
        if not count:
            raise KafkaTimeoutError(
                f"Failed to update metadata after {self.config['max_block_ms'] / 1000:.1f} secs.")
        return count

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> RecordFuture:
        from kafka.errors import IllegalStateError, MessageSizeTooLargeError
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
        clock = self.clock or self._broker.clock
        future = RecordFuture(self)
        self._pending.append(_Pending(
            topic, partition, None if key is None else bytes(key),
            None if value is None else bytes(value), tuple(headers),
            clock() if timestamp_ms is None else timestamp_ms, self._broker.clock(), future))
        return future

    def flush(self, timeout: float | None = None) -> None:
        self._deliver(timeout, flushing=True)

    def _deliver(self, timeout: float | None, flushing: bool) -> None:
        """Append what can be, in order per partition; then expire what waited long enough,
        or raise the timeout of ``flush`` for what still waits."""
        from kafka.errors import KafkaTimeoutError

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
                self._pending.remove(pending)
                pending.future.failure(_expired(pending, limit))

    def _append(self, pending: _Pending) -> bool:
        """Append one waiting record; False if it cannot be delivered now."""
        broker = self._broker
        if broker.down:
            return False
        if self.config["allow_auto_create_topics"]:
            broker.maybe_auto_create(pending.topic)  # its retries ask for metadata again
        if not 0 <= pending.partition < (broker.partition_count(pending.topic) or 0):
            return False
        if broker.refuses(pending.topic, pending.partition):
            return False  # kafka-python retries NOT_ENOUGH_REPLICAS until it expires
        record = broker.stamp(pending.topic, pending.partition, pending.key, pending.value,
                              pending.headers, pending.timestamp)
        acknowledged = broker.client_append(pending.topic, pending.partition, record)
        self._pending.remove(pending)
        if not acknowledged:
            pending.future.failure(_expired(pending, self.config["delivery_timeout_ms"]))
        else:
            pending.future.success(_metadata(pending, record))
        return True

    def close(self, timeout: float | None = None, null_logger: bool = False) -> None:
        """Deliver what waits within ``timeout``; ``timeout=0`` drops it (kafka-python's
        forced close: the futures fail) and raises the flush's timeout, as kafka-python."""
        from kafka.errors import KafkaError, KafkaTimeoutError

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

    def __getattr__(self, name: str) -> Any:
        if name in ("init_transactions", "begin_transaction", "commit_transaction",
                    "abort_transaction", "send_offsets_to_transaction"):
            raise UnsupportedByMemoryBroker(f"{name}: the memory broker has no transactions")
        raise AttributeError(name)


def _expired(pending: _Pending, limit: int) -> Exception:
    from kafka.errors import KafkaTimeoutError

    return KafkaTimeoutError(f"Expiring 1 record(s) for {pending.topic}-{pending.partition}: "
                             f"{limit} ms has passed since batch creation")


def _metadata(pending: _Pending, record: StoredRecord) -> Any:
    from kafka import TopicPartition
    from kafka.producer.future import RecordMetadata

    headers = pending.headers
    return RecordMetadata(
        pending.topic, pending.partition, TopicPartition(pending.topic, pending.partition),
        record.offset, record.timestamp, None,
        len(pending.key) if pending.key is not None else -1,
        len(pending.value) if pending.value is not None else -1,
        sum(len(k.encode()) + len(v) for k, v in headers) if headers else -1)


class MemoryAdmin:
    """kafka-python's ``KafkaAdminClient``, the calls txstream makes, answering in its shapes
    (those tansu gives, where Kafka and tansu differ in detail)."""

    BROKER_ID = 1

    def __init__(self, broker: MemoryBroker, **configs: Any) -> None:
        from kafka import KafkaAdminClient
        from kafka.errors import KafkaConfigurationError

        extra = set(configs) - set(KafkaAdminClient.DEFAULT_CONFIG)
        if extra:
            raise KafkaConfigurationError(f"Unrecognized configs: {extra}")
        self.config = {**KafkaAdminClient.DEFAULT_CONFIG, **configs}
        self._broker = broker
        self._closed = False

    def _up(self) -> MemoryBroker:
        self._broker.check_up("answer to an admin request")
        return self._broker

    def list_topics(self) -> list[str]:
        return self._up().topic_names()

    def describe_topics(self, topics: Sequence[str] | None = None) -> list[dict[str, Any]]:
        broker = self._up()
        return [self._described(broker, name)
                for name in (broker.topic_names() if topics is None else topics)]

    def _described(self, broker: MemoryBroker, name: str) -> dict[str, Any]:
        count = broker.partition_count(name)
        if count is None:
            return {"error_code": 3, "name": name, "topic_id": None, "is_internal": False,
                    "partitions": [], "authorized_operations": None}
        node = self.BROKER_ID
        parts = [{"error_code": 0, "partition_index": p, "leader_id": node, "leader_epoch": 0,
                  "replica_nodes": [node], "isr_nodes": [node], "offline_replicas": []}
                 for p in range(count)]
        return {"error_code": 0, "name": name, "topic_id": broker.topic_id(name),
                "is_internal": False, "partitions": parts, "authorized_operations": None}

    def create_topics(self, new_topics: Mapping[str, Mapping[str, Any]],
                      timeout_ms: int | None = None, validate_only: bool = False,
                      raise_errors: bool = True, wait_for_metadata: bool = False
                      ) -> dict[str, Any]:
        """``new_topics`` as kafka-python's dict form: {name: {num_partitions,
        replication_factor, configs}}."""
        from kafka.errors import for_code

        broker = self._up()
        results = []
        for name, spec in new_topics.items():
            partitions = int(spec.get("num_partitions", -1))
            replication = int(spec.get("replication_factor", -1))
            partitions = broker.default_partitions if partitions == -1 else partitions
            code, message = 0, None
            if broker.partition_count(name) is not None:
                code, message = 36, "Topic with this name already exists."
            elif partitions < 1:
                code, message = 37, "Number of partitions must be larger than 0."
            elif replication not in (-1, 1):
                code, message = 38, "Replication factor must be -1 or 1 (one broker)."
            elif not validate_only:
                broker.create_topic(name, partitions, dict(spec.get("configs") or {}))
            if code and raise_errors:
                raise for_code(code)(message)
            results.append({"name": name, "topic_id": None if code else broker.topic_id(name),
                            "error_code": code, "error_message": message,
                            "topic_config_error_code": 0, "num_partitions": partitions,
                            "replication_factor": 1})
        return {"topics": results}

    def delete_topics(self, topics: Sequence[str], timeout_ms: int | None = None,
                      raise_errors: bool = True) -> dict[str, Any]:
        from kafka.errors import UnknownTopicOrPartitionError

        broker = self._up()
        results = []
        for name in topics:
            present = broker.partition_count(name) is not None
            if present:
                broker.delete_topic(name)
            elif raise_errors:
                raise UnknownTopicOrPartitionError(name)
            results.append({"name": name, "topic_id": None, "error_code": 0 if present else 3,
                            "error_message": None})
        return {"topics": results}

    def describe_cluster(self) -> dict[str, Any]:
        self._up()
        return {"cluster_id": f"memory-{self._broker.name}", "controller_id": self.BROKER_ID,
                "brokers": [{"broker_id": self.BROKER_ID, "host": MEMORY_SCHEME.rstrip(":/"),
                             "port": 0, "rack": None}],
                "authorized_operations": None}

    def describe_configs(self, config_resources: Sequence[Any], include_synonyms: bool = False,
                         config_filter: str = "modified") -> dict[str, Any]:
        """Topics: the configs they were given; the broker: ``auto.create.topics.enable``
        (unless made like tansu, which tells nothing)."""
        from kafka.admin import ConfigResourceType

        broker = self._up()
        out: dict[str, Any] = {}
        for resource in config_resources:
            if resource.resource_type == ConfigResourceType.TOPIC:
                found = (broker.topic_configs(resource.name)
                         if broker.partition_count(resource.name) is not None else {})
                out.setdefault("topic", {})[resource.name] = {
                    k: _config_entry(v) for k, v in found.items()}
            elif resource.resource_type == ConfigResourceType.BROKER:
                told = ({"auto.create.topics.enable": _config_entry(
                    str(broker.auto_create).lower())} if broker.tells_broker_configs else {})
                out.setdefault("broker", {})[str(resource.name)] = told
            else:
                raise UnsupportedByMemoryBroker(f"describe_configs of {resource.resource_type}")
        return out

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> MemoryAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _config_entry(value: str) -> dict[str, Any]:
    return {"value": value, "read_only": False, "config_source": "DEFAULT_CONFIG",
            "is_sensitive": False, "synonyms": [], "config_type": "STRING",
            "documentation": ""}
