"""What the recovery demo sees on the topics, read as they grow on a thread of its own.

The real topic says what was released: every record, copies included, with its transaction id,
place and time (the record's timestamp, the sink's clock when it wrote it). The history topic
says which transactions the coordinator rolled back or discarded, and when each note was
written. Nothing here comes from the coordinator's counters.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from txstream.errors import MalformedRecord, TxStreamError
from txstream.kafka import KafkaSettings, TopicReader
from txstream.outputs import decode_history, decode_visible
from txstream.state.effects import NoteKind
from txstream.topics import Topics

__all__ = ["Release", "TopicWatch"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Release:
    """One record on the real topic."""

    txid: str
    at: float  # the record's timestamp, epoch seconds
    partition: int
    offset: int


class TopicWatch:
    """The real topic's records and the history's outcomes, kept up to date until closed."""

    def __init__(self, settings: KafkaSettings, topics: Topics, real_topic: str) -> None:
        self.real_topic, self.history_topic = real_topic, topics.history
        self._reader = TopicReader(settings, [real_topic, topics.history], fetch_max_wait_ms=50)
        self._lock = threading.Lock()
        self._releases: list[Release] = []
        self._copies: Counter[str] = Counter()
        self._final: dict[str, str] = {}
        self._noted_at: dict[str, float] = {}  # txid -> when its released note was written
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="recovery-watch", daemon=True)

    def start(self) -> TopicWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except (TxStreamError, OSError, ValueError) as exc:  # a paused broker: read on
                log.info("reading the topics: %s", exc)
            except Exception as exc:  # kafka-python's own errors
                log.info("reading the topics: %r", exc)
            self._stop.wait(0.25)

    def poll(self) -> None:
        records = self._reader.read_new(timeout_s=2.0)
        with self._lock:
            for rec in records:
                if rec.topic == self.real_topic:
                    self._take_release(rec)
                else:
                    self._take_history(rec)

    def _take_release(self, r: Any) -> None:
        msg = decode_visible(r.topic, r.key, r.value, r.headers)
        txid = msg.transaction_id or ""
        self._copies[txid] += 1
        self._releases.append(Release(txid, r.timestamp / 1000, r.partition, r.offset))

    def _take_history(self, r: Any) -> None:
        try:
            notes = decode_history(r.value, r.key)
        except MalformedRecord:
            return
        for note in notes:
            txid, event = str(note.get("transaction_id")), str(note.get("event"))
            if event in (NoteKind.ROLLED_BACK, NoteKind.DISCARDED, NoteKind.RELEASE_LOST,
                         NoteKind.RELEASE_REFUSED):
                self._final.setdefault(txid, event)
            elif event == NoteKind.RELEASED:
                self._noted_at.setdefault(txid, r.timestamp / 1000)

    # --- what was seen ------------------------------------------------------------------------

    def copies(self) -> Counter[str]:
        """Records on the real topic per transaction id (a copy counts)."""
        with self._lock:
            return Counter(self._copies)

    def releases(self) -> list[Release]:
        with self._lock:
            return list(self._releases)

    def ended_otherwise(self) -> dict[str, str]:
        """Transactions the history says ended without a release: rolled back, discarded, ..."""
        with self._lock:
            return dict(self._final)

    def noted_at(self, txid: str) -> float | None:
        with self._lock:
            return self._noted_at.get(txid)

    def first_release_after(self, at: float) -> float | None:
        with self._lock:
            return min((r.at for r in self._releases if r.at >= at), default=None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._reader.close()
