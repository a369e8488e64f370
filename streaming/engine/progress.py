"""What the coordinator did, batch by batch: counters from the query's observed metrics.

The operator's outputs are counted inside the query (``Dataset.observe``), so the figures are
Spark's own, arrive with each ``QueryProgressEvent`` on the driver, and need no extra job.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent

from txstream.streaming.engine.board import MetricsBoard

__all__ = ["CoordinatorStats", "JsonProgressListener", "ProgressListener", "COUNTERS",
           "format_batch"]


class _JsonBridge(JStreamingQueryListener):
    """Hands a progress event over as its JSON: one py4j call per event.

    pyspark's own bridge builds the Python progress field by field over py4j and looks a JVM
    class up by name for every observed-metrics row; in the benchmark that took a third of the
    driver JVM's CPU (docs/decisions/0012-spark-settings.md), on a machine where the coordinator
    needs all of it.
    """

    def onQueryProgress(self, jevent: Any) -> None:
        progress = json.loads(jevent.progress().json())
        self.pylistener.onQueryProgress(QueryProgressEvent.fromJson({"progress": progress}))


class JsonProgressListener(StreamingQueryListener):
    """A StreamingQueryListener whose progress events arrive through :class:`_JsonBridge`."""

    @property
    def _jlistener(self) -> Any:
        # Overrides pyspark's (4.2.1, pinned) wrapper of the Python listener for the JVM.
        if not hasattr(self, "_jlistenerobj"):
            from pyspark import SparkContext

            jvm = SparkContext._jvm
            assert jvm is not None
            self._jlistenerobj = jvm.PythonStreamingQueryListenerWrapper(_JsonBridge(self))
        return self._jlistenerobj

COUNTERS = (
    "halves",
    "released",
    "rolled_back",
    "checks_sent",
    "discarded",
    "dead_letters",
    "rejected",
    "duplicates",
    "expired",
)


@dataclass
class CoordinatorStats:
    """Totals since this process started, plus the last batch. Thread-safe."""

    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    batches: int = 0
    input_rows: int = 0
    last_batch_ms: int = 0
    last_batch_id: int = -1
    check_late_max_ms: int = 0
    check_late_sum_ms: int = 0
    visible_lag_sum_ms: int = 0
    visible_lag_count: int = 0
    visible_lag_max_ms: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def pending(self) -> int:
        """Transactions seen by this process and not resolved yet (approximate after restart)."""
        t = self.totals
        return max(0, t["halves"] - t["released"] - t["rolled_back"] - t["discarded"])

    def add_batch(self, progress: Any) -> dict[str, int]:
        observed = (progress.observedMetrics or {}).get("txstream")
        row = observed.asDict() if observed is not None else {}
        batch = {name: int(row.get(name) or 0) for name in COUNTERS}
        with self.lock:
            for name, value in batch.items():
                self.totals[name] += value
            self.batches += 1
            self.input_rows += int(progress.numInputRows or 0)
            self.last_batch_id = int(progress.batchId)
            self.last_batch_ms = int((progress.durationMs or {}).get("triggerExecution", 0))
            late_max = int(row.get("check_late_max_ms") or 0)
            self.check_late_max_ms = max(self.check_late_max_ms, late_max)
            self.check_late_sum_ms += int(row.get("check_late_sum_ms") or 0)
            self.visible_lag_sum_ms += int(row.get("visible_lag_sum_ms") or 0)
            self.visible_lag_count += int(row.get("visible_lag_count") or 0)
            lag_max = int(row.get("visible_lag_max_ms") or 0)
            self.visible_lag_max_ms = max(self.visible_lag_max_ms, lag_max)
        return batch

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                **self.totals,
                "pending": self.pending,
                "batches": self.batches,
                "input_rows": self.input_rows,
                "last_batch_ms": self.last_batch_ms,
                "check_late_max_ms": self.check_late_max_ms,
                "visible_lag_avg_ms": (
                    self.visible_lag_sum_ms / self.visible_lag_count
                    if self.visible_lag_count else 0.0
                ),
                "visible_lag_max_ms": self.visible_lag_max_ms,
            }


def format_batch(progress: Any, batch: dict[str, int], stats: CoordinatorStats) -> str:
    return (
        f"batch {progress.batchId}: {progress.numInputRows} events in "
        f"{stats.last_batch_ms} ms | released {batch['released']} rolled back "
        f"{batch['rolled_back']} checks {batch['checks_sent']} discarded {batch['discarded']} "
        f"dead letters {batch['dead_letters']} | pending ~{stats.pending}"
    )


class ProgressListener(JsonProgressListener):
    """Feeds :class:`CoordinatorStats` and the labelled :class:`MetricsBoard`; prints one line
    per batch that did something."""

    def __init__(
        self,
        stats: CoordinatorStats | None = None,
        emit: Callable[[str], None] | None = None,
        query_name: str | None = None,
        board: MetricsBoard | None = None,
    ) -> None:
        self.stats = stats or CoordinatorStats()
        self.board = board or MetricsBoard(open_known=False)
        self.emit = emit
        self.query_name = query_name
        self.errors: list[str] = []

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if self.query_name and progress.name != self.query_name:
            return
        batch = self.stats.add_batch(progress)
        self.board.add_progress(progress)
        if self.emit and (progress.numInputRows or any(batch.values())):
            self.emit(format_batch(progress, batch, self.stats))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            self.errors.append(str(event.exception).splitlines()[0])
