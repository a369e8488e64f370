"""The coordinator's metrics on the driver: the keys' summaries folded, batch by batch.

Each completed micro-batch brings, in its observed metrics, the summary of every state key it
ran (:mod:`txstream.streaming.engine.key_metrics`): counts and timings are added to the totals since
this process started; what a key holds open replaces what it held before. A key's open
transactions change only when the key runs, so the last summary of each key is exact, and
their sum is the coordinator's pending set by producer group.

After a restart no key has run yet: :func:`seed_from_state` reads each key's summary as of
the last committed batch from the state (:func:`txstream.streaming.engine.state_reader.
read_key_summaries`) once, beside the query's first batch, with the input offsets that batch
had read; every later summary replaces it, also one that came first. Until then the open
counts are not known (:attr:`BoardView.open_known`), and the gauges built on them are left out
rather than shown as zero.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from txstream.sources.offsets import records_of
from txstream.streaming.engine.key_metrics import (
    BUCKETS_MS,
    KEY_SUMMARIES,
    Counted,
    bucket_of,
    decode_summary,
)
from txstream.streaming.engine.query import OBSERVATION

__all__ = ["MetricsBoard", "BoardView", "BATCH_DURATION", "parse_offsets", "seed_from_state",
           "summaries_of", "counts_of"]

BATCH_DURATION = "batch_duration"  # a histogram the driver times itself
_Counter = tuple[str, tuple[str, ...]]  # (metric, label values)
Position = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class _Open:
    batch: int  # the batch the summary is of
    counts: Mapping[tuple[str, str], int]  # (status, producer group) -> transactions
    oldest_born: int | None


@dataclass(frozen=True)
class BoardView:
    """A consistent copy of the board, for one scrape or one health check."""

    counters: Mapping[_Counter, int]
    histograms: Mapping[str, list[int]]  # per-bucket counts (BUCKETS_MS, then +Inf), sum (ms)
    open_counts: Mapping[tuple[str, str], int]
    oldest_born: int | None
    open_known: bool
    consumed: Mapping[Position, int] | None  # the input offsets read up to; None: not known
    batches: int
    input_rows: int  # records read from the half and end topics
    last_batch_at: float | None  # epoch seconds of the last completed batch in this process

    @property
    def pending(self) -> int | None:
        """The unresolved transactions held (a lost release is resolved); None: not known."""
        return sum(self.open_counts.values()) if self.open_known else None


def parse_offsets(text: str | None) -> dict[Position, int]:
    """The topic-partition offsets of a ``txstream-events`` offset (JSON), without the entries
    that are no topic (the tick, the progress time, a recovery)."""
    raw = records_of(json.loads(text)) if text else {}
    return {(topic, int(p)): int(offset) for topic, parts in raw.items()
            if isinstance(parts, dict) for p, offset in parts.items()}


def summaries_of(progress: Any) -> list[dict[str, Any]]:
    """The keys' summaries a micro-batch's progress carries, decoded."""
    observed = (progress.observedMetrics or {}).get(OBSERVATION)
    summaries = observed.asDict().get(KEY_SUMMARIES) if observed is not None else None
    return [decode_summary(text) for text in summaries or ()]


def counts_of(docs: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The counts of keys' summaries by metric, every label summed."""
    counts: dict[str, int] = {}
    for doc in docs:
        for name, *_, n in doc.get("c", ()):
            counts[name] = counts.get(name, 0) + int(n)
    return counts


