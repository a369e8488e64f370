"""A thread pool with a bounded queue, like RocketMQ's check executor.

Python's ``ThreadPoolExecutor`` queues without limit; a flood of back-check requests would then
pile up in memory while their records count as taken. Here a full queue refuses the task, so
the check consumer leaves the record uncommitted and fetches it again later.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from txstream.errors import TxStreamError

__all__ = ["BoundedExecutor", "RejectedExecution"]

T = TypeVar("T")


class RejectedExecution(TxStreamError, RuntimeError):
    """The executor's queue is full; the task was not accepted."""


class BoundedExecutor(ThreadPoolExecutor):
    """At most ``max_workers`` running and ``queue_size`` waiting tasks; more are refused."""

    def __init__(
        self,
        max_workers: int = 2,
        queue_size: int = 2000,
        thread_name_prefix: str = "client-transaction-msg-check-thread",
    ) -> None:
        if max_workers < 1 or queue_size < 0:
            raise ValueError("max_workers must be >= 1 and queue_size >= 0")
        super().__init__(max_workers=max_workers, thread_name_prefix=thread_name_prefix)
        self.queue_size = queue_size
        self._slots = threading.BoundedSemaphore(max_workers + queue_size)

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if not self._slots.acquire(blocking=False):
            raise RejectedExecution(
                f"check executor full ({self._max_workers} running, {self.queue_size} queued)"
            )
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._slots.release()
            raise
        # A cancelled task also runs its done callbacks, so its slot comes back too.
        future.add_done_callback(lambda _f: self._slots.release())
        return future
