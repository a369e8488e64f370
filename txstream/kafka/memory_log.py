"""The in-memory broker's storage (:mod:`txstream.kafka.memory`): topics of partition logs,
what a fetch of one partition answers at either isolation level (a partition's transactions
are kept by :mod:`txstream.kafka.memory_transactions`), and how a consumer holds the answers."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from txstream.kafka.memory_transactions import PartitionTransactions
from txstream.kafka.protocols import ConsumerRecord, TopicPartition

__all__ = ["CREATE_TIME", "LOG_APPEND_TIME", "DEFAULT_RETENTION_MS", "Headers", "StoredRecord",
           "FetchAnswer", "PartitionLog", "Topic", "record_size", "consumer_record",
           "PartitionState", "HeldAnswer", "Buffered", "FetchRequest"]

CREATE_TIME, LOG_APPEND_TIME = 0, 1
DEFAULT_RETENTION_MS = 7 * 86_400_000  # Kafka's log.retention.hours=168
Headers = tuple[tuple[str, bytes], ...]


class StoredRecord(NamedTuple):
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp: int
    timestamp_type: int  # CREATE_TIME or LOG_APPEND_TIME


class FetchAnswer(NamedTuple):
    """The broker's answer to a fetch of one partition: ``error`` is None, ``"out_of_range"``
    or ``"unknown"`` (no such topic or partition). ``next_offset``: where the answer ends, past
    the markers and aborted records it stepped over (kafka-python's position once it took
    all of it)."""

    error: str | None
    highwater: int
    log_start: int
    records: tuple[StoredRecord, ...]
    last_stable: int
    next_offset: int


def record_size(record: StoredRecord) -> int:
    """Roughly the bytes a record takes in a fetch (for the fetch size limits)."""
    return (70 + len(record.key or b"") + len(record.value or b"")
            + sum(len(k) + len(v) for k, v in record.headers))


def consumer_record(topic: str, partition: int, r: StoredRecord) -> ConsumerRecord:
    """The record as kafka-python's consumer returns it."""
    from kafka.consumer.fetcher import ConsumerRecord as KafkaConsumerRecord

    record: ConsumerRecord = KafkaConsumerRecord(
        topic, partition, 0, r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
        list(r.headers), None, len(r.key) if r.key is not None else -1,
        len(r.value) if r.value is not None else -1,
        sum(len(k.encode()) + len(v) for k, v in r.headers) if r.headers else -1)
    return record


# --- a consumer's state of its fetches (txstream.kafka.memory_consumer) ---------------------


@dataclass
class PartitionState:
    """kafka-python's TopicPartitionState, the part of it that matters here."""

    position: int | None = None
    highwater: int | None = None
    paused: bool = False
    reset: str | None = None  # "earliest"/"latest" while a reset is pending


@dataclass
class HeldAnswer:
    """A fetch answer of one partition as the consumer holds it till it is parsed."""

    tp: TopicPartition
    fetch_offset: int
    answer: FetchAnswer


@dataclass
class Buffered:
    """Records of a parsed answer not yet returned (kafka-python's PartitionRecords)."""

    tp: TopicPartition
    next_offset: int
    records: deque[ConsumerRecord] = field(default_factory=deque)
    exhausted: bool = False
    end: int = 0  # the answer's next offset: past the markers and aborted records it had


@dataclass
class FetchRequest:
    """A fetch in flight: the offsets it was sent at, and its answers as of then."""

    offsets: dict[TopicPartition, int]  # fetch offsets
    answers: list[HeldAnswer]
    sent_at_poll: int


# --- storage -------------------------------------------------------------------------------


