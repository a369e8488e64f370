"""How every command stops: Ctrl-C and SIGTERM, the one way.

:func:`interrupt_on_signals` makes SIGTERM (``docker stop``, a scheduler) end a command as
Ctrl-C does, by raising ``KeyboardInterrupt``, and makes SIGINT do so even in a process a shell
started in the background with SIGINT ignored. :func:`stop_event_on_signals` is for a command
that waits on a py4j call: raising inside it breaks the call, and py4j logs every such break
as a traceback, so there the signals only set an event that the wait loop looks at.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["interrupt_on_signals", "stop_event_on_signals", "reclaim_sigint"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextmanager
def interrupt_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise KeyboardInterrupt inside the block; the handlers that were
    there before come back after it."""
    previous = {signum: signal.signal(signum, _raise_interrupt) for signum in _SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def stop_event_on_signals(stop: threading.Event | None = None) -> threading.Event:
    """An event (``stop``, or a new one) that SIGINT and SIGTERM set, from now on (pyspark
    starts its JVM with SIGINT ignored, so the JVM waits for the stop the event asks for)."""
    stop = stop or threading.Event()
    for signum in _SIGNALS:
        signal.signal(signum, lambda *_: stop.set())
    return stop


def reclaim_sigint() -> None:
    """Take SIGINT back from pyspark: a starting SparkContext installs a handler that cancels
    every job at once, which fails a running query with a screen of errors; a plain
    KeyboardInterrupt lets the command stop it quietly instead."""
    signal.signal(signal.SIGINT, _raise_interrupt)
