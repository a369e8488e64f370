"""The bodies of held half messages, read back from the half topic when their records are sent.

A pending transaction's state keeps where its half message lies, not its body
(``state.bucket``): its release, checks and discard come to the sink with a null value and the
half topic's partition and offset (``OutputRow.body_partition``, ``body_offset``). A task reads
all the bodies its rows need at once: per half partition, the wanted offsets in a few ranges
(offsets close together in one read), and each record read is used for every row that needs
it (a check and a release of one message in one batch).
Why: docs/decisions/0021-bodies-read-back.md.

The record read back must be the half message of the row's transaction (its key is the
transaction id). One that is gone (the half topic's retention ran out before the transaction
ended) or is another record (the topic was recreated under a checkpoint) cannot be sent: the
row becomes a dead letter that carries everything but the body and says where the body was.
A broker that cannot be read fails the batch, which then runs again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

from txstream.errors import SendFailed
from txstream.kafka import (
    PATIENT_FETCH_WAIT_MS,
    KafkaSettings,
    Unreadable,
    cached_client,
    drop_cached_client,
    make_consumer,
    read_range,
)
from txstream.outputs import encode_dead_letter
from txstream.refusals import Code
from txstream.schema import Kind, OutputRow
from txstream.topics import Topics
from txstream.wire import H, Record, pack_headers

__all__ = ["BodySource", "needs_body", "ranges", "with_bodies"]

# Wanted offsets at most this far apart are read in one range: reading the records between
# them costs less than another fetch round trip.
RANGE_GAP = 512
_READ_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)

# A read-back slower than this is logged: it delays the batch's records (docs/operations.md).
SLOW_READ_S = 0.25

Prepared = tuple[OutputRow, list[tuple[str, bytes]]]
Position = tuple[int, int]  # (partition, offset) in the half topic


def needs_body(row: OutputRow) -> bool:
    return row.body_offset is not None and row.body_partition is not None


def ranges(offsets: Iterable[int], gap: int = RANGE_GAP) -> list[tuple[int, int]]:
    """``[start, end)`` ranges covering ``offsets``, one per run of offsets less than ``gap``
    apart."""
    out: list[tuple[int, int]] = []
    for offset in sorted(set(offsets)):
        if out and offset - out[-1][1] < gap:
            out[-1] = (out[-1][0], offset + 1)
        else:
            out.append((offset, offset + 1))
    return out


class BodySource:
    """Reads half topic records by position, with this process's cached consumer (a consumer's
    connection costs more than a batch's reads) and a patient one when the broker is slow."""

    def __init__(self, settings: KafkaSettings, half_topic: str) -> None:
        self.settings = settings
        self.topic = half_topic
        self._key = ("bodies", repr(sorted(settings.as_dict().items())))
        self._patient: Any = None

    def _consumer(self, patient: bool) -> Any:
        if not patient:
            return cached_client(self._key, lambda: make_consumer(
                self.settings, role="sink", fetch_max_wait_ms=5))
        if self._patient is None:
            self._patient = make_consumer(self.settings, role="sink",
                                          fetch_max_wait_ms=PATIENT_FETCH_WAIT_MS)
        return self._patient

    def read(self, wanted: dict[int, set[int]]) -> dict[Position, Any]:
        """The records at ``wanted`` ({partition: offsets}) that are still there, by position
        (a ConsumerRecord, or :class:`Unreadable`)."""
        found: dict[Position, Any] = {}
        started = time.monotonic()
        try:
            for partition, offsets in sorted(wanted.items()):
                for start, end in ranges(offsets):
                    for rec in read_range(self._consumer, self.topic, partition, start, end,
                                          _READ_TIMEOUT_S, stop_at_end=True):
                        if rec.offset in offsets:
                            found[(partition, rec.offset)] = rec
        except Exception as exc:
            drop_cached_client(self._key)
            raise SendFailed(f"cannot read half messages back from {self.topic}: "
                             f"{type(exc).__name__}: {exc}") from exc
        finally:
            if self._patient is not None:
                self._patient.close()
                self._patient = None
        took = time.monotonic() - started
        if took > SLOW_READ_S:
            log.warning("reading %d half messages back from %s took %.0f ms",
                        sum(map(len, wanted.values())), self.topic, took * 1000)
        return found


def _transaction_id(row: OutputRow, headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """The transaction a row is for: a release names it in a header, a check or a discard in
    its key."""
    for name, value in headers:
        if name == H.TRANSACTION_ID:
            return value
    return row.key


def _lost(prepared: Prepared, half_topic: str, why: str, dead_letter_topic: str,
          limit: int) -> Prepared:
    """A row whose body cannot be read back, as a dead letter of everything but the body."""
    row, headers = prepared
    assert row.body_partition is not None and row.body_offset is not None
    kept = tuple((name, value) for name, value in headers if name != H.RECORD_ID)
    reason = (f"the {row.kind} record for {row.topic} cannot be sent: the body of its half "
              f"message, {half_topic}/{row.body_partition} offset {row.body_offset}, {why}")
    record = encode_dead_letter(Record(half_topic, row.key, None, kept), reason,
                                Code.HALF_MESSAGE_LOST, (row.body_partition, row.body_offset),
                                Topics(dead_letter=dead_letter_topic), limit)
    with_id = [*record.headers,
               *([(H.RECORD_ID, row.record_id.encode("ascii"))] if row.record_id else [])]
    letter = row._replace(kind=Kind.DEAD_LETTER, topic=record.topic, key=record.key, value=None,
                          headers=pack_headers(with_id), body_partition=None, body_offset=None)
    return letter, with_id


def with_bodies(source: BodySource | None, rows: list[Prepared], dead_letter_topic: str | None,
                limit: int) -> list[Prepared]:
    """``rows`` with every body that lies in the half topic read back into its value."""
    wanted: dict[int, set[int]] = {}
    for row, _ in rows:
        if needs_body(row):
            wanted.setdefault(row.body_partition, set()).add(row.body_offset)  # type: ignore[arg-type]
    if not wanted:
        return rows
    if source is None or dead_letter_topic is None:
        raise SendFailed("records whose bodies lie in the half topic need the sink's options "
                         "half_topic and dead_letter_topic")
    found = source.read(wanted)
    out: list[Prepared] = []
    for prepared in rows:
        row, headers = prepared
        if not needs_body(row):
            out.append(prepared)
            continue
        rec = found.get((row.body_partition, row.body_offset))  # type: ignore[arg-type]
        if rec is None:
            why = "is no longer in the topic (its retention is shorter than transactions live)"
        elif isinstance(rec, Unreadable):
            why = f"cannot be read: {rec.error}"
        elif rec.key != _transaction_id(row, headers):
            why = "is another transaction's record (was the half topic recreated?)"
        else:
            out.append((row._replace(value=rec.value, body_partition=None, body_offset=None),
                        headers))
            continue
        out.append(_lost(prepared, source.topic, why, dead_letter_topic, limit))
    return out
