"""The coordinator's output: rows of ``OUTPUT_SCHEMA`` written to Kafka, ``txstream-records``.

Each row goes to ``row.topic`` with its key, value and headers, byte for byte::

    (outputs.writeStream.format("txstream-records")
     .option("kafka", json.dumps(settings.as_dict()))
     .option("checkpointLocation", ...).start())

A task returns only once the broker acknowledged every record (idempotent, acks=all). If any
record was not, the task raises :class:`SendFailed`, which fails the micro-batch: Spark then
commits neither the batch nor its state, and the batch is run again on restart. That is what
makes "a back-check counts only when delivered" true.

A row whose body lies in the half topic (a held half message's release, check or discard) gets
it read back first, all of a task's at once (:mod:`txstream.readback.bodies`).

A replayed batch writes nothing twice: its records carry the ids the operator gave them
(``record_id``, equal in a replay), and a task that may be re-running a batch first reads
what is already on its topics and leaves those records out (:mod:`txstream.readback.replay`). Option
``replay_check=false`` turns that off (measurements only: a restart then duplicates).

A row with ``not_before_ms`` (a timer's record made ahead of its deadline) is sent no earlier
than that: a back-check never reaches a producer before its transaction's check time.

A ``timer`` row is no record: the tasks return the keys' new timeouts, and the driver-side
commit folds them into the timer schedule named by option ``timer_file``
(:mod:`txstream.timer_schedule`), from which the source knows when a batch is due.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)

from txstream.errors import ConfigError, MalformedRecord, SendFailed
from txstream.kafka import KafkaSettings
from txstream.options import parse_options
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES
from txstream.readback.bodies import BodySource, transaction_id_of, with_bodies
from txstream.readback.replay import replay_suspected, written
from txstream.schema import OUTPUT_SCHEMA, Kind, OutputRow
from txstream.sinks.delivery import Delivery, Prepared, RefusedRelease, make_sink_producer
from txstream.sinks.refusal_log import record as refusal_record
from txstream.sinks.refusal_log import refusal_log
from txstream.sinks.transactional import Fenced, TransactionalDelivery, task_transactional_id
from txstream.spark_worker import quiet_hang_up, settle
from txstream.timer_schedule import fold_into
from txstream.topics import validate_topic
from txstream.wire import H, unpack_headers

__all__ = ["SINK_NAME", "SinkOptions", "SinkCommit", "KafkaRecordSink", "KafkaRecordWriter",
           "make_sink_producer", "send_rows", "send_batches"]

log = logging.getLogger(__name__)

SINK_NAME = "txstream-records"
_MAX_ERRORS_SHOWN = 3


@dataclass(frozen=True)
class SinkOptions:
    """The sink's options, parsed once on the driver (:func:`txstream.options.parse_options`);
    picklable."""

    kafka: KafkaSettings
    flush_timeout_s: float = 120.0
    # Leave out what a crashed run of a replayed batch already wrote (readback.replay); false
    # writes a replayed batch again whole.
    replay_check: bool = True
    timer_file: str | None = None
    # Where a record the broker refuses for what it is goes, as a reference (sinks.delivery);
    # None: such a record fails the batch.
    dead_letter_topic: str | None = None
    max_message_bytes: int = KAFKA_MAX_MESSAGE_BYTES
    # Where the bodies of held half messages are read back from (readback.bodies).
    half_topic: str | None = None
    # The checkpoint's transactional id: each task writes its records in one Kafka
    # transaction under it and its partition (sinks.transactional); None: the ordered path.
    transactional_id: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        if not options.get("kafka"):
            raise ConfigError("option kafka (JSON of KafkaSettings.as_dict()) is required")
        return parse_options(cls, options)

    @property
    def client_key(self) -> str:
        return self.kafka.key


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task delivered: records acknowledged per ``kind`` (a release the broker
    refused is in ``refused`` instead); ``already_written``:
    records of a replayed batch found on their topics, so not written again; ``timers``: the
    new timeout (or None) of each state key its rows came from, and ``batch_ms`` their batch's
    time."""

    counts: dict[str, int] = field(default_factory=dict)
    already_written: int = 0
    timers: dict[int, int | None] = field(default_factory=dict)
    batch_ms: int | None = None
    # Releases the broker refused (dead-lettered, their notes restated): the metrics count
    # them as refusals, not releases (txstream.sinks.refusal_log).
    refused: list[RefusedRelease] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _prepared(rows: list[OutputRow]) -> tuple[list[Prepared], list[str]]:
    """The rows with their headers unpacked, and why any row can never be written: checked
    before sending anything, so a deterministic error does not half-write a batch."""
    ready: list[Prepared] = []
    invalid: list[str] = []
    for row in rows:
        try:
            validate_topic(row.topic)
            ready.append((row, unpack_headers(row.headers)))
        except ConfigError as exc:
            invalid.append(str(exc))
        except MalformedRecord as exc:
            invalid.append(f"record for topic {row.topic}: {exc}")
    return ready, invalid