class MetricsBoard:
    """Totals and the keys' open transactions since this process started. Thread-safe: fed by
    the progress listener, read by the metrics server."""

    def __init__(self, open_known: bool = True) -> None:
        self._lock = threading.Lock()
        self._counters: dict[_Counter, int] = {}
        self._histograms: dict[str, list[int]] = {}
        self._open: dict[int, _Open] = {}
        self._open_known = open_known
        self._consumed: dict[Position, int] | None = None
        self._consumed_batch = -1
        self._batches = 0
        self._input_rows = 0
        self._last_batch_at: float | None = None

    def add_progress(self, progress: Any) -> dict[str, int]:
        """One completed micro-batch (a ``StreamingQueryProgress``); returns its counts by
        metric (every label summed)."""
        docs = summaries_of(progress)
        duration = int((progress.durationMs or {}).get("triggerExecution", 0))
        sources = progress.sources or []
        consumed = parse_offsets(sources[0].endOffset) if sources else None
        batch = int(progress.batchId)
        with self._lock:
            self._batches += 1
            self._input_rows += int(progress.numInputRows or 0)
            self._last_batch_at = time.time()
            self._observe(BATCH_DURATION, duration)
            for doc in docs:
                self._fold(batch, doc)
            if consumed is not None and batch >= self._consumed_batch:
                self._consumed, self._consumed_batch = consumed, batch
        return counts_of(docs)

    def add_refusals(self, refused: Iterable[Any]) -> None:
        """Releases the broker refused (``txstream.sinks.delivery.RefusedRelease``): the keys
        counted each as a commit when they decided it; it is a refusal instead."""
        with self._lock:
            for r in refused:
                self._add((Counted.COMMITS, (r.producer_group, r.topic)), -1)
                self._add((Counted.RELEASES_REFUSED, (r.producer_group, r.topic, r.code)), 1)

    def _add(self, key: _Counter, n: int) -> None:
        self._counters[key] = self._counters.get(key, 0) + n

    def seed(self, batch: int, summaries: Iterable[str],
             consumed: Mapping[Position, int] | None = None) -> None:
        """The keys' summaries as of committed batch ``batch`` (read from the state), and the
        offsets it had read; a key or offsets known from a later batch stay."""
        docs = [decode_summary(text) for text in summaries]
        with self._lock:
            for doc in docs:
                key = int(doc["k"])
                known = self._open.get(key)
                if known is None or known.batch <= batch:
                    self._set_open(key, batch, doc)
            if consumed is not None and batch >= self._consumed_batch:
                self._consumed, self._consumed_batch = dict(consumed), batch
            self._open_known = True

    def mark_open_known(self) -> None:
        """Show the open counts as they are (the state could not be read: they converge as
        keys run)."""
        with self._lock:
            self._open_known = True

    def view(self) -> BoardView:
        with self._lock:
            open_counts: dict[tuple[str, str], int] = {}
            for entry in self._open.values():
                for label, n in entry.counts.items():
                    open_counts[label] = open_counts.get(label, 0) + n
            oldest = min((e.oldest_born for e in self._open.values()
                          if e.oldest_born is not None), default=None)
            return BoardView(
                counters=dict(self._counters),
                histograms={name: list(h) for name, h in self._histograms.items()},
                open_counts=open_counts, oldest_born=oldest, open_known=self._open_known,
                consumed=dict(self._consumed) if self._consumed is not None else None,
                batches=self._batches, input_rows=self._input_rows,
                last_batch_at=self._last_batch_at)

    def totals(self) -> dict[str, int]:
        """The counters since this process started, by metric (every label summed)."""
        with self._lock:
            out: dict[str, int] = {}
            for (name, _), n in self._counters.items():
                out[name] = out.get(name, 0) + n
            return out

    def _fold(self, batch: int, doc: Mapping[str, Any]) -> None:
        for name, *labels, n in doc.get("c", ()):
            key = (name, tuple(labels))
            self._counters[key] = self._counters.get(key, 0) + int(n)
        for name, counts in doc.get("h", {}).items():
            total = self._histograms.setdefault(name, [0] * (len(BUCKETS_MS) + 2))
            for i, n in enumerate(counts):
                total[i] += int(n)
        self._set_open(int(doc["k"]), batch, doc)

    def _set_open(self, key: int, batch: int, doc: Mapping[str, Any]) -> None:
        counts = {(status, group): int(n) for status, group, n in doc.get("p", ())}
        oldest = doc.get("o")
        if counts:
            self._open[key] = _Open(batch, counts, None if oldest is None else int(oldest))
        else:  # an empty key: nothing open, and nothing to remember
            self._open.pop(key, None)

    def _observe(self, name: str, ms: int) -> None:
        total = self._histograms.setdefault(name, [0] * (len(BUCKETS_MS) + 2))
        total[bucket_of(ms)] += 1
        total[-1] += max(0, ms)


def seed_from_state(board: MetricsBoard, spark: Any, checkpoint_dir: str) -> None:
    """Seed ``board`` from the checkpoint's last committed batch (beside the query: a summary
    of a later batch stays, :meth:`MetricsBoard.seed`). A new checkpoint holds nothing open."""
    from txstream.streaming.engine.checkpoint import Checkpoint
    from txstream.streaming.engine.state_reader import read_key_summaries

    checkpoint = Checkpoint(spark, checkpoint_dir)
    batch = checkpoint.last_committed_batch()
    if batch is None:
        board.seed(-1, (), {})  # nothing read yet: every record is behind
        return
    try:
        summaries = read_key_summaries(spark, checkpoint.location, batch)
    except Exception as exc:  # the metrics must never stop the coordinator from starting
        logging.getLogger(__name__).warning(
            "pending gauges unknown until every key has run: the state of batch %d could not "
            "be read (%s)", batch, str(exc).splitlines()[0] if str(exc) else exc)
        return
    text = checkpoint.read_text(f"offsets/{batch}")
    # offsets/N: "v1", the batch's metadata, then one line per source: ours is the only one.
    consumed = parse_offsets(text.splitlines()[-1]) if text else None
    board.seed(batch, summaries, consumed)
