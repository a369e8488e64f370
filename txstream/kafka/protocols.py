"""The Kafka boundary: what txstream needs of a producer, a consumer, an admin client, their
records and their futures, as Protocols.

:func:`txstream.kafka.make_producer`, ``make_consumer`` and ``make_admin`` return these. Two
kinds of client stand behind them: kafka-python's (``KafkaProducer``, ``KafkaConsumer``,
``KafkaAdminClient``) and the in-memory broker's (:mod:`txstream.kafka.memory_clients`,
:mod:`txstream.kafka.memory_consumer`). kafka-python ships no types, so mypy holds the fakes to
these Protocols and ``tests/kafka/test_kafka_boundary.py`` holds kafka-python's classes to them
(every member there, with these parameters).

kafka-python's small value types (:class:`TopicPartition`, :class:`OffsetAndMetadata`,
:class:`OffsetAndTimestamp`) are its own namedtuples at run time (its consumer checks
``isinstance(tp, TopicPartition)``); mypy sees a NamedTuple of the same fields.

Only the members txstream calls are here. A producer's transactional calls are here too, for
the transactional producer: kafka-python's producer has them, and so has the memory broker's
(but for ``send_offsets_to_transaction``: it has no consumer groups).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

__all__ = [
    "TopicPartition",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "Headers",
    "ConsumerRecord",
    "RecordMetadata",
    "SendFuture",
    "Producer",
    "Consumer",
    "Admin",
    "KafkaClient",
]

if TYPE_CHECKING:
    class TopicPartition(NamedTuple):
        topic: str
        partition: int

    class OffsetAndMetadata(NamedTuple):
        offset: int
        metadata: str
        leader_epoch: int

    class OffsetAndTimestamp(NamedTuple):
        offset: int
        timestamp: int
        leader_epoch: int | None
else:
    from kafka.structs import OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

# A record's headers as a consumer returns them: Kafka allows a header without a value.
Headers = Sequence[tuple[str, bytes | None]]


class ConsumerRecord(Protocol):
    """One record as a consumer returns it (kafka-python's ``ConsumerRecord``)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> Headers: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def timestamp_type(self) -> int: ...


class RecordMetadata(Protocol):
    """Where the broker stored a record a producer sent."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...


class SendFuture(Protocol):
    """A send's outcome (kafka-python's ``FutureRecordMetadata``): ``get`` waits for it."""

    @property
    def is_done(self) -> bool: ...
    @property
    def value(self) -> RecordMetadata | None: ...
    @property
    def exception(self) -> BaseException | None: ...
    def succeeded(self) -> bool: ...
    def failed(self) -> bool: ...
    def get(self, timeout: float | None = None) -> RecordMetadata: ...


class Producer(Protocol):
    """An idempotent, acks=all producer (``make_producer``)."""

    def send(self, topic: str, value: bytes | None = None, key: bytes | None = None,
             headers: list[tuple[str, bytes]] | None = None, partition: int | None = None,
             timestamp_ms: int | None = None) -> SendFuture: ...
    def flush(self, timeout: float | None = None) -> None: ...
    def close(self, timeout: float | None = None) -> None: ...
    def partitions_for(self, topic: str) -> set[int]: ...

    # Kafka transactions, for a producer made with a transactional_id.
    def init_transactions(self) -> None: ...
    def begin_transaction(self) -> None: ...
    def commit_transaction(self) -> None: ...
    def abort_transaction(self) -> None: ...
    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
                                    group_metadata: object) -> None:
        """``group_metadata``: the consumer's ``group_metadata()``, or its group id."""


class Consumer(Protocol):
    """A consumer (``make_consumer``): ``assign()`` with txstream's own offsets, or a group
    member (``subscribe()``, with ``group_id``)."""

    @property
    def config(self) -> dict[str, Any]: ...
    def topics(self) -> set[str]: ...
    def partitions_for_topic(self, topic: str) -> set[int]: ...
    def assign(self, partitions: Sequence[TopicPartition]) -> None: ...
    def assignment(self) -> set[TopicPartition]: ...
    def seek(self, partition: TopicPartition, offset: int) -> None: ...
    def seek_to_beginning(self, *partitions: TopicPartition) -> None: ...
    def position(self, partition: TopicPartition, timeout_ms: int | None = None
                 ) -> int | None: ...
    def highwater(self, partition: TopicPartition) -> int | None: ...
    def poll(self, timeout_ms: int = 0, max_records: int | None = None,
             update_offsets: bool = True) -> dict[TopicPartition, list[ConsumerRecord]]: ...
    def pause(self, *partitions: TopicPartition) -> None: ...
    def resume(self, *partitions: TopicPartition) -> None: ...
    def paused(self) -> set[TopicPartition]: ...
    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None: ...
    # Seconds on the clock its polls wait on: what bounds a wait for the broker (the wall
    # clock; a simulation's virtual time on the in-memory broker).
    def monotonic(self) -> float: ...

    # A group member's calls. ``listener``: kafka-python's (Async)ConsumerRebalanceListener.
    def subscribe(self, topics: Sequence[str] = (), pattern: str | None = None,
                  listener: object | None = None) -> None: ...
    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata] | None = None,
               timeout_ms: int | None = None) -> None: ...
    def commit_async(self, offsets: Mapping[TopicPartition, OffsetAndMetadata] | None = None,
                     callback: Callable[..., object] | None = None) -> Awaitable[object]: ...
    def committed(self, partition: TopicPartition) -> int | None: ...
    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]
                          ) -> Mapping[TopicPartition, OffsetAndTimestamp | None]: ...
    def beginning_offsets(self, partitions: Sequence[TopicPartition],
                          timeout_ms: int | None = None) -> Mapping[TopicPartition, int]: ...


class Admin(Protocol):
    """An admin client (``make_admin``), answering in kafka-python's shapes: lists and dicts
    of the protocol's field names."""

    def list_topics(self) -> list[str]: ...
    def describe_topics(self, topics: Sequence[str] | None = None) -> list[dict[str, Any]]: ...
    def create_topics(self, new_topics: Mapping[str, Mapping[str, Any]],
                      timeout_ms: int | None = None, validate_only: bool = False,
                      raise_errors: bool = True, wait_for_metadata: bool = False
                      ) -> dict[str, Any]: ...
    def delete_topics(self, topics: Sequence[str], timeout_ms: int | None = None,
                      raise_errors: bool = True) -> dict[str, Any]: ...
    def describe_cluster(self) -> dict[str, Any]: ...
    def describe_configs(self, config_resources: Sequence[Any], include_synonyms: bool = False,
                         config_filter: str = "modified") -> dict[str, Any]: ...
    def close(self) -> None: ...


KafkaClient = Producer | Consumer | Admin
