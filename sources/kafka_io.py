"""Kafka access for the ``txstream-events`` source: options, cached consumers, reading a slice.

Everything here runs in Spark's Python processes: the planner (high watermarks) on the driver,
``read_slice`` on the workers. Clients are cached per process because Spark reuses its Python
workers (``spark.python.worker.reuse``): connecting costs more than reading a micro-batch.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pyspark.sql.datasource import InputPartition

from state.keys import KeyLayout
from txstream.errors import ConfigError, TxStreamError
from txstream.kafka import PATIENT_AFTER_S, PATIENT_FETCH_WAIT_MS, KafkaSettings, make_consumer
from txstream.topics import END_TOPIC, HALF_TOPIC, validate_topic

__all__ = [
    "ROWS_PER_BATCH",
    "SourceOptions",
    "SourceReadError",
    "TopicSlice",
    "SliceGroup",
    "Unreadable",
    "consumer_for",
    "drop_consumer",
    "group_slices",
    "high_watermarks",
    "read_slice",
]

ROWS_PER_BATCH = 8192  # Arrow batch size handed to Spark; bounds a task's memory per step
# Bytes per partition per fetch. kafka-python decodes whole fetch responses in Python, so a slice
# ending mid-log (maxOffsetsPerTrigger) pays for every byte fetched past it; 1 MiB read as fast
# as 8 MiB here. A larger record still arrives whole (KIP-74).
FETCH_BYTES = 1 << 20


class SourceReadError(TxStreamError, RuntimeError):
    """A partition could not deliver the records it was planned to (broker down, data lost)."""


def _bool(text: str | None, default: bool) -> bool:
    if text is None:
        return default
    return str(text).strip().lower() in ("1", "true", "yes", "on")


def _int(options: Mapping[str, str], name: str, default: int | None, minimum: int) -> int | None:
    text = options.get(name)
    if text is None or str(text).strip() == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name} must be at least {minimum}, got {value}")
    return value


def _layout(text: str | None) -> KeyLayout:
    if not text:
        return KeyLayout()
    try:
        return KeyLayout(**json.loads(text))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"option key_layout is not KeyLayout JSON: {exc}") from None


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed once; picklable (it travels to the Spark workers)."""

    kafka: KafkaSettings
    half_topic: str = HALF_TOPIC
    end_topic: str = END_TOPIC
    max_offsets_per_trigger: int | None = None
    key_layout: KeyLayout = field(default_factory=KeyLayout)
    topic_partitions: int = 2
    read_timeout_ms: int = 30_000
    check_crcs: bool = True
    fail_on_data_loss: bool = True
    read_tasks: int = 2  # Spark tasks per micro-batch (slices are grouped); best: the cores
    # The coordinator's timer schedule (txstream.timer_schedule): the source ticks when a timer
    # is due. None: no ticks (a query without timers, or with Spark's no-data batches on).
    timer_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        kafka = KafkaSettings.from_option(options.get("kafka"))
        half = validate_topic(options.get("half_topic") or HALF_TOPIC)
        end = validate_topic(options.get("end_topic") or END_TOPIC)
        if half == end:
            raise ConfigError("half_topic and end_topic must differ")
        return cls(
            kafka=kafka,
            half_topic=half,
            end_topic=end,
            max_offsets_per_trigger=_int(options, "max_offsets_per_trigger", None, 1),
            key_layout=_layout(options.get("key_layout")),
            topic_partitions=_int(options, "topic_partitions", 2, 1) or 2,
            read_timeout_ms=_int(options, "read_timeout_ms", 30_000, 1) or 30_000,
            check_crcs=_bool(options.get("check_crcs"), True),
            fail_on_data_loss=_bool(options.get("fail_on_data_loss"), True),
            read_tasks=_int(options, "read_tasks", 2, 1) or 2,
            timer_file=options.get("timer_file") or None,
        )

    @property
    def topics(self) -> tuple[str, str]:
        return (self.half_topic, self.end_topic)

    @property
    def client_key(self) -> str:
        return json.dumps(self.kafka.as_dict(), sort_keys=True, default=str)


@dataclass(frozen=True)
class TopicSlice(InputPartition):
    """One Spark task: the records ``[start, end)`` of one topic-partition."""

    topic: str
    partition: int
    start: int
    end: int
    is_half: bool


