"""Reading Kafka partitions to their end: the one mechanism every reader of txstream uses.

A partition's end is the fetch high watermark (``consumer.highwater`` after a fetch), never
``end_offsets()``: tansu answers ``ListOffsets`` wrongly. ``assign()``, never a group, so no
reader waits for a group join.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

from txstream.errors import ReadFailed
from txstream.kafka.clients import (
    PATIENT_AFTER_S,
    PATIENT_FETCH_WAIT_MS,
    ClientSlot,
    make_consumer,
)
from txstream.kafka.errors import CorruptRecordError, UnsupportedCodecError
from txstream.kafka.memory_consumer import MemoryConsumer
from txstream.kafka.protocols import Consumer, ConsumerRecord, TopicPartition
from txstream.kafka.settings import KafkaSettings

__all__ = ["Unreadable", "EndProbe", "fetch_ends", "partition_ends", "read_range",
           "read_topic", "topic_ids", "TopicReader", "MAX_RECORDS_PER_POLL"]

MAX_RECORDS_PER_POLL = 8192
Position = tuple[str, int]  # (topic, partition)


class Unreadable(NamedTuple):
    """A record kafka-python cannot parse (a header name that is not UTF-8, a bad CRC, a
    compression codec it has no library for)."""

    topic: str
    partition: int
    offset: int
    error: str


def _assign(consumer: Consumer, tps: Sequence[TopicPartition],
            starts: Mapping[Position, int]) -> None:
    # Re-assigning clears each partition's remembered high watermark and position. A fetch
    # kafka-python sent ahead and buffered is still taken when it was made at the offset
    # sought, with the high watermark of its time (read_range).
    consumer.assign([])
    consumer.assign(list(tps))
    for tp in tps:
        consumer.seek(tp, starts.get((tp.topic, tp.partition), 0))


def fetch_ends(consumer: Consumer, tps: Sequence[TopicPartition], starts: Mapping[Position, int],
               timeout_s: float) -> dict[Position, int]:
    """Every partition's end offset, from one fetch per partition at ``starts`` (default 0).
    A partition that does not exist (any more: its topic re-created with fewer) has none.

    Fetching at the last known end makes the broker send (nearly) no records back; a consumer
    made with ``max_partition_fetch_bytes=1`` keeps even that small.
    """
    ends: dict[Position, int] = {}
    pending = list(tps)
    clock = consumer.monotonic
    deadline = clock() + timeout_s
    _forget_fetched(consumer, deadline)
    _assign(consumer, pending, starts)
    polls, started, asked = 0, clock(), False
    real = getattr(consumer, "_fetcher", None) is not None
    while pending:
        if clock() > deadline:
            missing = sorted(f"{tp.topic}/{tp.partition}" for tp in pending)
            raise ReadFailed(f"no high watermark from the broker for {', '.join(missing)} "
                             f"within {timeout_s:g} s")
        try:
            consumer.poll(timeout_ms=1, max_records=1)
            corrupt = False
        except (CorruptRecordError, UnsupportedCodecError):
            # A record we do not even want; its fetch still set the high watermark. But
            # kafka-python would spin forever on that parsed fetch: start the rest afresh.
            corrupt = True
        for tp in pending:
            hw = consumer.highwater(tp)
            if hw is not None:
                ends[(tp.topic, tp.partition)] = hw
        pending = [tp for tp in pending if (tp.topic, tp.partition) not in ends]
        polls += 1
        if pending and not asked and _ask_metadata(polls, clock() - started, real):
            # A partition that has no leader is never fetched: ask the broker what exists.
            asked = True
            pending = _existing(consumer, pending)
        if corrupt and pending:
            _assign(consumer, pending, starts)
    return ends


def _forget_fetched(consumer: Consumer, deadline: float) -> None:
    """Drop every fetch answer the consumer holds or still awaits.

    kafka-python sends the next fetch ahead and keeps its answer; after a re-assign and a seek
    to the offset that fetch was made at, it takes that answer, with the high watermark of its
    time. An end is only true if its fetch was sent after the end was asked for: a kept
    consumer reported ends a whole planning round old. kafka-python has no call for this, so
    its fetcher's buffers are cleared (kafka-python is pinned; the contract tests catch a
    change).
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None:
        cast(MemoryConsumer, consumer).forget_fetched()  # the in-memory broker's consumer
        return
    while fetcher.in_flight_fetches():
        if consumer.monotonic() > deadline:
            raise ReadFailed("a fetch sent earlier is still unanswered; the broker is down")
        time.sleep(0.0005)
    fetcher.close()  # drops the parsed and the paused answers
    fetcher._completed_fetches.clear()
    # And the fetch sessions (KIP-227): in an incremental session Apache Kafka answers only for
    # partitions that changed since its last answer, so a partition fetched again at its end
    # never got a high watermark (every second question timed out). tansu keeps no sessions.
    fetcher._session_handlers.clear()


