"""The in-memory broker's ``assign()`` consumer: kafka-python 3.0.12's ``KafkaConsumer`` as
txstream uses it, with its fetcher's behaviour (:mod:`txstream.kafka.memory` lists the quirks).

A poll, after kafka-python's ``Fetcher.fetch_records``: (1) a fetch sent by an earlier poll may
have come back (unless ``in_flight_probability``); (2) the answers it holds are drained, each
taken only for a partition still assigned and fetchable whose position is its fetch offset;
(3) unless answers still wait, one fetch goes out for every fetchable partition without
buffered records (one node: one fetch in flight), answered with the log as it is now; (4)
records drained are returned, the fetch just sent staying in flight (the pipelined fetch);
else that fetch may come back now and is drained.

``isolation_level``: a ``read_committed`` consumer is answered below the last stable offset,
without aborted records, and its ``highwater()`` is that offset (as txstream's
``CommittedEndConsumer``); a ``read_uncommitted`` one reads every record to the high watermark.
Neither gets markers, and the position moves past those and the aborted records a fetch
stepped over once its records are all taken, as kafka-python's does.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable
from typing import Any, NoReturn

from txstream.kafka.errors import (
    IllegalStateError,
    NoOffsetForPartitionError,
)
from txstream.kafka.memory import MemoryBroker, UnsupportedByMemoryBroker
from txstream.kafka.memory_fetcher import Fetcher
from txstream.kafka.memory_log import (
    PartitionState,
)
from txstream.kafka.memory_metadata import ClientMetadata, list_offsets
from txstream.kafka.protocols import ConsumerRecord, TopicPartition

__all__ = ["MemoryConsumer"]


class MemoryConsumer(Fetcher):
    """A ``KafkaConsumer`` for ``assign()``, talking to a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker, **configs: Any) -> None:
        from kafka import KafkaConsumer
        from kafka.errors import KafkaConfigurationError

        extra = set(configs) - set(KafkaConsumer.DEFAULT_CONFIG)
        if extra:
            raise KafkaConfigurationError(f"Unrecognized configs: {extra}")
        if configs.get("auto_offset_reset", "latest") not in ("earliest", "latest", "none"):
            raise KafkaConfigurationError("auto_offset_reset must be earliest, latest or none")
        if configs.get("isolation_level", "read_uncommitted") not in ("read_committed",
                                                                      "read_uncommitted"):
            raise KafkaConfigurationError("Unrecognized isolation_level")
        self.config = copy.copy(KafkaConsumer.DEFAULT_CONFIG)
        self.config.update(configs)
        self._committed = self.config["isolation_level"] == "read_committed"
        broker.check_up("bootstrap")
        self._broker = broker
        self._closed = False
        self._assignment: dict[TopicPartition, PartitionState] = {}
        self._user_assignment: set[TopicPartition] = set()
        self._init_fetcher()
        self._polls = 0
        self._metadata = ClientMetadata(broker, self.config["metadata_max_age_ms"],
                                        self.config["allow_auto_create_topics"])
        self._cluster = self._metadata  # where kafka-python's consumer keeps its topic ids
        self._tracked: set[str] = set()  # the assigned topics, whose metadata it asks for

    # --- metadata ----------------------------------------------------------------------------

    def topics(self) -> set[str]:
        self._check_open()
        self._metadata.refresh()
        return set(self._metadata.partitions)

    def partitions_for_topic(self, topic: str) -> set[int]:
        self._check_open()
        return set(range(self._metadata.count(topic) or 0))

    # --- assignment and positions ------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """kafka-python's ``assign_from_user``: the same set changes nothing; a new set keeps
        the state of the partitions it shares with the old one; an empty one unsubscribes."""
        self._check_open()
        partitions = list(partitions)
        if not partitions:
            self.unsubscribe()
            return
        if set(partitions) == self._user_assignment:
            return
        self._user_assignment = set(partitions)
        wanted = set(partitions)
        for tp in list(self._assignment):
            if tp not in wanted:
                del self._assignment[tp]
        for tp in partitions:
            self._assignment.setdefault(tp, PartitionState())
        self._track({tp.topic for tp in partitions})

    def unsubscribe(self) -> None:
        self._user_assignment = set()
        self._assignment.clear()
        self._track(set())

    def _track(self, topics: set[str]) -> None:
        # A new set of tracked topics makes kafka-python ask for metadata at the next poll.
        if topics != self._tracked:
            self._tracked = topics
            self._metadata.forget()

    def assignment(self) -> set[TopicPartition]:
        return set(self._assignment)

    def _state(self, tp: TopicPartition, error: type[Exception] | None = None
               ) -> PartitionState:
        if not isinstance(tp, TopicPartition):
            raise TypeError("partition must be a TopicPartition namedtuple")
        if tp not in self._assignment:
            if error is ValueError:
                raise ValueError("Unassigned partition")
            raise IllegalStateError("Partition is not assigned")
        return self._assignment[tp]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The position only; the high watermark stays what the last fetch said."""
        if not isinstance(partition, TopicPartition):
            raise TypeError("partition must be a TopicPartition namedtuple")
        if not isinstance(offset, int) or offset < 0:
            raise ValueError("Offset must be int >= 0")
        state = self._state(partition, ValueError)
        state.position, state.reset = offset, None

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._reset_to(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._reset_to(partitions, "latest")

    def _reset_to(self, partitions: tuple[TopicPartition, ...], strategy: str) -> None:
        if not partitions and not self._assignment:
            raise ValueError("No partitions are currently assigned")
        for tp in partitions or list(self._assignment):
            state = self._state(tp, ValueError)
            state.position, state.reset = None, strategy

    def position(self, partition: TopicPartition, timeout_ms: int | None = None
                 ) -> int | None:
        """The position, after a pending reset (None if the broker cannot tell)."""
        state = self._state(partition)
        self._reset_positions()
        return state.position

    def highwater(self, partition: TopicPartition) -> int | None:
        return self._state(partition).highwater

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        return list_offsets(self._broker, partitions, True, self._committed)

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
                    ) -> dict[TopicPartition, int]:
        """ListOffsets: the ends, a ``read_committed`` consumer's the last stable offsets."""
        return list_offsets(self._broker, partitions, False, self._committed)

    def forget_fetched(self) -> None:
        """What :func:`txstream.kafka.reading.fetch_ends` does to kafka-python's fetcher: the
        fetch in flight comes back and, with every answer held, is dropped."""
        self._in_flight = None
        self._answers.clear()
        self._buffered = None
        self._parked.clear()

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state(tp).paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, state in self._assignment.items() if state.paused}

    def _reset_positions(self) -> None:
        """Resolve missing positions by ``auto_offset_reset`` (ListOffsets); a partition that
        does not exist, or a broker that is down, leaves them missing."""
        for tp, state in self._assignment.items():
            if state.position is None and state.reset is None:
                if self.config["auto_offset_reset"] == "none":
                    raise NoOffsetForPartitionError({tp})
                state.reset = self.config["auto_offset_reset"]
            if state.reset is None or self._broker.down:
                continue
            offset = self._broker.list_offset(tp.topic, tp.partition, state.reset == "earliest",
                                              self._committed)
            if offset is not None:
                state.position, state.reset = offset, None

    # --- polling -----------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None,
             update_offsets: bool = True) -> dict[TopicPartition, list[ConsumerRecord]]:
        """One round of kafka-python's fetcher; never waits (see the module)."""
        if timeout_ms < 0:
            raise ValueError("Timeout must not be negative")
        max_records = self.config["max_poll_records"] if max_records is None else max_records
        if not isinstance(max_records, int):
            raise TypeError("max_records must be an integer")
        if max_records <= 0:
            raise ValueError("max_records must be positive")
        if self._closed:
            raise IllegalStateError("KafkaConsumer is closed")
        self._polls += 1
        up = not self._broker.down
        if up:
            self._assigned_metadata()
            self._reset_positions()
            self._maybe_complete()
        records, waiting = self._drain(max_records)
        if up and not waiting:
            self._send_fetch()
        if not records and up:
            self._maybe_complete()
            records = self._drain(max_records)[0]
        if not records and self._broker.wait is not None:
            self._broker.wait(timeout_ms)  # nothing came: the poll waited its whole timeout
        return records

    def monotonic(self) -> float:
        if self._broker.wait is None:
            return time.monotonic()
        return self._broker.clock() / 1000

    def _assigned_metadata(self) -> None:
        """kafka-python asks for the assigned topics' metadata (auto-creating them) when the
        assigned topics change, after a fetch found no such partition, and when it is old."""
        if self._metadata.stale():
            self._metadata.refresh(sorted(self._tracked))

    # --- the rest of the consumer's surface --------------------------------------------------

    def close(self, autocommit: bool = True, timeout_ms: int | None = None) -> None:
        self._closed = True
        self._answers.clear()
        self._parked.clear()
        self._buffered = self._in_flight = None

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("KafkaConsumer is closed")

    def __enter__(self) -> MemoryConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # A group member's calls: refused (no consumer groups here).
    def subscribe(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _no_groups("subscribe")

    def subscription(self) -> None:
        return None

    def commit(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _no_groups("commit")

    def commit_async(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _no_groups("commit_async")

    def committed(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise _no_groups("committed")

    def offsets_for_times(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise UnsupportedByMemoryBroker("offsets_for_times: the memory broker has no ListOffsets "
                                        "by time")


def _no_groups(call: str) -> UnsupportedByMemoryBroker:
    return UnsupportedByMemoryBroker(
        f"{call}: the memory broker has no consumer groups; read with assign() and seek()")
