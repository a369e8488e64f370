"""The in-memory consumer's fetcher (a part of :class:`txstream.kafka.memory_consumer.
MemoryConsumer`): kafka-python 3.0.12's ``Fetcher`` as a poll drives it. One fetch in flight,
sent for every fetchable partition without buffered records and answered with the log as it is
when sent (or, if it comes back a poll later, as it is then); answers drained in order, each
taken only while it continues the partition's position; paused partitions' answers parked
until resumed (KAFKA-7548); a drained partition moved to the end of the next fetch's order."""

from __future__ import annotations

from collections import deque
from typing import Any

from txstream.kafka.errors import OffsetOutOfRangeError
from txstream.kafka.memory import MemoryBroker
from txstream.kafka.memory_log import (
    Buffered,
    FetchRequest,
    HeldAnswer,
    PartitionState,
    consumer_record,
    record_size,
)
from txstream.kafka.memory_metadata import ClientMetadata
from txstream.kafka.protocols import ConsumerRecord, TopicPartition

__all__ = ["Fetcher"]


class Fetcher:
    """The fetch pipeline; the consumer gives its broker, configuration, assignment and
    metadata."""

    config: dict[str, Any]
    _broker: MemoryBroker
    _committed: bool
    _assignment: dict[TopicPartition, PartitionState]
    _metadata: ClientMetadata
    _polls: int

    def _init_fetcher(self) -> None:
        self._answers: deque[HeldAnswer] = deque()
        self._buffered: Buffered | None = None
        # Answers and records of paused partitions, set aside until resumed (KAFKA-7548).
        self._parked: dict[TopicPartition, HeldAnswer | Buffered] = {}
        self._in_flight: FetchRequest | None = None

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