# Polls without an end before the broker is asked which partitions exist (a round trip). A
# real broker's fetch takes milliseconds: five 1-ms polls asked Apache Kafka for metadata
# (~70 ms) on most reads of a topic written in transactions; it is asked once 100 ms passed.
_POLLS_BEFORE_METADATA = 5
_SECONDS_BEFORE_METADATA = 0.1


def _ask_metadata(polls: int, elapsed_s: float, real: bool) -> bool:
    """Whether to ask now, once: the in-memory broker answers at once, so counting its polls
    keeps the simulation's schedules independent of the wall clock."""
    if not real:
        return polls == _POLLS_BEFORE_METADATA
    return polls >= _POLLS_BEFORE_METADATA and elapsed_s >= _SECONDS_BEFORE_METADATA


def _existing(consumer: Consumer, tps: Sequence[TopicPartition]) -> list[TopicPartition]:
    """The partitions of ``tps`` that the broker's metadata lists now."""
    consumer.topics()  # a fresh metadata request
    return [tp for tp in tps if tp.partition in (consumer.partitions_for_topic(tp.topic) or ())]


class EndProbe:
    """Where partitions end, asked as often as wanted: one offsets-only consumer (this
    probe's own, or the process's, kept under ``kept_as``), and every question answered by
    :func:`fetch_ends`, from a fresh assignment and fetches sent after it was asked, so no
    answer is older than its question. ``options`` go to ``make_consumer``.
    """

    def __init__(self, settings: KafkaSettings, *, role: str | None = None,
                 kept_as: Hashable | None = None, **options: Any) -> None:
        self._settings, self._role = settings, role
        # Fetching at the last known end: the broker sends (nearly) no records back, and
        # max_partition_fetch_bytes=1 keeps even that small.
        self._options = {"fetch_max_wait_ms": 1, "max_partition_fetch_bytes": 1, **options}
        self._slot = ClientSlot(self._make, kept_as)

    def consumer(self) -> Consumer:
        return self._slot.get()

    def _make(self) -> Consumer:
        return make_consumer(self._settings, role=self._role, **self._options)

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        """The partitions of ``topics`` the consumer's metadata lists (none of a topic that
        does not exist)."""
        consumer = self.consumer()
        return [TopicPartition(topic, p) for topic in topics
                for p in sorted(consumer.partitions_for_topic(topic) or ())]

    def ends(self, tps: Sequence[TopicPartition], starts: Mapping[Position, int] | None = None,
             timeout_s: float = 30.0) -> dict[Position, int]:
        """{(topic, partition): end offset} of ``tps`` (see :func:`fetch_ends`), fetched at
        ``starts`` (default 0). After an error the consumer is dropped: the next question
        starts from a new one."""
        if not tps:
            return {}
        try:
            return fetch_ends(self.consumer(), tps, starts or {}, timeout_s)
        except Exception:
            self.drop()
            raise

    def topic_ends(self, topics: Iterable[str], starts: Mapping[Position, int] | None = None,
                   timeout_s: float = 30.0) -> dict[Position, int]:
        """The ends of every partition of ``topics``."""
        try:
            tps = self.partitions(topics)
        except Exception:
            self.drop()
            raise
        return self.ends(tps, starts, timeout_s)

    def drop(self) -> None:
        self._slot.drop()

    def close(self) -> None:
        """Close this probe's own consumer (a kept one stays the process's)."""
        self._slot.close()

    def __enter__(self) -> EndProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def partition_ends(settings: KafkaSettings, topic: str, timeout_s: float = 30.0
                   ) -> dict[int, int]:
    """{partition: end offset} of ``topic`` ({} if it does not exist), by a new consumer."""
    with EndProbe(settings) as probe:
        ends = probe.topic_ends([topic], {}, timeout_s)
    return {partition: end for (_, partition), end in ends.items()}


