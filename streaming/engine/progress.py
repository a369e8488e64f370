"""What the coordinator did, batch by batch: the keys' tallies, folded on the driver.

Each state key's call tallies what the core decided (:mod:`txstream.streaming.engine.key_metrics`)
and the query observes the tallies (``Dataset.observe``), so the figures are Spark's own,
arrive with each ``QueryProgressEvent`` on the driver, and need no extra job. The listener
folds them into a :class:`~txstream.streaming.engine.metric_totals.MetricsBoard` and prints a
line per batch that did something.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent

from txstream.sinks.refusal_log import RefusalReader
from txstream.streaming.engine.key_metrics import Counted
from txstream.streaming.engine.metric_totals import MetricsBoard

__all__ = ["JsonProgressListener", "ProgressListener", "format_batch"]


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


def format_batch(progress: Any, counts: Mapping[str, int], pending: int | None) -> str:
    """A batch's line: what it read, what the keys did (``counts``, by metric), and the
    transactions left unresolved (None: not known yet, before the state was read)."""
    duration = int((progress.durationMs or {}).get("triggerExecution", 0))

    def n(name: str) -> int:
        return counts.get(name, 0)

    return (
        f"batch {progress.batchId}: {progress.numInputRows} events in {duration} ms | "
        f"released {n(Counted.COMMITS)} rolled back {n(Counted.ROLLBACKS)} checks "
        f"{n(Counted.CHECKS_SENT)} discarded {n(Counted.DISCARDS)} dead letters "
        f"{n(Counted.DEAD_LETTERS)} | pending {'?' if pending is None else pending}"
    )


class ProgressListener(JsonProgressListener):
    """Feeds the :class:`MetricsBoard`; prints one line per batch that did something."""

    def __init__(
        self,
        emit: Callable[[str], None] | None = None,
        query_name: str | None = None,
        board: MetricsBoard | None = None,
        refusals: RefusalReader | None = None,
    ) -> None:
        self.board = board or MetricsBoard(open_known=False)
        self.refusals = refusals  # releases the broker refused, from the sink's commits
        self.emit = emit
        self.query_name = query_name
        self.errors: list[str] = []

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if self.query_name and progress.name != self.query_name:
            return
        counts = self.board.add_progress(progress)
        if self.refusals is not None:
            refused = self.refusals.new()
            self.board.add_refusals(refused)
            counts[Counted.COMMITS] = counts.get(Counted.COMMITS, 0) - len(refused)
        if self.emit and (progress.numInputRows or any(counts.values())):
            self.emit(format_batch(progress, counts, self.board.view().pending))

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception:
            self.errors.append(str(event.exception).splitlines()[0])
