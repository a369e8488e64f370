"""The push consumer's partitions: which it reads, what each has in flight.

The rebalance listener is the Kafka module's (:class:`txstream.kafka.group.CommitOnRevoke`).
kafka-python runs rebalance callbacks on its IO thread while the polling thread waits inside
``poll``, so the two never change this state at once; pool threads only report back through
the :class:`OffsetTracker` and their jobs' ``done`` events.

A message being consumed holds its id, so a copy of it fetched meanwhile is dropped as a
duplicate: safe while the original's offset holds back the commit. A revoked partition's
tracker is forgotten, so the ids of its messages cancelled or still being consumed are let go:
fetched again, by whichever consumer gets the partition, they are consumed again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from txstream.client.consume_pool import Job
from txstream.client.offsets import OffsetTracker
from txstream.client.retry_hold import HeldRetries
from txstream.errors import SendFailed
from txstream.kafka import ConsumerRecord, TopicPartition

__all__ = ["Partitions", "wait_jobs"]

log = logging.getLogger(__name__)


def wait_jobs(jobs: list[Job], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for job in jobs:
        job.done.wait(max(0.0, deadline - time.monotonic()))


class Partitions:
    """Assigned partitions (``reading`` once positioned), their jobs, their retry records held
    until due, and their bounds: a partition is full while ``pull_threshold`` of its messages
    are taken and not finished (held ones too), or its oldest one not finished is ``max_span``
    offsets behind the next to take."""

    def __init__(self, offsets: OffsetTracker, pull_threshold: int, max_span: int) -> None:
        self.offsets = offsets
        self.pull_threshold = pull_threshold
        self.max_span = max_span
        self.reading: frozenset[TopicPartition] = frozenset()
        self.unpositioned: frozenset[TopicPartition] = frozenset()
        self.held = HeldRetries()
        self._jobs: dict[TopicPartition, dict[Job, Sequence[str | None]]] = {}
        self._lock = threading.Lock()

    def full(self, tp: TopicPartition, offset: int) -> bool:
        count, oldest, _ = self.offsets.pending(tp)
        return count >= self.pull_threshold or (
            oldest is not None and offset - oldest >= self.max_span)

    def past_span(self, tp: TopicPartition) -> int | None:
        """The offset of a held record that is ``max_span`` behind the next to take, and is
        the oldest not finished: it alone keeps the partition full. None while ``max_span``
        records or more are held: requeued, they would come round again and again."""
        _, oldest, nxt = self.offsets.pending(tp)
        if (oldest is not None and nxt is not None and nxt - oldest >= self.max_span
                and self.held.holds(tp, oldest) and self.held.count(tp) < self.max_span):
            return oldest
        return None

    def requeue_past_span(self, requeue: Callable[[ConsumerRecord], None]) -> None:
        """A held record ``max_span`` behind the next to take would stop its partition until
        it is due (up to the longest retry delay): ``requeue`` writes it again, as it is, at
        the retry topic's end, and its offset is finished once that was acknowledged."""
        for tp in self.reading:
            while (offset := self.past_span(tp)) is not None:
                entry = self.held.pop(tp, offset)
                assert entry is not None  # past_span found it held
                due, rec, msg = entry
                try:
                    requeue(rec)
                except SendFailed as exc:
                    log.warning("cannot requeue %s (%s); holding it", msg.msg_id, exc)
                    self.held.hold(tp, due, rec, msg)
                    return
                self.offsets.finish(tp, offset, True)

    def to_pause(self) -> set[TopicPartition]:
        """Partitions not to fetch now: not positioned, or full."""
        out = set(self.unpositioned)
        for tp in self.reading:
            nxt = self.offsets.pending(tp)[2]
            if nxt is not None and self.full(tp, nxt):
                out.add(tp)
        return out

    def job(self, tp: TopicPartition, fn: Callable[[], None], ids: Sequence[str | None]
            ) -> Job:
        """A job consuming the messages ``ids`` of ``tp``."""
        def done(job: Job) -> None:
            if not job.cancelled:
                with self._lock:
                    self._jobs.get(tp, {}).pop(job, None)

        job = Job(fn, on_done=done)
        with self._lock:
            self._jobs.setdefault(tp, {})[job] = ids
        return job

    def unfinished_ids(self, tps: set[TopicPartition]) -> list[str | None]:
        """The ids of the jobs of ``tps`` cancelled or still running."""
        with self._lock:
            return [i for tp in tps for job, ids in self._jobs.get(tp, {}).items()
                    if job.cancelled or not job.done.is_set() for i in ids]

    def jobs_of(self, tps: set[TopicPartition] | None = None) -> list[Job]:
        with self._lock:
            return [j for tp, jobs in self._jobs.items() if tps is None or tp in tps
                    for j in jobs if not j.done.is_set()]

    def settle(self, tps: set[TopicPartition], timeout_s: float) -> None:
        """Revoked or lost: their queued messages are left to the next owner, the ones being
        consumed are waited for up to ``timeout_s``."""
        jobs = self.jobs_of(tps)
        for job in jobs:
            job.cancel()
        wait_jobs(jobs, timeout_s)

    def assigned(self, tps: set[TopicPartition]) -> None:
        self.offsets.forget(tps)
        self.held.forget(tps)
        self.unpositioned = self.unpositioned | tps

    def positioned(self, tps: frozenset[TopicPartition]) -> None:
        self.unpositioned = self.unpositioned - tps
        self.reading = self.reading | tps

    def forget(self, tps: set[TopicPartition]) -> None:
        self.offsets.forget(tps)
        self.held.forget(tps)  # unfinished: the partition's next owner reads them again
        with self._lock:
            for tp in tps:
                self._jobs.pop(tp, None)
        self.reading = self.reading - tps
        self.unpositioned = self.unpositioned - tps
