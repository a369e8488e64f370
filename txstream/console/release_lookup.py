"""Where a released message lies on its real topic (topic, partition, offset), found by
reading the topic's tail.

The ``released`` history note is written in the same micro-batch as the released record, side
by side, so it cannot carry the offset the broker gives that record. The record itself says
whose it is: the coordinator writes the transaction id in its ``__transactionId__`` header and
an id of its own in ``TXSTREAM_RECORD_ID``. The console reads each partition of the real topic
backwards from its end, as far as the release's time, and keeps the records of the
transaction; it looks a transaction up once (the index keeps what it found) and only when its
page or JSON is asked for.

How far back: the record was sent after the note's time (the micro-batch's), so a record the
coordinator wrote (``TXSTREAM_RECORD_ID``) older than that, minus a clock-skew margin, ends a
partition's search; a record of another producer ends it once older than
:data:`FOREIGN_HORIZON_MS` before (its producer's clock is not the coordinator's), and no search
reads more than ``max_records`` records of a partition.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from txstream.kafka import EndProbe, KafkaSettings, PatientConsumer, Unreadable, read_range
from txstream.wire import H

__all__ = ["ReleaseLocation", "find_releases", "SKEW_MARGIN_MS", "FOREIGN_HORIZON_MS",
           "MAX_RECORDS"]

SKEW_MARGIN_MS = 5_000  # executors' clocks against the driver's: NTP keeps them far closer
FOREIGN_HORIZON_MS = 10 * 60_000
MAX_RECORDS = 50_000  # per partition: an old release on a busy topic is not worth more
_CHUNK = 2000
_TIMEOUT_S = 10.0


class ReleaseLocation(NamedTuple):
    """A released record: where it lies and its broker timestamp."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None

    @property
    def where(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


def _header(headers: Iterable[tuple[str, Any]] | None, wanted: str) -> str | None:
    for name, value in headers or ():
        if name == wanted and value is not None:
            return bytes(value).decode("utf-8", "replace")
    return None


def _older(rec: Any, released_ms: int) -> bool:
    """Whether ``rec`` was written before the release: nothing before it can be the release."""
    ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp >= 0 else None
    if ts is None:
        return False
    own = _header(rec.headers, H.RECORD_ID) is not None
    return ts < released_ms - (SKEW_MARGIN_MS if own else FOREIGN_HORIZON_MS)


def _scan(consumers: PatientConsumer, topic: str, partition: int, end: int, txid: str,
          released_ms: int, max_records: int) -> list[ReleaseLocation]:
    found: list[ReleaseLocation] = []
    floor = max(0, end - max_records)
    while end > floor:
        start, done = max(floor, end - _CHUNK), False
        for rec in read_range(consumers, topic, partition, start, end, _TIMEOUT_S,
                              stop_at_end=True):
            if isinstance(rec, Unreadable):
                continue
            if _header(rec.headers, H.TRANSACTION_ID) == txid:
                found.append(ReleaseLocation(topic, partition, rec.offset, rec.timestamp))
            done = done or _older(rec, released_ms)
        if done:
            break
        end = start
    return found


def find_releases(settings: KafkaSettings, topic: str, txid: str, released_ms: int, *,
                  max_records: int = MAX_RECORDS) -> list[ReleaseLocation]:
    """The records on ``topic`` released for transaction ``txid`` at ``released_ms`` (the
    note's time) or after, oldest first; raises a TxStreamError if the broker does not
    answer."""
    probe = EndProbe(settings, role="console")
    consumers = PatientConsumer(settings, role="console", max_poll_records=_CHUNK)
    try:
        ends = probe.topic_ends([topic], {}, _TIMEOUT_S)
        found = [location for (_, partition), end in sorted(ends.items())
                 for location in _scan(consumers, topic, partition, end, txid, released_ms,
                                       max_records)]
    finally:
        probe.close()
        consumers.close()
    return sorted(found, key=lambda f: (f.timestamp_ms or 0, f.partition, f.offset))
