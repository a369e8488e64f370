"""Exactly-once release across a replayed micro-batch: what did the crashed run already write?

Spark replays a micro-batch whose commit it did not record (the driver was killed, a write
failed) with the same input, the same state and the same batch time, so the operator emits the
same records under the same ids (``record_id``, also the ``TXSTREAM_RECORD_ID`` header; see
``streaming.operator.record_id``). Kafka cannot take back what the first run wrote (tansu's
transactions do not hide aborted records), so before writing a batch that may be a replay the
sink reads the tail of every partition it is about to write to and leaves out the records
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
import time
from collections.abc import Iterable, Mapping
from typing import Any

from txstream.kafka import PATIENT_AFTER_S, PATIENT_FETCH_WAIT_MS, KafkaSettings, make_consumer
from txstream.wire import H

__all__ = [
    "SKEW_MARGIN_MS",
    "FOREIGN_HORIZON_MS",
    "replay_suspected",
    "written_ids",
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


def _record_id(headers: Iterable[tuple[str, bytes | None]] | None) -> str | None:
    for name, value in headers or ():
        if name == H.RECORD_ID and value is not None:
            return bytes(value).decode("ascii", "replace")
    return None


def _high_watermark(probe: Any, tp: Any) -> int:
    """The partition's end, from a fetch (tansu answers ListOffsets wrongly)."""
    probe.assign([tp])
    probe.seek(tp, 0)
    deadline = time.monotonic() + _READ_TIMEOUT_S
    while time.monotonic() < deadline:
        probe.poll(timeout_ms=50, max_records=1)
        hw = probe.highwater(tp)
        if hw is not None:
            return int(hw)
    raise TimeoutError(f"no high watermark for {tp.topic}/{tp.partition}")


class _Reader:
    """Reads ranges of records; rebuilt patient when the broker is slow (PATIENT_AFTER_S)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.wait_ms = 5
        self.consumer = self._make()

    def _make(self) -> Any:
        return make_consumer(self.settings, fetch_max_wait_ms=self.wait_ms,
                             max_poll_records=_CHUNK)

    def read(self, tp: Any, start: int, end: int) -> list[Any]:
        self.consumer.assign([tp])
        self.consumer.seek(tp, start)
        out: list[Any] = []
        began = progress_at = time.monotonic()
        position = start
        while position < end:
            now = time.monotonic()
            if now - began > _READ_TIMEOUT_S:
                raise TimeoutError(f"reading {tp.topic}/{tp.partition} [{start}, {end}) stalled")
            if now - progress_at > PATIENT_AFTER_S and self.wait_ms < PATIENT_FETCH_WAIT_MS:
                self.consumer.close()
                self.wait_ms = PATIENT_FETCH_WAIT_MS
                self.consumer = self._make()
                self.consumer.assign([tp])
                self.consumer.seek(tp, position)
            for rec in self.consumer.poll(timeout_ms=100).get(tp, ()):
                if rec.offset < end:
                    out.append(rec)
            if self.consumer.position(tp) != position:
                position, progress_at = self.consumer.position(tp), time.monotonic()
        return out

    def close(self) -> None:
        self.consumer.close()


def _scan_partition(
    probe: Any, reader: _Reader, tp: Any, wanted: set[str], tag: str, batch_ms: int
) -> set[str]:
    own_horizon = batch_ms - SKEW_MARGIN_MS
    foreign_horizon = batch_ms - FOREIGN_HORIZON_MS
    found: set[str] = set()
    end = _high_watermark(probe, tp)
    while end > 0:
        start = max(0, end - _CHUNK)
        done = False
        for rec in reader.read(tp, start, end):
            rid = _record_id(rec.headers)
            if rid is not None and rid in wanted:
                found.add(rid)
            ts = rec.timestamp if rec.timestamp is not None and rec.timestamp >= 0 else None
            if ts is None:
                continue
            own = rid is not None and id_tag(rid) == tag
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
    from kafka import TopicPartition

    wanted = {t: ids for t, ids in wanted.items() if ids}
    if not wanted:
        return set()
    tag = id_tag(next(iter(next(iter(wanted.values())))))
    probe = make_consumer(settings, fetch_max_wait_ms=1, max_partition_fetch_bytes=1)
    reader = _Reader(settings)
    found: set[str] = set()
    try:
        for topic, ids in wanted.items():
            # A topic that does not exist yet holds nothing (the sink's first write creates it).
            parts = probe.partitions_for_topic(topic) or ()
            for partition in sorted(parts):
                tp = TopicPartition(topic, partition)
                found |= _scan_partition(probe, reader, tp, ids - found, tag, batch_ms)
    finally:
        probe.close()
        reader.close()
    return found
