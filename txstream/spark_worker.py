"""Settling into a Spark Python worker process: once per process, before txstream's work.

pyspark's daemon runs a full ``gc.collect()`` after every task a reused worker finishes. With
pandas, pyarrow, pyspark and kafka-python imported, a collection walks ~100k objects: 55 ms in
a bare worker here, over 100 ms in a busy one. It sits on every micro-batch's critical path: a
stateful task's timed-out keys go to a second Python runner, often the same worker, whose
command then waits out the collection (docs/decisions/0012-spark-settings.md). ``gc.freeze()``
moves the objects alive now (modules, classes, caches) out of the collector's reach, so those
collections take ~1 ms; everything created later is collected as before, so nothing leaks.
"""

from __future__ import annotations

import gc

__all__ = ["settle"]

_SETTLED = False


def settle() -> None:
    """Freeze the objects the imports made, once per process (cheap to call again)."""
    global _SETTLED
    if not _SETTLED:
        _SETTLED = True
        gc.freeze()