@dataclass(frozen=True)
class SliceGroup(InputPartition):
    """One Spark task reading several slices in turn.

    A task costs a fixed ~80 ms here however little it reads; one task per topic-partition
    (4 by default: 2 half, 2 end) ran in two waves on 2 cores, so slices are grouped into as
    many tasks as there are cores.
    """

    slices: tuple[TopicSlice, ...]


def group_slices(slices: list[TopicSlice], tasks: int) -> list[SliceGroup]:
    """``slices`` in at most ``tasks`` groups of about equal size (records to read)."""
    groups: list[list[TopicSlice]] = [[] for _ in range(max(1, min(tasks, len(slices))))]
    sizes = [0] * len(groups)
    for part in sorted(slices, key=lambda s: s.start - s.end):  # biggest first
        emptiest = sizes.index(min(sizes))
        groups[emptiest].append(part)
        sizes[emptiest] += part.end - part.start
    return [SliceGroup(tuple(g)) for g in groups if g]


_CLIENTS: dict[tuple[str, str], Any] = {}
_CLIENTS_LOCK = threading.Lock()
_PATIENT: set[tuple[str, str]] = set()  # readers that met slow storage: PATIENT_AFTER_S


def consumer_for(options: SourceOptions, purpose: str) -> Any:
    """The process's consumer for ``purpose``: "offsets", or "read:TOPIC".

    One reading consumer per topic: kafka-python keeps metadata for the assigned topics only,
    so switching one consumer between the half and the end topic cost a metadata round trip
    and its ~100 ms backoff on every task.
    """
    key = (options.client_key, f"{purpose}:{options.check_crcs}")
    with _CLIENTS_LOCK:
        consumer = _CLIENTS.get(key)
        if consumer is None:
            # The broker answers at once when a fetch is at the end of the log instead of
            # holding it for the default 500 ms: planning and short reads stay fast. (0 made
            # kafka-python 3.0.12 hang in poll.)
            wait_ms = 1 if purpose == "offsets" else 5
            consumer = make_consumer(
                options.kafka,
                fetch_max_wait_ms=PATIENT_FETCH_WAIT_MS if key in _PATIENT else wait_ms,
                max_poll_records=ROWS_PER_BATCH,
                check_crcs=options.check_crcs,
                # Offsets-only fetches want the high watermark, not the data behind it.
                max_partition_fetch_bytes=1 if purpose == "offsets" else FETCH_BYTES,
            )
            _CLIENTS[key] = consumer
        return consumer


def drop_consumer(options: SourceOptions, purpose: str, patient: bool = False) -> None:
    """Forget a consumer after an error, so the next task starts from a clean client (one
    that waits patiently for its fetches, if ``patient``)."""
    key = (options.client_key, f"{purpose}:{options.check_crcs}")
    with _CLIENTS_LOCK:
        consumer = _CLIENTS.pop(key, None)
        if patient:
            _PATIENT.add(key)
    if consumer is not None:
        try:
            consumer.close()
        except Exception:  # already broken: closing is best effort
            pass


def _assign(consumer: Any, tps: Sequence[Any], hints: Mapping[tuple[str, int], int]) -> None:
    # Re-assigning clears each partition's remembered high watermark (and any parsed fetch),
    # so what is read afterwards comes from a new fetch.
    consumer.assign([])
    consumer.assign(list(tps))
    for tp in tps:
        consumer.seek(tp, hints.get((tp.topic, tp.partition), 0))


