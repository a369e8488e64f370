"""Kafka access for the ``txstream-events`` source: options, cached consumers, reading a slice.

Everything here runs in Spark's Python processes: the planner (high watermarks) on the driver,
``read_slice`` on the workers. Consumers are kept per process, and the reading itself is the
Kafka module's (:class:`txstream.kafka.EndProbe` for the ends,
:class:`txstream.kafka.PatientConsumer` and :func:`txstream.kafka.read_range` for the
records).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark.sql.datasource import InputPartition

from txstream.errors import ConfigError, ReadFailed
from txstream.kafka import (
    Consumer,
    ConsumerRecord,
    EndProbe,
    KafkaSettings,
    PatientConsumer,
    TopicPartition,
    Unreadable,
    read_range,
    topic_ids,
)
from txstream.kafka.errors import KafkaError
from txstream.kafka.reading import MAX_RECORDS_PER_POLL
from txstream.options import parse_options
from txstream.state.keys import KeyLayout
from txstream.topics import END_TOPIC, HALF_TOPIC, validate_topic

log = logging.getLogger(__name__)

__all__ = [
    "ROWS_PER_BATCH",
    "SourceOptions",
    "SourceReadError",
    "RecordsGone",
    "TopicSlice",
    "SliceGroup",
    "Unreadable",
    "consumer_for",
    "drop_consumer",
    "metadata_calls",
    "group_slices",
    "high_watermarks",
    "read_slice",
]

ROWS_PER_BATCH = MAX_RECORDS_PER_POLL  # Arrow batch size handed to Spark; bounds a task's memory
# Bytes per partition per fetch. kafka-python decodes whole fetch responses in Python, so a slice
# ending mid-log (maxOffsetsPerTrigger) pays for every byte fetched past it; 1 MiB read as fast
# as 8 MiB here. A larger record still arrives whole (KIP-74).
FETCH_BYTES = 1 << 20


class SourceReadError(ReadFailed):
    """A partition could not deliver the records it was planned to (broker down, data lost)."""


class RecordsGone(SourceReadError):
    """The broker answers that a slice's records from ``at`` on are not there: its partition
    ends at or before ``at`` (or no longer exists), or, ``recreated``, its topic was deleted
    and created again since the batch was planned. A partition's end can go back for a while
    with nothing lost (a new leader's high watermark): only a topic created again is proof."""

    def __init__(self, message: str, at: int, recreated: bool) -> None:
        super().__init__(message)
        self.at = at
        self.recreated = recreated


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed once (:func:`txstream.options.parse_options`); picklable
    (it travels to the Spark workers)."""

    kafka: KafkaSettings
    half_topic: str = HALF_TOPIC
    end_topic: str = END_TOPIC
    max_offsets_per_trigger: int | None = field(default=None, metadata={"minimum": 1})
    key_layout: KeyLayout = field(default_factory=KeyLayout)
    topic_partitions: int = field(default=2, metadata={"minimum": 1})
    read_timeout_ms: int = field(default=30_000, metadata={"minimum": 1})
    check_crcs: bool = True
    fail_on_data_loss: bool = True
    # How long a partition must end below the checkpoint before that counts as records lost:
    # after a leader election the new leader's high watermark may lag the old one's for a
    # moment (sources.data_loss). A topic created again (its id) counts at once.
    loss_confirm_ms: int = field(default=30_000, metadata={"minimum": 0})
    # Spark tasks per micro-batch (slices are grouped); best: the cores
    read_tasks: int = field(default=2, metadata={"minimum": 1})
    # The coordinator's timer schedule (txstream.timer_schedule): the source ticks when a timer
    # is due. None: no ticks (a query without timers, or with Spark's no-data batches on).
    timer_file: str | None = None
    # The history topic, read back by a new checkpoint over used topics before anything else
    # (sources.journal). None: no recovery (a new checkpoint then reads the topics afresh).
    journal_topic: str | None = None
    # Wait this long before asking the broker once the input has been quiet (sources.idle);
    # 0: ask at every call of Spark's (a simulation, a test of the planner).
    idle_wait_ms: int = field(default=0, metadata={"minimum": 0})

    def __post_init__(self) -> None:
        validate_topic(self.half_topic)
        validate_topic(self.end_topic)
        if self.half_topic == self.end_topic:
            raise ConfigError("half_topic and end_topic must differ")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        if not options.get("kafka"):
            raise ConfigError("option kafka (JSON of KafkaSettings.as_dict()) is required")
        return parse_options(cls, options)

    @property
    def topics(self) -> tuple[str, str]:
        return (self.half_topic, self.end_topic)

    @property
    def client_key(self) -> str:
        return self.kafka.key


@dataclass(frozen=True)
class TopicSlice(InputPartition):
    """One Spark task: the records ``[start, end)`` of one topic-partition; ``kind`` says
    which (``EventKind.HALF``, ``END``, or ``OUTCOME``: the history topic read back)."""

    topic: str
    partition: int
    start: int
    end: int
    kind: int
    # A half topic slice read again by a recovery: its records below this offset may have
    # been read, and released, by a coordinator before this checkpoint (sources.journal).
    again_below: int = 0
    # The topic's id (KIP-516) when the batch was planned: records missing under another id
    # are gone for good; under the same one they may come back (RecordsGone).
    topic_id: str | None = None


@dataclass(frozen=True)
class SliceGroup(InputPartition):
    """One Spark task reading several slices in turn; the first group of a batch also emits
    the batch's progress row (``ends_read``, :mod:`txstream.sources.progress`).

    A task has a fixed cost however little it reads, and one task per topic-partition ran in
    waves when there were more partitions than cores: slices are grouped into as many tasks as
    there are cores (docs/decisions/0012-spark-settings.md).
    """

    slices: tuple[TopicSlice, ...]
    ends_read: int | None = None


def group_slices(slices: list[TopicSlice], tasks: int) -> list[SliceGroup]:
    """``slices`` in at most ``tasks`` groups of about equal size (records to read)."""
    groups: list[list[TopicSlice]] = [[] for _ in range(max(1, min(tasks, len(slices))))]
    sizes = [0] * len(groups)
    for part in sorted(slices, key=lambda s: s.start - s.end):  # biggest first
        emptiest = sizes.index(min(sizes))
        groups[emptiest].append(part)
        sizes[emptiest] += part.end - part.start
    return [SliceGroup(tuple(g)) for g in groups if g]


def _key(options: SourceOptions, purpose: str) -> tuple[str, str]:
    return ("source:" + options.client_key, f"{purpose}:{options.check_crcs}")


def _probe(options: SourceOptions) -> EndProbe:
    return EndProbe(options.kafka, role="source", kept_as=_key(options, "offsets"),
                    check_crcs=options.check_crcs)


def _reader(options: SourceOptions, topic: str) -> PatientConsumer:
    """One reading consumer per topic: kafka-python keeps metadata for the assigned topics
    only, so switching one consumer between the half and the end topic cost a metadata round
    trip and its ~100 ms backoff on every task."""
    return PatientConsumer(options.kafka, role="source", kept_as=_key(options, f"read:{topic}"),
                           max_poll_records=ROWS_PER_BATCH, check_crcs=options.check_crcs,
                           max_partition_fetch_bytes=FETCH_BYTES)


def consumer_for(options: SourceOptions, purpose: str) -> Consumer:
    """The process's consumer for ``purpose``: "offsets", or "read:TOPIC"."""
    if purpose == "offsets":
        return _probe(options).consumer()
    return _reader(options, purpose.removeprefix("read:"))()


def drop_consumer(options: SourceOptions, purpose: str) -> None:
    """Forget a consumer after an error, so the next task starts from a clean client."""
    if purpose == "offsets":
        _probe(options).drop()
    else:
        _reader(options, purpose.removeprefix("read:")).drop()


@contextmanager
def metadata_calls(options: SourceOptions) -> Iterator[None]:
    """A Kafka client error inside (a metadata request timed out) as a SourceReadError that
    names the broker; the offsets consumer is dropped, so the next call starts afresh."""
    try:
        yield
    except KafkaError as exc:
        drop_consumer(options, "offsets")
        raise SourceReadError(f"broker {options.kafka.bootstrap_servers}: the topics' metadata "
                              f"did not come: {type(exc).__name__}: {exc}") from None


def high_watermarks(
    options: SourceOptions,
    partitions: Mapping[str, Sequence[int]],
    hints: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """Every partition's end offset, from one fetch per partition at ``hints`` (~ms)."""
    tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
    try:  # the probe drops its consumer after an error
        return _probe(options).ends(tps, hints, options.read_timeout_ms / 1000)
    except ReadFailed as exc:  # the failure's one line names the broker (docs/operations.md)
        raise SourceReadError(f"broker {options.kafka.bootstrap_servers}: {exc}") from None


def _gone(options: SourceOptions, part: TopicSlice, at: int) -> RecordsGone | None:
    """Why the broker answers that the partition no longer holds offset ``at`` (it does not
    exist, or it ends at or before it, or its topic has another id than when planned); None
    if it holds it, or does not answer (the broker is down, not the records gone)."""
    try:
        ends = high_watermarks(options, {part.topic: [part.partition]}, {})
        with metadata_calls(options):
            consumer = consumer_for(options, "offsets")
            consumer.topics()  # fresh metadata: the ids of a topic created again
            now_id = topic_ids(consumer, [part.topic]).get(part.topic)
    except SourceReadError:
        return None
    recreated = part.topic_id is not None and now_id not in (None, part.topic_id)
    end = ends.get((part.topic, part.partition))
    if not recreated and end is not None and end > at:
        return None
    where = f"{part.topic}/{part.partition}"
    why = (f"{part.topic} was deleted and created again (its id changed from {part.topic_id} "
           f"to {now_id})" if recreated else f"{where} does not exist" if end is None
           else f"{where} ends at {end}, at or before offset {at} of the batch's [{part.start}, "
           f"{part.end})")
    return RecordsGone(why, at, recreated)


def read_slice(options: SourceOptions, part: TopicSlice
               ) -> Iterator[ConsumerRecord | Unreadable]:
    """The records of ``part`` in order (ConsumerRecord, or Unreadable for one kafka-python
    cannot parse); raises SourceReadError if they do not all arrive in time, RecordsGone
    (with ``fail_on_data_loss=false``) if the broker answers that they are not there.
    Whether they are gone for good is the reader's to judge (sources.loss_watch)."""
    reader = _reader(options, part.topic)
    at = part.start
    try:
        for rec in read_range(reader, part.topic, part.partition, part.start, part.end,
                              options.read_timeout_ms / 1000):
            at = rec.offset + 1
            yield rec
    except ReadFailed as exc:
        reader.drop()
        gone = None if options.fail_on_data_loss else _gone(options, part, at)
        if gone is not None:
            raise gone from None
        raise SourceReadError(f"broker {options.kafka.bootstrap_servers}: {exc}") from None
    except Exception as exc:
        reader.drop()
        raise SourceReadError(
            f"{part.topic}/{part.partition}: reading [{part.start}, {part.end}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
