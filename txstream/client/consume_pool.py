"""The push consumer's thread pool, like Java's ``consumeExecutor``.

``min_threads`` threads always run; more, up to ``max_threads``, start while jobs wait and no
thread is idle, and stop again after ``keep_alive_s`` without work. (Java's pool, fed by an
unbounded queue, never grows past its core size; this one does what the two settings say.)
The queue itself is not bounded here: the consumer bounds what it hands over, per partition.
A job not started yet can be cancelled, so a revoked partition's queued messages are left to
its next owner instead of being consumed while the group rebalances.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["ConsumePool", "Job"]

log = logging.getLogger(__name__)


class Job:
    """One call on a pool thread. ``done`` is set once it ran or was cancelled."""

    __slots__ = ("_fn", "_lock", "_on_done", "_state", "_told", "done")

    def __init__(self, fn: Callable[[], None],
                 on_done: Callable[[Job], None] | None = None) -> None:
        self._fn = fn
        self._on_done = on_done
        self._lock = threading.Lock()
        self._state = "queued"
        self._told = False
        self.done = threading.Event()

    def cancel(self) -> bool:
        """Cancel the job if it has not started; True if it will not run."""
        with self._lock:
            if self._state == "queued":
                self._state = "cancelled"
            elif self._state != "cancelled":
                return False
        self._finish()
        return True

    @property
    def cancelled(self) -> bool:
        return self._state == "cancelled"

    def run(self) -> None:
        with self._lock:
            if self._state != "queued":
                return
            self._state = "running"
        try:
            self._fn()
        except Exception:  # the consumer handles its own errors: this is a bug
            log.exception("consume job failed")
        finally:
            with self._lock:
                self._state = "finished"
            self._finish()

    def _finish(self) -> None:
        with self._lock:
            if self._told:
                return
            self._told = True
        self.done.set()
        if self._on_done is not None:
            self._on_done(self)


class ConsumePool:
    """Threads named ``<name>_<n>``, as Java's ``ConsumeMessageThread_<group>_<n>``."""

    def __init__(self, min_threads: int, max_threads: int, name: str,
                 keep_alive_s: float = 60.0) -> None:
        self.min_threads = min_threads
        self.max_threads = max_threads
        self.name = name
        self.keep_alive_s = keep_alive_s
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._threads = 0
        self._idle = 0
        self._closed = False
        self._numbers = itertools.count(1)

    @property
    def threads(self) -> int:
        with self._cond:
            return self._threads

    def start(self) -> ConsumePool:
        with self._cond:
            for _ in range(self.min_threads):
                self._spawn()
        return self

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                job.cancel()
                return
            self._queue.append(job)
            if len(self._queue) > self._idle and self._threads < self.max_threads:
                self._spawn()
            self._cond.notify()

    def shutdown(self) -> None:
        """Cancel the jobs not started; threads end after the job they run. Idempotent."""
        with self._cond:
            self._closed = True
            queued, self._queue = list(self._queue), deque()
            self._cond.notify_all()
        for job in queued:
            job.cancel()

    def _spawn(self) -> None:  # under self._cond
        self._threads += 1
        threading.Thread(target=self._work, name=f"{self.name}_{next(self._numbers)}",
                         daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._next_job()
            if job is None:
                return
            job.run()

    def _next_job(self) -> Job | None:
        with self._cond:
            self._idle += 1
            try:
                while not self._queue and not self._closed:
                    woken = self._cond.wait(self.keep_alive_s)
                    if not woken and not self._queue and self._threads > self.min_threads:
                        self._threads -= 1
                        return None
                if not self._queue:  # closed
                    self._threads -= 1
                    return None
                return self._queue.popleft()
            finally:
                self._idle -= 1
