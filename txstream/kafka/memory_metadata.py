"""What clients of the in-memory broker (:mod:`txstream.kafka.memory`) know of it without
fetching: their view of its topics (kafka-python's cluster metadata), and ListOffsets."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from txstream.kafka.errors import KafkaTimeoutError
from txstream.kafka.protocols import TopicPartition

if TYPE_CHECKING:
    from txstream.kafka.memory import MemoryBroker

__all__ = ["ClientMetadata", "list_offsets"]


class ClientMetadata:
    """A client's view of the topics (kafka-python's ClusterMetadata): partition counts as of
    its last metadata request, asked again when forgotten or ``max_age_ms`` old by the
    broker's clock. A request naming topics creates them if ``auto_create`` (the client's
    ``allow_auto_create_topics``) and the broker does."""

    def __init__(self, broker: MemoryBroker, max_age_ms: int, auto_create: bool) -> None:
        self.broker, self.max_age_ms, self.auto_create = broker, max_age_ms, auto_create
        self.partitions: dict[str, int] = {}
        self.ids: dict[str, uuid.UUID] = {}
        self.at: int | None = None

    def stale(self) -> bool:
        return self.at is None or self.broker.clock() - self.at >= self.max_age_ms

    def forget(self) -> None:
        self.at = None

    def refresh(self, named: Iterable[str] = ()) -> None:
        self.broker.check_up("metadata")
        for topic in named if self.auto_create else ():
            self.broker.maybe_auto_create(topic)
        self.partitions = {t: self.broker.partition_count(t) or 0
                           for t in self.broker.topic_names()}
        self.ids = {t: uuid.UUID(self.broker.topic_id(t)) for t in self.partitions}
        self.at = self.broker.clock()

    def topic_id(self, topic: str) -> uuid.UUID | None:
        """As kafka-python's ``ClusterMetadata.topic_id``: as of the last request."""
        return self.ids.get(topic)

    def count(self, topic: str, named: bool = False) -> int | None:
        """``topic``'s partitions, asking the broker if it is unknown or the view old."""
        if topic not in self.partitions or self.stale():
            self.refresh([topic] if named else ())
        return self.partitions.get(topic)


def list_offsets(broker: MemoryBroker, partitions: Iterable[TopicPartition], earliest: bool,
                 committed: bool) -> dict[TopicPartition, int]:
    """kafka-python's ``beginning_offsets``/``end_offsets``: ListOffsets of each partition,
    the end of a ``read_committed`` consumer's the last stable offset. A partition that does
    not exist, or a broker that is down, makes it wait out its timeout, as kafka-python."""
    found: dict[TopicPartition, int] = {}
    for tp in partitions:
        offset = None if broker.down else broker.list_offset(tp.topic, tp.partition, earliest,
                                                             committed)
        if offset is None:
            raise KafkaTimeoutError(f"Failed to get offsets by timestamps: no answer for {tp}")
        found[tp] = offset
    return found