def topic_ids(consumer: Consumer, topics: Iterable[str]) -> dict[str, str]:
    """The id (KIP-516) of each of ``topics`` as of ``consumer``'s last metadata request. A topic
    deleted and created again has a new id under the same name, and its offsets start over.
    Topics the broker gives no id (Metadata before v10) are left out."""
    # kafka-python keeps the ids only in its cluster metadata; no public call returns them.
    cluster = getattr(consumer, "_cluster", None)
    found = {topic: cluster.topic_id(topic) if cluster is not None else None for topic in topics}
    return {topic: str(tid) for topic, tid in found.items() if tid is not None and tid.int}


ConsumerFor = Callable[[bool], Consumer]  # patient? -> the consumer to read with


def _listed(consumer: Consumer, topic: str, partition: int) -> bool:
    """Whether the consumer's metadata lists the partition (asked of the broker only when the
    consumer knows nothing of the topic)."""
    return partition in consumer.partitions_for_topic(topic)


def read_range(consumer_for: ConsumerFor, topic: str, partition: int, start: int, end: int,
               stall_s: float, stop_at_end: bool = False
               ) -> Iterator[ConsumerRecord | Unreadable]:
    """The records of ``[start, end)`` of one partition in order (ConsumerRecord, or
    :class:`Unreadable` for one kafka-python cannot parse).

    ``consumer_for(patient)`` gives the consumer to read with; once the broker has made no
    progress for ``PATIENT_AFTER_S`` it is asked for a patient one (a broker on slow storage
    answers impatient fetches empty, again and again). Raises :class:`ReadFailed` after
    ``stall_s`` without progress. ``stop_at_end``: a range that reaches past the partition's
    end (its high watermark) ends there, instead of waiting for records that may never come;
    so does one in a partition the consumer's metadata does not list.

    Each read starts from a fresh assignment, yet a kept consumer's end may be older than the
    read: kafka-python takes a fetch it sent ahead and buffered when it was made at ``start``,
    with the high watermark of its time. An offset missing after ``stop_at_end`` is no proof
    that the partition lacks it: confirm with a new consumer.
    """
    tp = TopicPartition(topic, partition)
    consumer = consumer_for(False)
    patient = consumer.config["fetch_max_wait_ms"] >= PATIENT_FETCH_WAIT_MS
    _assign(consumer, [tp], {(topic, partition): start})
    progress_at = consumer.monotonic()
    position = start
    while position < end:
        try:
            # Short polls: a poll that finds nothing fetchable yet (just after seek) sleeps for
            # its whole timeout. max_records: kafka-python parses every record it returns, and
            # a fetch brings back far more than a range that ends mid-log needs.
            batch = consumer.poll(timeout_ms=10,
                                  max_records=min(MAX_RECORDS_PER_POLL, end - position))
        except (CorruptRecordError, UnsupportedCodecError) as exc:
            # kafka-python stops at the bad record with the position on it, forever: skip it,
            # or one bad record stops every reader. It cannot parse the rest of that record
            # batch either, so those offsets come out unreadable too (with their offsets).
            # Seeking past it makes kafka-python drop the failed fetch (3.0.12 loops over it).
            bad = _position(consumer, tp)
            yield Unreadable(topic, partition, bad,
                             f"unreadable record ({type(exc).__name__}: {exc})")
            consumer.seek(tp, bad + 1)
            position, progress_at = bad + 1, consumer.monotonic()
            continue
        for rec in batch.get(tp, ()):
            # Records outside the range (an offset reset after lost data) are another range's,
            # or nobody's: yielding them would duplicate or invent records.
            if start <= rec.offset < end:
                yield rec
        now_at = _position(consumer, tp)
        if stop_at_end and (hw := consumer.highwater(tp)) is not None and now_at >= hw:
            return
        if stop_at_end and now_at == position and not _listed(consumer, topic, partition):
            return  # no leader to fetch from: nothing would ever come
        waited = consumer.monotonic() - progress_at
        if now_at != position:
            position, progress_at = now_at, consumer.monotonic()
        elif not patient and waited > PATIENT_AFTER_S:
            consumer, patient = consumer_for(True), True
            _assign(consumer, [tp], {(topic, partition): position})
        elif waited > stall_s:
            raise ReadFailed(
                f"{topic}/{partition}: stuck at offset {position} while reading [{start}, "
                f"{end}) for {stall_s:.0f} s; the broker is down or lost these records")


