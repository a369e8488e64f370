"""Exactly-once release across a replayed micro-batch: what did the crashed run already write?

Spark replays a micro-batch whose commit it did not record (the driver was killed, a write
failed) with the same input, the same state and the same batch time, so the operator emits the
same records under the same ids (``record_id``, also the ``TXSTREAM_RECORD_ID`` header; see
``txstream.streaming.engine.operator.record_id``). Kafka cannot take back what the first run wrote
(tansu's transactions do not hide aborted records), so before writing a batch that may be a replay
the sink reads the tail of every partition it is about to write to and leaves out the records
whose id is already there.

Which batches may be replays, seen from a task (no driver round trip needed): the first batch
of a query run, since a restart replays the uncommitted batch before anything else, and any
task attempt after the first. The run and batch come from Spark's local properties
(``spark.jobGroup.id`` is the run id, ``streaming.sql.batchId`` the batch), so a query
restarted in the same process is a new run and checked again.

How far back to read: the replayed batch's first run wrote nothing before the batch started
(``batch_ms``), and every record an earlier batch wrote was acknowledged before it. Reading
stops at the first record of this coordinator (its id tag) older than ``batch_ms`` minus a
clock-skew margin; records of other producers stop it only once older than
:data:`FOREIGN_HORIZON_MS`. A miss can only cost a duplicate, never a loss: a record is left
out only when its very id was found on its topic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

from txstream.kafka import EndProbe, KafkaSettings, PatientConsumer, Unreadable, read_range
from txstream.wire import H

__all__ = [
    "SKEW_MARGIN_MS",
    "FOREIGN_HORIZON_MS",
    "replay_suspected",
    "written_ids",
    "released_before",
    "id_tag",
]

# Executors' clocks against the driver's (batch_ms is the driver's, record timestamps an
# executor's): NTP keeps them within milliseconds. A larger margin only reads more at a restart.
SKEW_MARGIN_MS = 5_000
# Older than this before the batch, a record of another producer ends the search: a producer
# gives up on a record within its delivery timeout (kafka-python: 120 s), so nothing older can
# have been appended after the batch started.
FOREIGN_HORIZON_MS = 10 * 60_000
_CHUNK = 2000  # offsets read per step backwards
_READ_TIMEOUT_S = 30.0

_FIRST_BATCH: dict[str, int] = {}  # run id -> first batch this process wrote for it
_FIRST_LOCK = threading.Lock()


def replay_suspected() -> bool:
    """Whether the running task may be writing a batch that was (partly) written before."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        return True  # not in a Spark task: nothing tells, so check
    if context.attemptNumber() > 0:
        return True
    run = context.getLocalProperty("spark.jobGroup.id")
    batch = context.getLocalProperty("streaming.sql.batchId")
    if not run or batch is None:
        return True
    with _FIRST_LOCK:
        # A worker process that joins later in a run checks its first batch too: harmless,
        # it finds nothing. The first batch of a run is checked by every process writing it.
        first = _FIRST_BATCH.setdefault(run, int(batch))
    return int(batch) == first


def id_tag(record_id: str) -> str:
    """The coordinator tag of a record id (its first dotted part)."""
    return record_id.split(".", 1)[0]


def _header(headers: Iterable[tuple[str, bytes | None]] | None, wanted: str) -> str | None:
    for name, value in headers or ():
        if name == wanted and value is not None:
            return bytes(value).decode("ascii", "replace")
    return None


def _scan_partition(consumers: PatientConsumer, topic: str, partition: int, end: int,
                    wanted: set[str], tag: str, batch_ms: int, header: str,
                    counts: Callable[[str], bool]) -> set[str]:
    own_horizon = batch_ms - SKEW_MARGIN_MS
    foreign_horizon = batch_ms - FOREIGN_HORIZON_MS
    found: set[str] = set()
    while end > 0:
        start = max(0, end - _CHUNK)
        done = False
        for rec in read_range(consumers, topic, partition, start, end, _READ_TIMEOUT_S):
            if isinstance(rec, Unreadable):
                continue  # not a record this coordinator wrote whole: it cannot be skipped
            rid = _header(rec.headers, H.RECORD_ID)
            own = rid is not None and id_tag(rid) == tag
            value = (rid if header == H.RECORD_ID else _header(rec.headers, header)
                     if own and counts(rid) else None)
            if value is not None and value in wanted:
                found.add(value)
            ts = rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None
            if ts is None:
                continue
            if (own and ts < own_horizon) or ts < foreign_horizon:
                done = True  # everything before this record was there before the batch
        if done or found >= wanted:
            break
        end = start
    return found


def written_ids(
    settings: KafkaSettings, wanted: Mapping[str, set[str]], batch_ms: int
) -> set[str]:
    """Which of ``wanted`` ({topic: record ids}) are already on their topics."""
    wanted = {t: ids for t, ids in wanted.items() if ids}
    if not wanted:
        return set()
    return _written(settings, wanted, batch_ms, id_tag(next(iter(next(iter(wanted.values()))))),
                    H.RECORD_ID)


def released_before(
    settings: KafkaSettings, wanted: Mapping[str, set[str]], batch_ms: int, first_id: str
) -> set[str]:
    """Which of ``wanted`` ({real topic: transaction ids}) a run of this batch released already:
    a record for the transaction is on its real topic under an id of this batch's state key,
    numbered from ``first_id`` on (the ids the key's call takes in this batch)."""
    wanted = {t: ids for t, ids in wanted.items() if ids}
    if not wanted:
        return set()
    prefix, first = first_id.rsplit(".", 1)

    def of_this_batch(rid: str) -> bool:
        head, _, number = rid.rpartition(".")
        return head == prefix and number.isdigit() and int(number) >= int(first)

    return _written(settings, wanted, batch_ms, id_tag(first_id), H.TRANSACTION_ID,
                    of_this_batch)


def _written(settings: KafkaSettings, wanted: Mapping[str, set[str]], batch_ms: int, tag: str,
             header: str, counts: Callable[[str], bool] = lambda rid: True) -> set[str]:
    probe = EndProbe(settings, role="sink")
    consumers = PatientConsumer(settings, role="sink", max_poll_records=_CHUNK)
    found: set[str] = set()
    try:
        for topic, ids in wanted.items():
            # A topic that does not exist yet holds nothing (the sink's first write creates it).
            ends = probe.topic_ends([topic], {}, _READ_TIMEOUT_S)
            for (_, partition), end in sorted(ends.items()):
                found |= _scan_partition(consumers, topic, partition, end, ids - found, tag,
                                         batch_ms, header, counts)
    finally:
        probe.close()
        consumers.close()
    return found
