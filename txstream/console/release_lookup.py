"""Where a released message lies on its real topic (topic, partition, offset), found by
reading the topic's tail.

The ``released`` history note is written in the same micro-batch as the released record, side
by side, so it cannot carry the offset the broker gives that record. The record itself says
whose it is: the coordinator writes the transaction id in its ``__transactionId__`` header and
an id of its own in ``TXSTREAM_RECORD_ID``. The console reads each partition of the real topic
backwards from its end, as far as the release's time, and keeps the records of the
transaction; it looks a transaction up once (the index keeps what it found) and only when its
page or JSON is asked for.

How far back: the record was sent after the note's time (the micro-batch's), so each partition
is read back to there (:func:`txstream.kafka.read_back.read_back`; a record any coordinator
wrote, with a ``TXSTREAM_RECORD_ID``, counts as the coordinator's), and no search reads more
than ``max_records`` records of a partition.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from txstream.kafka import EndProbe, KafkaSettings, PatientConsumer
from txstream.kafka.read_back import READ_BACK_CHUNK, header_text, read_back
from txstream.wire import H

__all__ = ["ReleaseLocation", "find_releases", "MAX_RECORDS"]

MAX_RECORDS = 50_000  # per partition: an old release on a busy topic is not worth more
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


def _written_by_a_coordinator(rec: Any) -> bool:
    return header_text(rec.headers, H.RECORD_ID) is not None


def _scan(consumers: PatientConsumer, topic: str, partition: int, end: int, txid: str,
          released_ms: int, max_records: int) -> list[ReleaseLocation]:
    return [ReleaseLocation(topic, partition, rec.offset, rec.timestamp)
            for chunk in read_back(consumers, topic, partition, end, released_ms,
                                   _written_by_a_coordinator, _TIMEOUT_S,
                                   floor=max(0, end - max_records), stop_at_end=True)
            for rec in chunk if header_text(rec.headers, H.TRANSACTION_ID) == txid]


def find_releases(settings: KafkaSettings, topic: str, txid: str, released_ms: int, *,
                  max_records: int = MAX_RECORDS) -> list[ReleaseLocation]:
    """The records on ``topic`` released for transaction ``txid`` at ``released_ms`` (the
    note's time) or after, oldest first; raises a TxStreamError if the broker does not
    answer."""
    probe = EndProbe(settings, role="console")
    consumers = PatientConsumer(settings, role="console", max_poll_records=READ_BACK_CHUNK)
    try:
        ends = probe.topic_ends([topic], {}, _TIMEOUT_S)
        found = [location for (_, partition), end in sorted(ends.items())
                 for location in _scan(consumers, topic, partition, end, txid, released_ms,
                                       max_records)]
    finally:
        probe.close()
        consumers.close()
    return sorted(found, key=lambda f: (f.timestamp_ms or 0, f.partition, f.offset))