def _position(consumer: Consumer, tp: TopicPartition) -> int:
    """The consumer's position in ``tp``, which it has: it was sought there, or read on."""
    position = consumer.position(tp)
    if position is None:  # kafka-python says None only while an offset reset is pending
        raise ReadFailed(f"{tp.topic}/{tp.partition}: the consumer has no position")
    return position


class TopicReader:
    """Reads topics from the beginning (or given offsets) to their current end, then on.

    :meth:`read_new` returns what was added since the last call; partitions that appear later
    (a topic created since) are read from their beginning.
    """

    def __init__(self, settings: KafkaSettings, topics: Iterable[str],
                 starts: Mapping[Position, int] | None = None, **consumer_options: Any) -> None:
        self._consumer = make_consumer(settings, **consumer_options)
        self._topics = list(topics)
        self._starts = dict(starts or {})
        self._tps: list[TopicPartition] = []

    def _discover(self) -> None:
        new = [
            TopicPartition(topic, p)
            for topic in self._topics
            for p in sorted(self._consumer.partitions_for_topic(topic) or ())
            if TopicPartition(topic, p) not in self._tps
        ]
        if not new:
            return
        positions = {tp: _position(self._consumer, tp) for tp in self._tps}
        self._tps.extend(new)
        self._consumer.assign(self._tps)
        for tp, offset in positions.items():
            self._consumer.seek(tp, offset)
        for tp in new:
            self._consumer.seek(tp, self._starts.get((tp.topic, tp.partition), 0))

    def read_new(self, timeout_s: float = 10.0) -> list[ConsumerRecord]:
        """Records added since the last call (all on the first), up to each partition's end,
        or what arrived within ``timeout_s``."""
        self._discover()
        out: list[ConsumerRecord] = []
        done: set[TopicPartition] = set()
        clock = self._consumer.monotonic
        deadline = clock() + timeout_s
        while len(done) < len(self._tps) and clock() < deadline:
            for recs in self._consumer.poll(timeout_ms=200).values():
                out.extend(recs)
            for tp in self._tps:
                hw = self._consumer.highwater(tp)
                if hw is not None and _position(self._consumer, tp) >= hw:
                    done.add(tp)
        return out

    def positions(self) -> dict[Position, int]:
        """Where the reader is in each partition: past the last record read, and past the
        transaction markers after it (which take offsets of their own on Apache Kafka)."""
        return {(tp.topic, tp.partition): _position(self._consumer, tp) for tp in self._tps}

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_topic(settings: KafkaSettings, topic: str, timeout_s: float = 10.0,
               starts: Mapping[int, int] | None = None) -> list[ConsumerRecord]:
    """Every record of ``topic`` (all partitions) up to its current end, by partition and
    offset; ``starts``: {partition: first offset} (default 0)."""
    positions = {(topic, p): o for p, o in (starts or {}).items()}
    with TopicReader(settings, [topic], positions, fetch_max_wait_ms=5,
                     max_poll_records=10_000) as reader:
        records = reader.read_new(timeout_s)
    return sorted(records, key=lambda r: (r.partition, r.offset))