def high_watermarks(
    options: SourceOptions,
    partitions: Mapping[str, Sequence[int]],
    hints: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], int]:
    """Every partition's end offset, from one fetch per partition at ``hints`` (~ms).

    The fetch high watermark, because tansu answers ``ListOffsets`` wrongly. Fetching at the
    last known end makes the broker send (nearly) no records back.
    """
    from kafka import TopicPartition
    from kafka.errors import CorruptRecordError

    tps = [TopicPartition(t, p) for t, ps in partitions.items() for p in ps]
    consumer = consumer_for(options, "offsets")
    ends: dict[tuple[str, int], int] = {}
    try:
        pending = tps
        _assign(consumer, pending, hints)
        deadline = time.monotonic() + options.read_timeout_ms / 1000
        while pending:
            if time.monotonic() > deadline:
                missing = sorted(f"{tp.topic}/{tp.partition}" for tp in pending)
                raise SourceReadError(
                    f"no high watermark from the broker for {', '.join(missing)} within "
                    f"{options.read_timeout_ms} ms"
                )
            try:
                consumer.poll(timeout_ms=1, max_records=1)
                corrupt = False
            except CorruptRecordError:
                # A record we do not even want; its fetch still set the high watermark. But
                # kafka-python would spin forever on that parsed fetch: start the rest afresh.
                corrupt = True
            for tp in pending:
                hw = consumer.highwater(tp)
                if hw is not None:
                    ends[(tp.topic, tp.partition)] = hw
            pending = [tp for tp in pending if (tp.topic, tp.partition) not in ends]
            if corrupt and pending:
                _assign(consumer, pending, hints)
    except Exception:
        drop_consumer(options, "offsets")
        raise
    return ends


class Unreadable(NamedTuple):
    """A record kafka-python cannot parse (a header name that is not UTF-8, a bad CRC)."""

    topic: str
    partition: int
    offset: int
    error: str


def read_slice(options: SourceOptions, part: TopicSlice) -> Iterator[Any]:
    """The records of ``part`` in order (ConsumerRecord, or Unreadable for one kafka-python
    cannot parse); raises SourceReadError if they do not all arrive in time."""
    from kafka import TopicPartition
    from kafka.errors import CorruptRecordError

    tp = TopicPartition(part.topic, part.partition)
    purpose = f"read:{part.topic}"
    consumer = consumer_for(options, purpose)
    patient = consumer.config["fetch_max_wait_ms"] >= PATIENT_FETCH_WAIT_MS
    stall_s = options.read_timeout_ms / 1000
    try:
        consumer.assign([tp])
        consumer.seek(tp, part.start)
        progress_at = time.monotonic()
        position = part.start
        while position < part.end:
            try:
                # Short polls: a poll that finds nothing fetchable yet (just after seek) sleeps
                # for its whole timeout, up to retry_backoff_ms, before looking again.
                # max_records: kafka-python parses every record it returns, and a fetch brings
                # back far more than a slice that ends mid-log needs.
                batch = consumer.poll(timeout_ms=10,
                                      max_records=min(ROWS_PER_BATCH, part.end - position))
            except CorruptRecordError as exc:
                # kafka-python stops at the bad record with the position on it, forever: skip
                # it, or one bad record stops the coordinator. It cannot parse the rest of that
                # record batch either, so those offsets come out unreadable too (and go to the
                # dead letter topic with their origin offsets, not lost).
                # Never poll again at the same position: kafka-python then loops forever over
                # the failed fetch (3.0.12); seeking past it makes it drop that fetch.
                bad = consumer.position(tp)
                yield Unreadable(part.topic, part.partition, bad,
                                 f"unreadable record ({type(exc).__name__}: {exc})")
                consumer.seek(tp, bad + 1)
                position, progress_at = bad + 1, time.monotonic()
                continue
            for rec in batch.get(tp, ()):
                # Records outside the slice (an offset reset after lost data) are another
                # batch's, or nobody's: emitting them would duplicate or invent events.
                if part.start <= rec.offset < part.end:
                    yield rec
            now_at = consumer.position(tp)
            if now_at != position:
                position, progress_at = now_at, time.monotonic()
            elif not patient and time.monotonic() - progress_at > PATIENT_AFTER_S:
                drop_consumer(options, purpose, patient=True)
                consumer, patient = consumer_for(options, purpose), True
                consumer.assign([tp])
                consumer.seek(tp, position)
            elif time.monotonic() - progress_at > stall_s:
                raise SourceReadError(
                    f"{part.topic}/{part.partition}: stuck at offset {position} while reading "
                    f"[{part.start}, {part.end}) for {stall_s:.0f} s; the broker is down or "
                    "lost these records"
                )
    except SourceReadError:
        drop_consumer(options, purpose)
        raise
    except Exception as exc:
        drop_consumer(options, purpose)
        raise SourceReadError(
            f"{part.topic}/{part.partition}: reading [{part.start}, {part.end}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
