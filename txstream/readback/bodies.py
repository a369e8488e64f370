"""The bodies of held half messages, read back from the half topic by where they lie: by the
operator, to learn which are gone (:func:`gone_bodies`), and by the sink, into the records it
writes (:func:`with_bodies`).

A pending transaction's state keeps where its half message lies, not its body
(``txstream.state.bucket``, docs/decisions/0021-bodies-read-back.md). Before the core decides
anything in a call, the operator reads back the bodies of every held half message the call may
write (the commits it reads, the checks and discards its timers may send), all of them at once,
per half partition, the wanted offsets in a few ranges (offsets close together in one read), to
learn which are gone: a body that is gone is told to the core as an event, so nothing claims a
release it cannot make. The sink reads the bodies it writes once more, so that big bodies never
pass through the JVM.

The record read back must be the half message of the transaction (its key is the transaction
id). One that is gone (the half topic's retention ran out before the transaction ended; its
partition no longer exists, the topic recreated with fewer) or is another record (the topic was
recreated under a checkpoint) cannot be sent. A broker that cannot be read fails the call, and
so the micro-batch, which then runs again.

Reads use the process's kept consumer, whose idea of a partition's end may be older than the
read: kafka-python keeps the high watermark of a fetch it sent ahead and buffered. So a read
that ends with wanted offsets missing is no verdict: they are read again with a brand-new
consumer, whose fetches are all made for this read, in the partitions the broker says exist
now (asked afresh). The common path keeps its one kept consumer; a read with bodies missing
pays for two new connections.

A body the second read does not find, below its partition's end, is gone (retention). One
past the end is not, yet: every wanted body was read once, so the partition's end was past it
then. A leader with fewer in-sync replicas than ``min.insync.replicas`` keeps its high
watermark where it was (Kafka 4, KIP-966), and a new leader learns it a fetch late: the body
is there, not handed out. So while the partition has no leader or too few replicas in sync,
the read fails (the batch runs again); once it has them, a body past the end for
``SHORT_SETTLE_S`` (this process's clock) is gone: the half topic was created again, or the
broker lost records (docs/decisions/0021-bodies-read-back.md).

The sink's side: a release, check request or discard of a half message held without its body
comes to the sink with a null value and where the body lies (``OutputRow.body_partition``,
``body_offset``; a row with a value says where its body lies too: a refused release's dead
letter names it). A task reads all the bodies its rows need at once, and each record read
serves every row that needs it. The operator read each of them before deciding, and told the
core of any that was gone (docs/decisions/0022-trusted-time.md). One that cannot be read back
now was lost since, within the batch (its half topic deleted or cut meanwhile): the batch
fails, and its replay decides again with what is there, so that the history never says
"released" for a message that was not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from txstream.errors import SendFailed
from txstream.kafka import (
    ConsumerRecord,
    KafkaSettings,
    PatientConsumer,
    TopicPartition,
    Unreadable,
    close_quietly,
    make_admin,
    read_range,
)
from txstream.kafka.errors import NoError, UnknownTopicOrPartitionError, for_code
from txstream.kafka.partition_health import troubles_of
from txstream.kafka.reading import ConsumerFor
from txstream.schema import OutputRow
from txstream.wire import H

__all__ = ["BodySource", "ranges", "gone_bodies", "OTHER_RECORD", "needs_body",
           "with_bodies", "SHORT_SETTLE_S", "settle_clock", "transaction_id_of"]

# Wanted offsets at most this far apart are read in one range: reading the records between
# them costs less than another fetch round trip.
RANGE_GAP = 512
_READ_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)

# A read-back slower than this is logged: it delays the batch's records (docs/operations.md).
SLOW_READ_S = 0.25

Position = tuple[int, int]  # (partition, offset) in the half topic
Found = dict[Position, ConsumerRecord | Unreadable]  # the records read back, by position
Bounds = tuple[int, int | None]  # a partition's log start, and its end if a fetch told it
# A reader must not create the topic it reads (a broker may on a metadata request).
_OPTIONS: dict[str, Any] = {"role": "sink", "allow_auto_create_topics": False}

OTHER_RECORD = "is another transaction's record (was the half topic recreated?)"

# How long a healthy partition must end short of a body read before for the body to be gone:
# a new leader's high watermark catches up within a follower's fetch (replica.fetch.wait.max.ms
# is 500 ms).
SHORT_SETTLE_S = 5.0
# The clock of that wait (a simulation sets its own). Per process, by (servers, topic,
# partition): a failed batch's replay is a new call, on a new BodySource.
settle_clock: Callable[[], float] = time.monotonic
# (servers, topic, partition) -> (found short since, last found short)
_SHORT_SINCE: dict[tuple[str, str, int], tuple[float, float]] = {}


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
    """Reads half topic records by position, with this process's kept consumer (a consumer's
    connection costs more than a batch's reads), patient once the broker was slow, and a
    brand-new one to confirm what the kept one did not find."""

    def __init__(self, settings: KafkaSettings, half_topic: str) -> None:
        self.settings = settings
        self.topic = half_topic
        self._kept = PatientConsumer(
            settings, kept_as=("bodies", settings.key),
            **_OPTIONS)
        self._absent: set[int] = set()  # partitions the last read found do not exist
        self._bounds: dict[int, Bounds] = {}  # of the partitions the last read missed in

    def read(self, wanted: dict[int, set[int]]) -> Found:
        """The records at ``wanted`` ({partition: offsets}) that are still there, by position
        (a ConsumerRecord, or :class:`Unreadable`). :meth:`why_missing` says why one is not."""
        found: Found = {}
        self._absent, self._bounds = set(), {}
        started = time.monotonic()
        try:
            missing = self._read_into(found, wanted, self._kept)
            if missing:
                self._confirm(found, missing)
        except Exception as exc:
            self._kept.drop()
            raise SendFailed(f"cannot read half messages back from {self.topic}: "
                             f"{type(exc).__name__}: {exc}") from exc
        took = time.monotonic() - started
        if took > SLOW_READ_S:
            log.warning("reading %d half messages back from %s took %.0f ms",
                        sum(map(len, wanted.values())), self.topic, took * 1000)
        return found

    def why_missing(self, partition: int, offset: int) -> str:
        """Why a body the last :meth:`read` wanted is not among what it returned, as the end of
        a sentence about that body."""
        if partition in self._absent:
            return (f"is gone: partition {partition} no longer exists (the half topic was "
                    f"deleted, or recreated with fewer partitions)")
        start, end = self._bounds.get(partition, (None, None))
        if start is not None and end is not None and offset >= max(start, end):
            return (f"lies past the end of its partition ({end}), which held it before: the "
                    f"half topic was created again, or the broker lost records (an unclean "
                    f"leader election)")
        return "is no longer in the topic (its retention is shorter than transactions live)"

    def short(self, partition: int, offset: int) -> bool:
        """Whether the last :meth:`read` found the partition ending short of ``offset``."""
        start, end = self._bounds.get(partition, (None, None))
        return (partition not in self._absent and start is not None and offset >= start
                and (end is None or offset >= end))

    def _read_into(self, found: Found, wanted: dict[int, set[int]],
                   consumer_for: ConsumerFor, bounds: dict[int, Bounds] | None = None
                   ) -> dict[int, set[int]]:
        """Reads ``wanted`` into ``found``; returns the offsets it did not find, and puts
        where their partitions start and end (the end as the read found it, if it did) in
        ``bounds``."""
        missing: dict[int, set[int]] = {}
        for partition, offsets in sorted(wanted.items()):
            for start, end in ranges(offsets):
                for rec in read_range(consumer_for, self.topic, partition, start, end,
                                      _READ_TIMEOUT_S, stop_at_end=True):
                    if rec.offset in offsets:
                        found[(partition, rec.offset)] = rec
            if left := {o for o in offsets if (partition, o) not in found}:
                missing[partition] = left
                if bounds is not None:  # where the partition starts and ends, for why
                    tp = TopicPartition(self.topic, partition)
                    consumer = consumer_for(False)
                    bounds[partition] = (consumer.beginning_offsets([tp])[tp],
                                         consumer.highwater(tp))
        return missing

    def _confirm(self, found: Found, missing: dict[int, set[int]]) -> None:
        """Reads ``missing`` again with a brand-new consumer (nothing it knows comes from
        before this read), in the partitions that exist, and notes where they end."""
        exists = self._partitions()
        self._absent = {p for p in missing if p not in exists}
        still = {p: offsets for p, offsets in missing.items() if p in exists}
        if not still:
            return
        with PatientConsumer(self.settings, **_OPTIONS) as fresh:
            self._read_into(found, still, fresh, self._bounds)

    def hold_short(self, partitions: Mapping[int, int]) -> None:
        """``partitions``: {partition: the lowest offset of a wanted body it ends short of}
        after :meth:`read`. Raises :class:`SendFailed` (the batch runs again) unless each
        has a leader and enough replicas in sync, and has been found short of bodies for
        ``SHORT_SETTLE_S`` (with no such gap between two findings): until then the body may
        be there, not handed out yet."""
        if not partitions:
            return
        servers = str(self.settings.bootstrap_servers)
        now = settle_clock()
        troubles = {p: t for (_, p), t in troubles_of(self.settings, [self.topic]).items()}
        for partition, offset in sorted(partitions.items()):
            end = self._bounds[partition][1]
            where = f"{self.topic}/{partition}"
            key = (servers, self.topic, partition)
            if partition in troubles or end is None:
                _SHORT_SINCE.pop(key, None)
                why = troubles.get(partition, "no end is known for it")
                raise SendFailed(
                    f"{where} ends short of offset {offset}, a half message read before: "
                    f"{why}; a leader short of in-sync replicas keeps its high watermark "
                    f"where it was, and hands out what it acknowledged past it once they are "
                    f"back: the batch runs again")
            since, last = _SHORT_SINCE.get(key, (now, now))
            since = now if now - last > SHORT_SETTLE_S else since  # short again, afresh
            _SHORT_SINCE[key] = (since, now)
            if now - since < SHORT_SETTLE_S:
                raise SendFailed(
                    f"{where} ends at {end}, short of offset {offset}, a half message read "
                    f"before: waiting up to {SHORT_SETTLE_S:.0f} s for its high watermark (a "
                    f"new leader's) before taking it for gone; the batch runs again")

    def _partitions(self) -> set[int]:
        """The half topic's partitions as the broker says now (none: the topic does not
        exist). Any other answer (not authorized, no leader yet) raises: the batch runs
        again."""
        admin = make_admin(self.settings, role="sink")
        try:
            [topic] = admin.describe_topics([self.topic])
        finally:
            close_quietly(admin)
        error = for_code(topic["error_code"])
        if error is UnknownTopicOrPartitionError:
            return set()
        if error is not NoError:
            raise error(f"metadata of {self.topic}")
        return {p["partition_index"] for p in topic["partitions"]}


def gone_bodies(source: BodySource, wanted: Mapping[str, Position]) -> dict[str, str]:
    """``wanted``: {transaction id: where its half message lies}. Returns why each body that
    cannot be read is gone (the end of a sentence about the body); the others are there."""
    positions: dict[int, set[int]] = {}
    for partition, offset in wanted.values():
        positions.setdefault(partition, set()).add(offset)
    records = source.read(positions)
    short: dict[int, int] = {}
    for partition, offset in wanted.values():
        if (partition, offset) not in records and source.short(partition, offset):
            short[partition] = min(offset, short.get(partition, offset))
    source.hold_short(short)
    gone: dict[str, str] = {}
    for txid, (partition, offset) in wanted.items():
        rec = records.get((partition, offset))
        if rec is None:
            gone[txid] = source.why_missing(partition, offset)
        elif isinstance(rec, Unreadable):
            gone[txid] = f"cannot be read: {rec.error}"
        elif rec.key != txid.encode("utf-8"):
            gone[txid] = OTHER_RECORD
    return gone


# The sink's side: bodies read back into the records it writes.

Prepared = tuple[OutputRow, list[tuple[str, bytes]]]


def _body_at(row: OutputRow) -> tuple[int, int] | None:
    """(partition, offset) in the half topic of the body to read back into ``row``, if any."""
    if row.value is None and row.body_offset is not None and row.body_partition is not None:
        return (row.body_partition, row.body_offset)
    return None


def needs_body(row: OutputRow) -> bool:
    return _body_at(row) is not None


def transaction_id_of(row: OutputRow, headers: Sequence[tuple[str, bytes]]) -> bytes | None:
    """The transaction a row is for: a release names it in a header, a check or a discard in
    its key."""
    for name, value in headers:
        if name == H.TRANSACTION_ID:
            return value
    return row.key


def with_bodies(source: BodySource | None, rows: list[Prepared]) -> list[Prepared]:
    """``rows`` with every body that lies in the half topic read back into its value."""
    wanted: dict[int, set[int]] = {}
    for row, _ in rows:
        if (at := _body_at(row)) is not None:
            wanted.setdefault(at[0], set()).add(at[1])
    if not wanted:
        return rows
    if source is None:
        raise SendFailed("records whose bodies lie in the half topic need the sink's option "
                         "half_topic")
    found = source.read(wanted)
    out: list[Prepared] = []
    for prepared in rows:
        row, headers = prepared
        at = _body_at(row)
        if at is None:
            out.append(prepared)
            continue
        rec = found.get(at)
        if rec is None:
            why = source.why_missing(*at)
        elif isinstance(rec, Unreadable):
            why = f"cannot be read: {rec.error}"
        elif rec.key != transaction_id_of(row, headers):
            why = OTHER_RECORD
        else:
            out.append((row._replace(value=rec.value), headers))
            continue
        raise SendFailed(f"the body of the {row.kind} record for {row.topic}, "
                         f"{source.topic}/{row.body_partition} offset {row.body_offset}, {why} "
                         f"since it was read in this batch: the batch runs again")
    return out