def _rows(batches: Iterable[Any]) -> list[OutputRow]:
    rows: list[OutputRow] = []
    for batch in batches:
        # Column-wise to_pylist is far cheaper than Spark building a Row per record.
        cols = [batch.column(name).to_pylist() for name in OutputRow._fields]
        rows.extend(map(OutputRow._make, zip(*cols)))
    return rows


def _not_yet_written(options: SinkOptions, rows: list[Prepared]) -> list[Prepared]:
    """The rows a crashed run of this batch did not write (all, when no row has an id).

    A record the broker refused went to the dead-letter topic under its own id
    (:mod:`txstream.sinks.delivery`): its id is looked for there too, so a replay neither
    dead-letters it twice nor writes it after all. A release, check request or discard is
    also found by its transaction on its topic under another number of the same call: a
    replay that found a body gone which its crashed run had read numbers its records
    otherwise (``replay.written``); the operator counted that body as there for that very
    record (key_step._not_written_before), and the sink would need it to write it again."""
    ids: dict[str, set[str]] = {}
    transactions: dict[str, set[str]] = {}
    firsts: dict[str, int] = {}  # each call's first number in this batch: its least one here
    batch_ms: int | None = None
    for row, headers in rows:
        if row.record_id is None or row.batch_ms is None:
            continue
        ids.setdefault(row.topic, set()).add(row.record_id)
        if options.dead_letter_topic and row.topic != options.dead_letter_topic:
            ids.setdefault(options.dead_letter_topic, set()).add(row.record_id)
        if (txid := _transaction(row, headers)) is not None:
            transactions.setdefault(row.topic, set()).add(txid)
        head, _, number = row.record_id.rpartition(".")
        if number.isdigit():
            firsts[head] = min(int(number), firsts.get(head, int(number)))
        batch_ms = row.batch_ms if batch_ms is None else min(batch_ms, row.batch_ms)
    if batch_ms is None:
        return rows
    try:
        found_ids, found = written(options.kafka, ids, transactions, batch_ms, firsts)
    except Exception as exc:
        # Writing blind would duplicate: fail the batch, it is tried again on restart.
        raise SendFailed(f"cannot tell what this replayed batch already wrote: "
                         f"{type(exc).__name__}: {exc}") from exc
    kept = [(row, headers) for row, headers in rows if row.record_id not in found_ids
            and _transaction(row, headers) not in found.get(row.topic, ())]
    if len(kept) == len(rows):
        return rows
    log.warning("replayed batch: %d of %d records were written before the restart; "
                "not written again", len(rows) - len(kept), len(rows))
    return kept


# The records a call writes once per transaction: found under another number of the call, a
# transaction's record on its topic is the one a crashed run wrote.
_ONE_PER_TRANSACTION = (Kind.VISIBLE, Kind.CHECK, Kind.DISCARD)


def _transaction(row: OutputRow, headers: list[tuple[str, bytes]]) -> str | None:
    """The transaction of a row written once per transaction and call, if it is one."""
    if row.record_id is None or row.kind not in _ONE_PER_TRANSACTION:
        return None
    # A release's key is its message's; its transaction is named in a header only.
    txid = (dict(headers).get(H.TRANSACTION_ID) if row.kind == Kind.VISIBLE
            else transaction_id_of(row, headers))
    return None if not txid else txid.decode("utf-8", "replace")


def _split_timers(rows: list[OutputRow], timers: dict[int, int | None]
                  ) -> tuple[list[OutputRow], int | None]:
    """The rows that are records; each timer row's timeout goes into ``timers`` instead.
    Also the batch's time, from any row."""
    records: list[OutputRow] = []
    batch_ms = None
    for row in rows:
        if row.kind == Kind.TIMER:
            timers[int(row.key or b"0")] = row.not_before_ms
        else:
            records.append(row)
        if row.batch_ms is not None:
            batch_ms = row.batch_ms
    return records, batch_ms


def _checked(rows: list[OutputRow]) -> list[Prepared]:
    ready, invalid = _prepared(rows)
    if invalid:
        shown = "; ".join(invalid[:_MAX_ERRORS_SHOWN])
        raise SendFailed(f"{len(invalid)} of {len(rows)} records cannot be written: {shown}")
    return ready


def _with_bodies(options: SinkOptions, rows: list[Prepared]) -> list[Prepared]:
    source = BodySource(options.kafka, options.half_topic) if options.half_topic else None
    return with_bodies(source, rows)


def _delivery(options: SinkOptions) -> Delivery:
    return Delivery(options.kafka, options.flush_timeout_s, options.dead_letter_topic,
                    options.max_message_bytes, options.half_topic)