class PartitionLog:
    """One partition: its records by offset (gaps after compaction, and where transaction
    markers lie), log start and end, and its transactions (``txn``). The high watermark is
    the end, unless ``held`` below it: a leader with fewer in-sync replicas than
    ``min.insync.replicas`` keeps its high watermark where it was (Kafka 4, KIP-966), and what
    it acknowledged past it is not handed out."""

    def __init__(self) -> None:
        self.records: list[StoredRecord] = []
        self.start = 0
        self.end = 0
        self.held: int | None = None
        self.txn = PartitionTransactions()

    @property
    def high_watermark(self) -> int:
        return self.end if self.held is None else max(self.start, min(self.end, self.held))

    @property
    def last_stable(self) -> int:
        """Where ``read_committed`` readers stop: the first offset of the oldest open
        transaction, else the high watermark."""
        return min(self.stable_end, self.high_watermark)

    @property
    def stable_end(self) -> int:
        """The last stable offset of what is stored, whatever the high watermark held."""
        first = self.txn.first_unstable()
        return self.end if first is None else max(self.start, first)

    def append_marker(self, producer_id: int, commit: bool) -> int:
        """A COMMIT or ABORT marker ending the producer's transaction: it takes an offset."""
        offset = self.end
        self.end += 1
        self.txn.ended(producer_id, offset, commit)
        return offset

    def append(self, key: bytes | None, value: bytes | None, headers: Headers, timestamp: int,
               timestamp_type: int) -> StoredRecord:
        record = StoredRecord(self.end, key, value, headers, timestamp, timestamp_type)
        self.records.append(record)
        self.end += 1
        return record

    def truncate_before(self, offset: int) -> int:
        """Drop the records below ``offset`` (the log start moves there); returns how many."""
        cut = bisect.bisect_left(self.records, offset, key=lambda r: r.offset)
        del self.records[:cut]
        self.start = max(self.start, offset)
        self.txn.prune(self.start)
        return cut

    def expire(self, before_ms: int) -> int:
        """Drop the records from the front with timestamps before ``before_ms``, as Kafka
        deletes old segments from the front (a record is its own segment here)."""
        old = 0
        while old < len(self.records) and self.records[old].timestamp < before_ms:
            old += 1
        if not old:
            return 0
        return self.truncate_before(self.records[old].offset if old < len(self.records)
                                    else self.end)

    def compact(self) -> int:
        """Keep the last record per key (keyless ones stay); returns how many went. As Kafka's
        cleaner: only below the last stable offset, and aborted records go."""
        stable, aborted = self.last_stable, self.txn.aborted
        last = {r.key: r.offset for r in self.records
                if r.key is not None and r.offset < stable and r.offset not in aborted}
        kept = [r for r in self.records if r.offset >= stable or (
            r.offset not in aborted and (r.key is None or last[r.key] == r.offset))]
        dropped = len(self.records) - len(kept)
        self.records = kept
        self.txn.aborted = {o for o in aborted if o >= stable}
        return dropped

    def read(self, offset: int, max_bytes: int, above_end_out_of_range: bool,
             at_least_one: bool = True, committed: bool = False) -> FetchAnswer:
        """Records from ``offset`` on, up to ``max_bytes``; ``at_least_one``: the first record
        comes back even when larger (KIP-74: the first of a fetch's response). ``committed``
        (read_committed): only below the last stable offset, without aborted records (sent
        all the same by Kafka, with the list of aborted transactions the client skips them
        by: they count towards the sizes)."""
        stable = self.last_stable
        if offset < self.start or (offset > self.end and above_end_out_of_range):
            return FetchAnswer("out_of_range", self.high_watermark, self.start, (), stable,
                               offset)
        hw = self.high_watermark
        limit = stable if committed else hw
        hidden = self.txn.aborted if committed else set()
        first = bisect.bisect_left(self.records, offset, key=lambda r: r.offset)
        taken: list[StoredRecord] = []
        size = 0
        covered = max(offset, limit)  # all below the limit, markers too, unless cut short
        for sent, record in enumerate(self.records[first:]):
            if record.offset >= limit:
                break
            size += record_size(record)
            if size > max_bytes and (sent or not at_least_one):
                covered = self.records[first + sent - 1].offset + 1 if sent else offset
                break
            if record.offset not in hidden:
                taken.append(record)
        return FetchAnswer(None, hw, self.start, tuple(taken), stable, covered)


class Topic:
    def __init__(self, name: str, partitions: int, configs: Mapping[str, str], topic_id: str
                 ) -> None:
        self.name = name
        self.configs = {str(k): str(v) for k, v in configs.items()}
        self.logs = [PartitionLog() for _ in range(partitions)]
        self.topic_id = topic_id

    def config(self, name: str, default: str) -> str:
        return self.configs.get(name, default)

    def policy(self) -> set[str]:
        return {p.strip() for p in self.config("cleanup.policy", "delete").split(",")}
