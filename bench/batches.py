"""Every micro-batch of the benchmark's queries, as Spark reports it (no sampling)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from txstream.streaming.engine.key_metrics import Counted
from txstream.streaming.engine.metric_totals import counts_of, summaries_of
from txstream.streaming.engine.progress import JsonProgressListener

__all__ = ["Batch", "BatchLog", "percentile", "parts_p50"]


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) by linear interpolation; None without values."""
    import numpy as np

    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q * 100))


def parts_p50(batches: list[Batch]) -> dict[str, float | None]:
    """The median of each part of Spark's ``durationMs`` over ``batches``."""
    names = sorted({name for b in batches for name in b.parts_ms})
    return {name: percentile([b.parts_ms.get(name, 0) for b in batches], 0.5) for name in names}


@dataclass(frozen=True)
class Batch:
    query: str
    batch_id: int
    input_rows: int
    duration_ms: int  # triggerExecution: the whole micro-batch
    add_batch_ms: int  # the query's work: read, operator, sink
    released: int
    checks: int
    halves: int
    state_rows: int
    state_memory_bytes: int
    parts_ms: dict[str, int]  # Spark's durationMs: latestOffset, queryPlanning, addBatch, ...


class BatchLog(JsonProgressListener):
    """Collects a :class:`Batch` per progress event of every query of the session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.batches: list[Batch] = []

    def of(self, query: str, since: int = 0) -> list[Batch]:
        with self._lock:
            return [b for b in self.batches[since:] if b.query == query]

    def mark(self) -> int:
        with self._lock:
            return len(self.batches)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        counts = counts_of(summaries_of(p))
        durations = p.durationMs or {}
        ops = list(p.stateOperators or [])
        batch = Batch(
            query=str(p.name),
            batch_id=int(p.batchId),
            input_rows=int(p.numInputRows or 0),
            duration_ms=int(durations.get("triggerExecution", 0)),
            add_batch_ms=int(durations.get("addBatch", 0)),
            released=counts.get(Counted.COMMITS, 0),
            checks=counts.get(Counted.CHECKS_SENT, 0),
            halves=counts.get(Counted.HALF_MESSAGES, 0),
            state_rows=sum(int(o.numRowsTotal) for o in ops),
            state_memory_bytes=sum(int(o.memoryUsedBytes) for o in ops),
            parts_ms={k: int(v) for k, v in durations.items()},
        )
        with self._lock:
            self.batches.append(batch)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
