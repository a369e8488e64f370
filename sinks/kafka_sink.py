"""The coordinator's output: rows of ``OUTPUT_SCHEMA`` written to Kafka, ``txstream-records``.

Each row goes to ``row.topic`` with its key, value and headers, byte for byte::

    (outputs.writeStream.format("txstream-records")
     .option("kafka", json.dumps(settings.as_dict()))
     .option("checkpointLocation", ...).start())

A task returns only once the broker acknowledged every record (idempotent, acks=all). If any
record was not, the task raises :class:`SendFailed`, which fails the micro-batch: Spark then
commits neither the batch nor its state, and the batch is run again on restart. That is what
makes "a back-check counts only when delivered" true.

A replayed batch writes nothing twice: its records carry the ids the operator gave them
(``record_id``, equal in a replay), and a task that may be re-running a batch first reads
what is already on its topics and leaves those records out (:mod:`sinks.replay`). Option
``replay_check=false`` turns that off (measurements only: a restart then duplicates).

A row with ``not_before_ms`` (a timer's record made ahead of its deadline) is sent no earlier
than that: a back-check never reaches a producer before its transaction's check time.

A ``timer`` row is no record: the tasks return the keys' new timeouts, and the driver-side
commit folds them into the timer schedule named by option ``timer_file``
(:mod:`txstream.timer_schedule`), from which the source knows when a batch is due.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from sinks.replay import replay_suspected, written_ids
from txstream.errors import ConfigError, MalformedRecord, SendFailed
from txstream.kafka import KafkaSettings, make_producer
from txstream.schema import OUTPUT_SCHEMA, Kind
from txstream.spark_worker import settle
from txstream.timer_schedule import fold_into
from txstream.topics import validate_topic
from txstream.wire import unpack_headers

__all__ = ["SINK_NAME", "SinkOptions", "SinkCommit", "KafkaRecordSink", "KafkaRecordWriter",
           "make_sink_producer"]

log = logging.getLogger(__name__)

SINK_NAME = "txstream-records"
# Rows as send_rows takes them; record_id and batch_ms let a replay find what was written.
_COLUMNS = ("kind", "topic", "key", "value", "headers", "record_id", "batch_ms", "not_before_ms")
_MAX_ERRORS_SHOWN = 3


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, parsed once on the driver; picklable."""

    kafka: KafkaSettings
    flush_timeout_s: float = 120.0
    replay_check: bool = True
    timer_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        kafka = KafkaSettings.from_option(options.get("kafka"))
        text = options.get("flush_timeout_s")
        try:
            timeout = float(text) if text else 120.0
        except ValueError:
            raise ConfigError(f"option flush_timeout_s must be a number, got {text!r}") from None
        check = (options.get("replay_check") or "true").strip().lower()
        if check not in ("true", "false"):
            raise ConfigError(f"option replay_check must be true or false, got {check!r}")
        return cls(kafka=kafka, flush_timeout_s=timeout, replay_check=check == "true",
                   timer_file=options.get("timer_file") or None)

    @property
    def client_key(self) -> str:
        return json.dumps(self.kafka.as_dict(), sort_keys=True, default=str)


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task delivered: records acknowledged per ``kind``; ``already_written``:
    records of a replayed batch found on their topics, so not written again; ``timers``: the
    new timeout (or None) of each state key its rows came from, and ``batch_ms`` their batch's
    time."""

    counts: dict[str, int] = field(default_factory=dict)
    already_written: int = 0
    timers: dict[int, int | None] = field(default_factory=dict)
    batch_ms: int | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())


# One producer per worker process and settings: Spark reuses its Python workers, and a new
# producer costs a connection and an idempotent-producer id for every micro-batch.
_PRODUCERS: dict[str, Any] = {}
_PRODUCERS_LOCK = threading.Lock()


def make_sink_producer(settings: KafkaSettings) -> Any:
    """The sink's producer: acks=all and idempotent like every txstream producer, tuned for
    writing thousands of records at once (the benchmark's raw pipe uses it too).

    kafka-python builds every record in Python, on the caller's thread, while its I/O thread
    competes for the GIL: one request in flight and 1 MiB batches cut its CPU per record from
    ~120 to ~87 us here (BENCHMARKS.md) at no cost in delivery time to a nearby broker. A
    burst of thousands of records with a first record for a topic the broker creates on that
    write (a new group's check topic) used to stall a fresh producer until its timeout; the
    cause and its fix are in :class:`txstream.kafka.TopicTrackingProducer`.
    """
    return make_producer(settings, batch_size=1 << 20, max_in_flight_requests_per_connection=1)


def _producer(options: SinkOptions) -> Any:
    with _PRODUCERS_LOCK:
        producer = _PRODUCERS.get(options.client_key)
        if producer is None:
            producer = make_sink_producer(options.kafka)
            _PRODUCERS[options.client_key] = producer
        return producer


def _drop_producer(options: SinkOptions) -> None:
    """Forget a producer after a failure: an idempotent producer may be left in a fatal state."""
    with _PRODUCERS_LOCK:
        producer = _PRODUCERS.pop(options.client_key, None)
    if producer is None:
        return
    try:
        producer.close(timeout=0)
    except Exception:
        # kafka-python's close() flushes first and gives up while records are pending, leaving
        # its I/O thread retrying until delivery_timeout_ms (2 min). Stop it now: the records
        # are failed, and the batch will be sent again anyway.
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()


def _prepared(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], list[str]]:
    """The rows with their headers unpacked, and why any row can never be written: checked
    before sending anything, so a deterministic error does not half-write a batch."""
    ready: list[tuple[Any, ...]] = []
    invalid: list[str] = []
    for kind, topic, key, value, headers, *rest in rows:
        try:
            validate_topic(topic)
            ready.append((kind, topic, key, value, unpack_headers(headers), *rest))
        except ConfigError as exc:
            invalid.append(str(exc))
        except MalformedRecord as exc:
            invalid.append(f"record for topic {topic}: {exc}")
    return ready, invalid


def _rows(batches: Iterator[Any]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for batch in batches:
        # Column-wise to_pylist is far cheaper than Spark building a Row per record.
        cols = [batch.column(name).to_pylist() for name in _COLUMNS]
        rows.extend(zip(*cols))
    return rows


def _not_yet_written(options: SinkOptions, rows: list[tuple[Any, ...]]
                     ) -> list[tuple[Any, ...]]:
    """The rows a crashed run of this batch did not write (all, when no row has an id)."""
    wanted: dict[str, set[str]] = {}
    batch_ms: int | None = None
    for row in rows:
        rid, ms = (row[5], row[6]) if len(row) > 6 else (None, None)
        if rid is not None and ms is not None:
            wanted.setdefault(row[1], set()).add(rid)
            batch_ms = ms if batch_ms is None else min(batch_ms, ms)
    if batch_ms is None:
        return rows
    try:
        found = written_ids(options.kafka, wanted, batch_ms)
    except Exception as exc:
        # Writing blind would duplicate: fail the batch, it is tried again on restart.
        raise SendFailed(f"cannot tell what this replayed batch already wrote: "
                         f"{type(exc).__name__}: {exc}") from exc
    if not found:
        return rows
    kept = [row for row in rows if not (len(row) > 5 and row[5] in found)]
    log.warning("replayed batch: %d of %d records were written before the restart; "
                "not written again", len(rows) - len(kept), len(rows))
    return kept


def _wait_ms(not_before_ms: int, batch_ms: int | None) -> float:
    """How long until ``not_before_ms`` (a timer's deadline, at most the lead past the batch's
    start: a worker whose clock runs behind the driver's waits no longer than that)."""
    wait_ms = not_before_ms - time.time() * 1000
    if batch_ms is not None:
        wait_ms = min(wait_ms, not_before_ms - batch_ms)
    return wait_ms


class _Delivery:
    """The records one task sends, acknowledged all together at the end (:meth:`finish`).

    A record that must wait for its deadline (``not_before_ms``) is put aside and sent at the
    end, in deadline order: waiting for it never delays the records behind it.
    """

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.futures: list[tuple[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.held: list[tuple[int, int, tuple[Any, ...]]] = []

    def send(self, rows: list[tuple[Any, ...]]) -> None:
        now: list[tuple[Any, ...]] = []
        for row in rows:
            not_before = row[7] if len(row) > 7 else None
            if not_before is not None and _wait_ms(not_before, row[6]) > 0:
                self.held.append((not_before, len(self.held), row))
            else:
                now.append(row)
        self._send_now(now)

    def _send_now(self, rows: list[tuple[Any, ...]]) -> None:
        topic = None
        try:
            producer = _producer(self.options)
            for kind, topic, key, value, headers, *_ in rows:
                if key is None and value is None:
                    # kafka-python refuses such a record (Kafka does not): e.g. the dead letter
                    # of a keyless tombstone. An empty value is the nearest it can send.
                    value = b""
                self.futures.append((topic, producer.send(topic, key=key, value=value,
                                                          headers=headers)))
                self.counts[kind] += 1
        except Exception as exc:
            _drop_producer(self.options)
            raise SendFailed(f"sending record {len(self.futures) + 1} (topic {topic}) "
                             f"failed: {type(exc).__name__}: {exc}") from exc

    def _send_held(self) -> None:
        for not_before, _, row in sorted(self.held):
            wait_ms = _wait_ms(not_before, row[6])
            if wait_ms > 0:
                time.sleep(wait_ms / 1000)
            self._send_now([row])
        self.held = []

    def finish(self) -> dict[str, int]:
        """Send what was held, flush; raise SendFailed unless the broker acknowledged every
        record."""
        self._send_held()
        try:
            _producer(self.options).flush(timeout=self.options.flush_timeout_s)
        except Exception as exc:
            _drop_producer(self.options)
            raise SendFailed(f"flushing {len(self.futures)} records failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        failed = [(topic, fut) for topic, fut in self.futures if not fut.succeeded()]
        if failed:
            _drop_producer(self.options)
            shown = "; ".join(
                f"{topic}: {fut.exception if fut.is_done else 'no acknowledgement'}"
                for topic, fut in failed[:_MAX_ERRORS_SHOWN]
            )
            raise SendFailed(f"{len(failed)} of {len(self.futures)} records were not "
                             f"acknowledged by the broker: {shown}")
        return dict(self.counts)


def _split_timers(rows: list[tuple[Any, ...]], timers: dict[int, int | None]
                  ) -> tuple[list[tuple[Any, ...]], int | None]:
    """The rows that are records; each timer row's timeout goes into ``timers`` instead.
    Also the batch's time, from any row."""
    records: list[tuple[Any, ...]] = []
    batch_ms = None
    for row in rows:
        if row[0] == Kind.TIMER:
            timers[int(row[2])] = row[7]
        else:
            records.append(row)
        if len(row) > 6 and row[6] is not None:
            batch_ms = row[6]
    return records, batch_ms


def _checked(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    ready, invalid = _prepared(rows)
    if invalid:
        shown = "; ".join(invalid[:_MAX_ERRORS_SHOWN])
        raise SendFailed(f"{len(invalid)} of {len(rows)} records cannot be written: {shown}")
    return ready


def send_rows(options: SinkOptions, rows: list[tuple[Any, ...]]) -> SinkCommit:
    """Send ``(kind, topic, key, value, packed headers[, record_id, batch_ms[, not_before_ms]])``
    rows; raise SendFailed unless all were acked. Nothing is sent when any row can never be
    written. Timer rows are not written but returned (:class:`SinkCommit`)."""
    timers: dict[int, int | None] = {}
    rows, batch_ms = _split_timers(rows, timers)
    rows = _checked(rows)
    total = len(rows)
    if options.replay_check and replay_suspected():
        rows = _not_yet_written(options, rows)
    delivery = _Delivery(options)
    delivery.send(rows)
    return SinkCommit(delivery.finish(), total - len(rows), timers, batch_ms)


def send_batches(options: SinkOptions, batches: Iterator[Any]) -> SinkCommit:
    """Send the rows of Arrow ``batches`` as each arrives, so that sending overlaps the work
    that produces the next; one flush at the end. A row that can never be written fails the
    task after the batches before it were sent; the retry or restart is a replay, and replays
    skip what was written. A task that may be writing a replayed batch reads everything first:
    what its first run wrote is found by the ids of the whole batch."""
    if options.replay_check and replay_suspected():
        return send_rows(options, _rows(batches))
    delivery = _Delivery(options)
    timers: dict[int, int | None] = {}
    batch_ms = None
    for batch in batches:
        rows, ms = _split_timers(_rows([batch]), timers)
        batch_ms = ms if ms is not None else batch_ms
        delivery.send(_checked(rows))
    return SinkCommit(delivery.finish(), timers=timers, batch_ms=batch_ms)


class KafkaRecordWriter(DataSourceStreamArrowWriter):
    """Writes one micro-batch's partition of rows; Arrow in, so no Row per record is built."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options
        self.delivered: Counter[str] = Counter()  # driver side: totals over committed batches

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        settle()
        return send_batches(self.options, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        for message in messages:
            if isinstance(message, SinkCommit):
                self.delivered.update(message.counts)
        commits = [m for m in messages if isinstance(m, SinkCommit)]
        if self.options.timer_file:
            self._fold_timers(commits)
        skipped = sum(m.already_written for m in commits)
        if skipped:
            log.warning("batch %d was a replay: %d records its first run had written were not "
                        "written again", batchId, skipped)
        log.debug("batch %d delivered %s", batchId, dict(self.delivered))

    def _fold_timers(self, commits: list[SinkCommit]) -> None:
        """Each state key lives in one task, so the tasks' timers never overlap."""
        assert self.options.timer_file
        changes: dict[int, int | None] = {}
        for commit in commits:
            changes.update(commit.timers)
        times = [c.batch_ms for c in commits if c.batch_ms is not None]
        fold_into(Path(self.options.timer_file), changes, max(times) if times else None)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Spark calls this for a batch that did not complete: a task failed, or the query was
        stopped mid-batch (every stop of ``txstream run``). Either way the batch runs again
        from the checkpoint; only records its finished tasks wrote deserve a word."""
        written = sum(m.total for m in messages if isinstance(m, SinkCommit))
        if not written:
            log.info("batch %d did not complete and wrote nothing; it runs again from the "
                     "checkpoint", batchId)
        elif self.options.replay_check:
            log.warning("batch %d did not complete; it runs again from the checkpoint, and the "
                        "%d records its finished tasks wrote are found by id and not written "
                        "twice", batchId, written)
        else:
            log.warning("batch %d did not complete; it runs again from the checkpoint and, with "
                        "the replay check off, writes the %d records its finished tasks wrote "
                        "a second time", batchId, written)


class KafkaRecordSink(DataSource):
    """``txstream-records``: write ``OUTPUT_SCHEMA`` rows to the topics they name."""

    @classmethod
    def name(cls) -> str:
        return SINK_NAME

    def schema(self) -> str:
        return OUTPUT_SCHEMA

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        settle()
        return KafkaRecordWriter(SinkOptions.parse(self.options))
