"""Feeding the index from Kafka: catch up to the topics' ends, now (``txstream history``) or
every half second from a background thread (``txstream console``).

Reading is the Kafka module's (:class:`txstream.kafka.EndProbe` for where each partition
ends, :func:`txstream.kafka.read_range` for its records), from the offsets the index stored.
A record that cannot be read or decoded is logged and skipped: one bad record never stops
the feed, and it is not read again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from txstream.console.index import Index
from txstream.console.record_entries import Entry, Source, entries_of
from txstream.errors import MalformedRecord, TxStreamError
from txstream.kafka import (
    EndProbe,
    KafkaSettings,
    PatientConsumer,
    Unreadable,
    partition_ends,
    read_range,
)
from txstream.topics import Topics

__all__ = ["FeedStats", "IndexFeed", "Feeder", "FeederStatus", "catch_up"]

log = logging.getLogger(__name__)

_ENTRIES_PER_CHUNK = 5000  # entries applied per SQLite transaction
_READ_TIMEOUT_S = 30.0


class FeedStats(NamedTuple):
    """What one catch-up did."""

    records: int  # records read
    entries: int  # new entries stored
    skipped: int  # records that could not be read or decoded
    seconds: float


class IndexFeed:
    """Reads a coordinator's history, discard and dead-letter topics (and its half topic, for
    the half messages' ids and keys, with ``read_half``) into ``index``."""

    def __init__(self, index: Index, settings: KafkaSettings, topics: Topics, *,
                 read_half: bool = True, read_timeout_s: float = _READ_TIMEOUT_S) -> None:
        index.bind("history_topic", topics.history)
        self.index = index
        self._sources = {topics.history: Source.HISTORY, topics.discard: Source.DISCARD,
                         topics.dead_letter: Source.DEAD_LETTER}
        if read_half:
            self._sources[topics.half] = Source.HALF
        self._half_topic = topics.half
        self._timeout_s = read_timeout_s
        self._settings = settings
        self._probe = EndProbe(settings, role="console")
        self._readers = PatientConsumer(settings, role="console",
                                        max_poll_records=_ENTRIES_PER_CHUNK)

    def _ends(self, stored: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        # Fetching at the stored offset: the broker sends (nearly) nothing back but the end.
        return self._probe.topic_ends(self._sources, stored, self._timeout_s)

    def _past_the_end(self, stored: dict[tuple[str, int], int],
                      ends: dict[tuple[str, int], int]) -> bool:
        past = {topic for (topic, p), end in ends.items() if stored.get((topic, p), 0) > end}
        # Confirmed by a client of its own before the index is reset: a reset costs a whole
        # re-read.
        return any(stored.get((topic, p), 0) > end for topic in sorted(past)
                   for p, end in partition_ends(self._settings, topic).items())

    def catch_up(self) -> FeedStats:
        """Read every partition from its stored offset to its current end."""
        started = time.monotonic()
        stored = self.index.offsets()
        ends = self._ends(stored)
        if self._past_the_end(stored, ends):
            # The topics were recreated, or this is another broker: what the index holds is
            # not theirs.
            self.index.reset("a stored offset lies past its partition's end")
            stored = {}
        records = entries = skipped = 0
        for (topic, partition), end in sorted(ends.items()):
            start = stored.get((topic, partition), 0)
            if start < end:
                read, new, bad = self._read(topic, partition, start, end)
                records, entries, skipped = records + read, entries + new, skipped + bad
        return FeedStats(records, entries, skipped, time.monotonic() - started)

    def _read(self, topic: str, partition: int, start: int, end: int) -> tuple[int, int, int]:
        source = self._sources[topic]
        chunk: list[Entry] = []
        records = new = skipped = 0
        for rec in read_range(self._readers, topic, partition, start, end, self._timeout_s):
            records += 1
            found = _decode(source, rec, self._half_topic)
            if found is None:
                skipped += 1
            else:
                chunk += found
            if len(chunk) >= _ENTRIES_PER_CHUNK:
                new += self.index.apply(topic, partition, chunk, rec.offset + 1)
                chunk = []
        new += self.index.apply(topic, partition, chunk, end)
        return records, new, skipped

    def close(self) -> None:
        self._probe.close()
        self._readers.close()

    def __enter__(self) -> IndexFeed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _decode(source: str, rec: Any, half_topic: str) -> list[Entry] | None:
    """The record's entries; None, with a log line, for a record that is bad input."""
    where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
    if isinstance(rec, Unreadable):
        log.warning("index: skipped %s: %s", where, rec.error)
        return None
    try:
        return entries_of(source, rec, half_topic)
    except MalformedRecord as exc:
        log.warning("index: skipped %s: %s", where, exc.reason)
    except Exception as exc:  # a record nobody foresaw must not stop the feed either
        log.warning("index: skipped %s: cannot decode it (%s: %s)", where,
                    type(exc).__name__, exc)
    return None


def catch_up(index: Index, settings: KafkaSettings, topics: Topics, *,
             read_half: bool = True) -> FeedStats:
    """Bring ``index`` up to the topics' current ends, once."""
    with IndexFeed(index, settings, topics, read_half=read_half) as feed:
        return feed.catch_up()


class FeederStatus(NamedTuple):
    """How the background feed is doing, for the console's pages."""

    caught_up_ms: int | None  # wall clock of the last catch-up that completed
    rounds: int
    records: int  # records read since the start
    error: str | None  # why the last round failed, if it did


class Feeder:
    """Keeps an index fed from a background thread: a catch-up every ``interval_s``.

    ``make_feed`` makes the feed in the thread, and again after a failed round (the broker
    down, a client in a bad state): the console starts, and serves what the index holds,
    whether Kafka is there or not.
    """

    def __init__(self, make_feed: Callable[[], IndexFeed], interval_s: float = 0.5) -> None:
        self._make_feed = make_feed
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txstream-console-feed",
                                        daemon=True)
        self._status = FeederStatus(None, 0, 0, None)

    @property
    def status(self) -> FeederStatus:
        return self._status

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def _round(self, feed: IndexFeed) -> None:
        stats = feed.catch_up()
        s = self._status
        self._status = FeederStatus(int(time.time() * 1000), s.rounds + 1,
                                    s.records + stats.records, None)

    def _run(self) -> None:
        feed: IndexFeed | None = None
        while not self._stop.is_set():
            try:
                feed = feed or self._make_feed()
                self._round(feed)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}" if not isinstance(
                    exc, TxStreamError) else str(exc)
                if error != self._status.error:  # one line per new trouble, not per round
                    log.warning("index feed: %s (trying again)", error)
                self._status = self._status._replace(error=error)
                if feed is not None:
                    feed.close()
                    feed = None
                self._stop.wait(max(self._interval_s, 2.0))
                continue
            self._stop.wait(self._interval_s)
        if feed is not None:
            feed.close()

    def stop(self, timeout_s: float = 35.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