def send_rows(options: SinkOptions, rows: list[OutputRow]) -> SinkCommit:
    """Send ``rows``; raise SendFailed unless all were acked. Nothing is sent when any row can
    never be written. Timer rows are not written but returned (:class:`SinkCommit`)."""
    timers: dict[int, int | None] = {}
    records, batch_ms = _split_timers(rows, timers)
    ready = _checked(records)
    total = len(ready)
    if options.transactional_id is not None:
        return _send_in_transaction(options, ready, timers, batch_ms)
    if options.replay_check and replay_suspected():
        ready = _not_yet_written(options, ready)
    delivery = _delivery(options)
    delivery.send(_with_bodies(options, ready))
    return SinkCommit(delivery.finish(), total - len(ready), timers, batch_ms,
                      delivery.refused_releases)


def send_batches(options: SinkOptions, batches: Iterator[Any]) -> SinkCommit:
    """Send the rows of Arrow ``batches`` as each arrives, so that sending overlaps the work
    that produces the next; one flush at the end. A row that can never be written fails the
    task after the batches before it were sent; the retry or restart is a replay, and replays
    skip what was written. A task that may be writing a replayed batch reads everything first:
    what its first run wrote is found by the ids of the whole batch."""
    if options.transactional_id is not None or (options.replay_check and replay_suspected()):
        # In a transaction the task's records are sent at the end, all together.
        return send_rows(options, _rows(batches))
    delivery = _delivery(options)
    timers: dict[int, int | None] = {}
    batch_ms = None
    for batch in batches:
        rows, ms = _split_timers(_rows([batch]), timers)
        batch_ms = ms if ms is not None else batch_ms
        delivery.send(_with_bodies(options, _checked(rows)))
    return SinkCommit(delivery.finish(), timers=timers, batch_ms=batch_ms,
                      refused=delivery.refused_releases)


def _send_in_transaction(options: SinkOptions, ready: list[Prepared],
                         timers: dict[int, int | None], batch_ms: int | None) -> SinkCommit:
    """Send ``ready`` in one Kafka transaction (sinks.transactional). A task that may be a
    replay makes its producer anew first: that aborts what a killed attempt left open, before
    the replay check reads back. A producer fenced by another worker process's (the same
    partition's task of another batch) is made anew, and the task checked as a replay: the
    other may have been a zombie attempt of this very task."""
    assert options.transactional_id is not None
    txid = task_transactional_id(options.transactional_id)
    suspected = replay_suspected()
    for attempt in range(2):
        delivery = TransactionalDelivery(options.kafka, options.flush_timeout_s, txid,
                                         options.dead_letter_topic, options.max_message_bytes,
                                         options.half_topic)
        if suspected or attempt:
            delivery.renew()
        rows = ready
        if options.replay_check and (suspected or (attempt and _committed_before(options,
                                                                                  ready))):
            rows = _not_yet_written(options, ready)
        delivery.send(_with_bodies(options, rows))
        try:
            return SinkCommit(delivery.finish(), len(ready) - len(rows), timers, batch_ms,
                              delivery.refused_releases)
        except Fenced:
            if attempt:
                raise
            log.info("transactional id %s was taken by another producer; taking it back", txid)
    raise AssertionError("unreachable")


def _committed_before(options: SinkOptions, ready: list[Prepared]) -> bool:
    """Whether another attempt of this task committed its transaction: looked for by one of
    its records only. A fenced producer's task has just fenced every other in turn, and a
    transaction is all or nothing; every attempt that committed left all of the task's
    records visible (it wrote what earlier ones had not). So one record absent means none of
    them was written, and the full read-back (some hundreds of ms a task on Apache Kafka) is
    left to tasks that may be replays. A fence is mostly the partition's task of an earlier
    batch run by another worker process (docs/decisions/0032-transactions.md)."""
    for prepared in ready:
        row = prepared[0]
        if row.record_id is not None and row.batch_ms is not None:
            return len(_not_yet_written(options, [prepared])) == 0
    return False


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
            self._fold_timers(commits, batchId)
            refusal_record(refusal_log(self.options.timer_file), batchId,
                           [r for m in commits for r in m.refused])
        skipped = sum(m.already_written for m in commits)
        if skipped:
            log.warning("batch %d was a replay: %d records its first run had written were not "
                        "written again", batchId, skipped)
        log.debug("batch %d delivered %s", batchId, dict(self.delivered))

    def _fold_timers(self, commits: list[SinkCommit], batch: int) -> None:
        """Each state key lives in one task, so the tasks' timers never overlap."""
        assert self.options.timer_file
        changes: dict[int, int | None] = {}
        for commit in commits:
            changes.update(commit.timers)
        times = [c.batch_ms for c in commits if c.batch_ms is not None]
        fold_into(Path(self.options.timer_file), changes, max(times) if times else None, batch)

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
        quiet_hang_up()
        return KafkaRecordWriter(SinkOptions.parse(self.options))
