"""A partition read backwards from its end, a chunk at a time, as far back as a time: how the
coordinator looks for records it wrote (a replayed batch's, a predecessor's release, the
release a console page shows).

How far back: records of one writer lie in the order they were sent, within the skew between
the clocks of its processes. So once a record of the coordinator's own (``own``) is older than
``since`` less :data:`SKEW_MARGIN_MS`, nothing it sent after ``since`` lies further back. Only
its own records end the search: another writer's timestamps say nothing of when it sent them
(event time, a mirror, a producer clock off by a day on a ``CreateTime`` topic), so a search
past them goes on to the coordinator's own record before ``since``, or to ``floor``. A search
that stops too early can only miss a record, never find one that is not there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from txstream.kafka.protocols import ConsumerRecord
from txstream.kafka.reading import ConsumerFor, Unreadable, read_range

__all__ = ["SKEW_MARGIN_MS", "READ_BACK_CHUNK", "Chunk", "header_text", "read_back"]

# Executors' clocks against the driver's: NTP keeps them within milliseconds. A larger margin
# only reads more.
SKEW_MARGIN_MS = 5_000
READ_BACK_CHUNK = 2000  # offsets read per step backwards (and records per poll)


def header_text(headers: Iterable[tuple[str, bytes | None]] | None, wanted: str) -> str | None:
    """The first value of header ``wanted`` as text (None: there is none)."""
    for name, value in headers or ():
        if name == wanted and value is not None:
            return bytes(value).decode("utf-8", "replace")
    return None


class Chunk(list[ConsumerRecord]):
    """The records of one step backwards, in offset order, and the offset it starts at (the
    records of ``[start, end)`` that could be read: a chunk of a compacted log has gaps)."""

    def __init__(self, start: int, records: Iterable[ConsumerRecord]) -> None:
        super().__init__(records)
        self.start = start


Own = Callable[[ConsumerRecord], bool]  # whether a record is the coordinator's own


def _own_and_older(rec: ConsumerRecord, horizon: int, own: Own) -> bool:
    ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp >= 0 else None
    return ts is not None and ts < horizon and own(rec)


def read_back(consumers: ConsumerFor, topic: str, partition: int, end: int, since_ms: int,
              own: Own, stall_s: float, *, floor: int = 0,
              stop_at_end: bool = False) -> Iterator[Chunk]:
    """The records of ``[floor, end)``, newest chunk first (each in offset order), until a
    chunk holds a record of the coordinator's own (``own``) sent before ``since_ms``. A record
    kafka-python cannot parse is left out: it is nobody's. ``stall_s`` and ``stop_at_end`` as
    :func:`read_range`'s."""
    horizon = since_ms - SKEW_MARGIN_MS
    while end > floor:
        start = max(floor, end - READ_BACK_CHUNK)
        chunk = Chunk(start, (rec for rec in read_range(consumers, topic, partition, start, end,
                                                        stall_s, stop_at_end=stop_at_end)
                              if not isinstance(rec, Unreadable)))
        yield chunk
        if any(_own_and_older(rec, horizon, own) for rec in chunk):
            return
        end = start
