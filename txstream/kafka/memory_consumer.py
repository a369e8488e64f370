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
from collections import deque
from collections.abc import Iterable
from typing import Any, NoReturn

from txstream.kafka.errors import (
    IllegalStateError,
    NoOffsetForPartitionError,
    OffsetOutOfRangeError,
)
from txstream.kafka.memory import MemoryBroker, UnsupportedByMemoryBroker
from txstream.kafka.memory_log import (
    Buffered,
    FetchRequest,
    HeldAnswer,
    PartitionState,
    consumer_record,
    record_size,
)
from txstream.kafka.memory_metadata import ClientMetadata, list_offsets
from txstream.kafka.protocols import ConsumerRecord, TopicPartition

__all__ = ["MemoryConsumer"]


class MemoryConsumer:
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
        self._answers: deque[HeldAnswer] = deque()
        self._buffered: Buffered | None = None
        # Answers and records of paused partitions, set aside until resumed (KAFKA-7548).
        self._parked: dict[TopicPartition, HeldAnswer | Buffered] = {}
        self._in_flight: FetchRequest | None = None
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
        if records or not up:
            return records
        self._maybe_complete()
        return self._drain(max_records)[0]

    def _assigned_metadata(self) -> None:
        """kafka-python asks for the assigned topics' metadata (auto-creating them) when the
        assigned topics change, after a fetch found no such partition, and when it is old."""
        if self._metadata.stale():
            self._metadata.refresh(sorted(self._tracked))

    def _fetchable(self, tp: TopicPartition) -> bool:
        state = self._assignment.get(tp)
        return state is not None and not state.paused and state.position is not None

    def _send_fetch(self) -> None:
        if self._in_flight is not None:
            return
        holding = {a.tp for a in self._answers} | set(self._parked)
        if self._buffered is not None and not self._buffered.exhausted:
            holding.add(self._buffered.tp)
        offsets: dict[TopicPartition, int] = {}
        for tp, state in self._assignment.items():
            known = self._metadata.partitions.get(tp.topic, 0)
            # A partition without a leader (not in the metadata) is not fetched.
            if self._fetchable(tp) and tp not in holding and tp.partition < known:
                assert state.position is not None
                offsets[tp] = state.position
        if offsets:
            self._in_flight = FetchRequest(offsets, self._answer(offsets), self._polls)

    def _answer(self, offsets: dict[TopicPartition, int]) -> list[HeldAnswer]:
        """The broker's answer now: each partition up to ``max_partition_fetch_bytes``, all
        up to ``fetch_max_bytes``, the first record of the response whatever its size."""
        budget = self.config["fetch_max_bytes"]
        limit = self.config["max_partition_fetch_bytes"]
        first = True
        out = []
        for tp, offset in offsets.items():
            answer = self._broker.fetch(tp.topic, tp.partition, offset, min(limit, budget),
                                        first, self._committed)
            budget -= sum(map(record_size, answer.records))
            first = first and not answer.records
            out.append(HeldAnswer(tp, offset, answer))
        return out

    def _maybe_complete(self) -> None:
        """The fetch in flight comes back, unless it is still out (in_flight_probability).
        One sent by an earlier poll answers with the log as it was then, or, as often as
        ``1 - stale_fetch_probability``, as it is now (the broker held it, or it went late)."""
        request = self._in_flight
        rng = self._broker.rng
        if request is None or rng.random() < self._broker.in_flight_probability:
            return
        self._in_flight = None
        answers = request.answers
        if request.sent_at_poll < self._polls and \
                rng.random() >= self._broker.stale_fetch_probability:
            answers = self._answer(request.offsets)
        self._answers.extend(answers)

    def _drain(self, max_records: int
               ) -> tuple[dict[TopicPartition, list[ConsumerRecord]], bool]:
        """kafka-python's ``fetched_records``: (records, whether answers still wait)."""
        self._unpark()
        drained: dict[TopicPartition, list[ConsumerRecord]] = {}
        remaining = max_records
        while remaining > 0:
            buffered = self._buffered
            if buffered is None or buffered.exhausted:
                if not self._answers:
                    break
                answer = self._answers.popleft()
                if self._paused(answer.tp):
                    self._parked[answer.tp] = answer
                else:
                    self._buffered = self._parse(answer)
            elif self._paused(buffered.tp):
                self._parked[buffered.tp], self._buffered = buffered, None
            else:
                remaining -= self._take(drained, buffered, remaining)
        return drained, bool(self._answers)

    def _paused(self, tp: TopicPartition) -> bool:
        state = self._assignment.get(tp)
        return state is not None and state.paused

    def _unpark(self) -> None:
        for tp in [tp for tp in self._parked if not self._paused(tp)]:
            held = self._parked.pop(tp)
            if isinstance(held, HeldAnswer):
                self._answers.append(held)
            elif self._buffered is None or self._buffered.exhausted:
                self._buffered = held
            else:
                self._parked[tp] = held  # the in-line slot is taken: next time

    def _parse(self, answer: HeldAnswer) -> Buffered | None:
        """kafka-python's ``_parse_fetched_data``: an answer counts only for a fetchable
        partition whose position is still the fetch offset."""
        tp, got = answer.tp, answer.answer
        if got.error == "unknown":
            self._metadata.forget()  # no such partition: kafka-python asks for metadata again
        if not self._fetchable(tp):
            return None
        state = self._assignment[tp]
        if got.error is None:
            if state.position != answer.fetch_offset:
                return None
            state.highwater = got.last_stable if self._committed else got.highwater
            return Buffered(tp, answer.fetch_offset, deque(
                consumer_record(tp.topic, tp.partition, r) for r in got.records),
                end=got.next_offset)
        if got.error == "out_of_range" and state.position == answer.fetch_offset:
            if self.config["auto_offset_reset"] == "none":
                raise OffsetOutOfRangeError({tp: answer.fetch_offset})
            state.position, state.reset = None, self.config["auto_offset_reset"]
        self._to_end(tp)
        return None

    def _take(self, drained: dict[TopicPartition, list[ConsumerRecord]], buffered: Buffered,
              count: int) -> int:
        """kafka-python's ``_append``: the buffered records go out only while they continue
        the position; else they are dropped."""
        tp = buffered.tp
        state = self._assignment.get(tp)
        if state is None or not self._fetchable(tp) or state.position != buffered.next_offset:
            buffered.exhausted = True
            return 0
        taken = [buffered.records.popleft() for _ in range(min(count, len(buffered.records)))]
        # kafka-python finds its record iterator exhausted only when asked for more than it has.
        buffered.exhausted = len(taken) < count
        if taken:
            drained.setdefault(tp, []).extend(taken)
            buffered.next_offset = taken[-1].offset + 1
            self._to_end(tp)
        if buffered.exhausted:  # past the markers and aborted records after the last record
            buffered.next_offset = max(buffered.next_offset, buffered.end)
        state.position = buffered.next_offset
        return len(taken)

    def _to_end(self, tp: TopicPartition) -> None:
        """kafka-python moves a partition it drained (or that failed) to the end of the
        assignment's order: the next fetch's order."""
        if tp in self._assignment:
            self._assignment[tp] = self._assignment.pop(tp)

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
