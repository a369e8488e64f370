"""Settling into a Spark Python worker process: once per process, before txstream's work.

pyspark's daemon runs a full ``gc.collect()`` after every task a reused worker finishes. With
pandas, pyarrow, pyspark and kafka-python imported, a collection walks every object they
made, and it sits on every micro-batch's critical path: a stateful task's timed-out keys go to
a second Python runner, often the same worker, whose command then waits out the collection
(figures: docs/decisions/0012-spark-settings.md). ``gc.freeze()`` moves the objects alive now
(modules, classes, caches) out of the collector's reach; everything created later is collected
as before, so nothing leaks.
"""

from __future__ import annotations

import gc
import sys
from types import TracebackType

__all__ = ["settle", "quiet_hang_up"]

_SETTLED = False


def settle() -> None:
    """Freeze the objects the imports made, once per process (cheap to call again)."""
    global _SETTLED
    if not _SETTLED:
        _SETTLED = True
        gc.freeze()


_HANG_UP = (EOFError, BrokenPipeError, ConnectionResetError)


def _hung_up(error: BaseException | None) -> bool:
    """Whether ``error``, and every error it arose from, says the JVM closed the socket."""
    seen = 0
    while error is not None and seen < 10:
        if not isinstance(error, _HANG_UP):
            return False
        error, seen = error.__context__, seen + 1
    return seen > 0


def quiet_hang_up() -> None:
    """In the Python process Spark plans a stream's source or sink in: when the query stops,
    the JVM closes that process's socket while it waits for its next call, and pyspark's
    runner dies on it with a chained EOFError/BrokenPipeError traceback on the user's
    terminal. That ending is the normal one; any other failure is still printed."""
    previous = sys.excepthook
    if getattr(previous, "_txstream_quiet", False):
        return

    def hook(kind: type[BaseException], error: BaseException,
             trace: TracebackType | None) -> None:
        if not _hung_up(error):
            previous(kind, error, trace)

    hook._txstream_quiet = True  # type: ignore[attr-defined]
    sys.excepthook = hook
