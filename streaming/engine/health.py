"""Is the coordinator keeping up? The input lag, watched from the driver, and ``/healthz``.

The lag of an input partition is its end (the fetch high watermark, read by this process every
few seconds) less the offset the last completed micro-batch read up to (its progress's end
offset, :class:`txstream.streaming.engine.metric_totals.MetricsBoard`). A stuck batch reports
no progress, so the ends are read here, not taken from the query's progress.

The same sampling watches the broker: a sample that gets no answer within
``PROBE_TIMEOUT_S`` marks the broker unreachable (and the lag unknown, never the last figure
shown again) until a sample succeeds. With the default interval the broker's loss shows within
``interval_s + PROBE_TIMEOUT_S`` (13 s).

The same sampling asks the cluster's metadata for the partitions of the topics the coordinator
writes (its own and the real topics it released to): one without a leader, or below its
``min.insync.replicas``, refuses the coordinator's writes (``txstream.kafka.partition_health``).

``/healthz`` says 503 with the reason from the moment the coordinator is asked to stop, when
the query failed or stopped, when the broker does not answer, when a partition it writes to
refuses writes (named with its topic), when the input lag grew for
longer than a threshold (or was not read at all while records waited), or when a timer is
overdue by more than a threshold; otherwise 200. An idle coordinator with no timer due is
healthy: it runs no batch because it has nothing to do.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txstream.kafka import EndProbe, KafkaSettings, make_admin
from txstream.kafka.partition_health import (
    PartitionTrouble,
    min_insync_replicas,
    partition_troubles,
)
from txstream.kafka.protocols import Admin
from txstream.streaming.engine.config import HealthThresholds
from txstream.streaming.engine.metric_totals import MetricsBoard, Position
from txstream.timer_schedule import Schedule

__all__ = ["LagWatch", "LagReading", "HealthCheck", "HealthThresholds", "query_problem",
           "PROBE_TIMEOUT_S"]

log = logging.getLogger(__name__)

# How long one sample waits for the broker before calling it unreachable. A healthy broker
# answers a fetch at the partitions' ends in milliseconds; 8 s leaves a loaded one room.
PROBE_TIMEOUT_S = 8.0
# Partitions named in one /healthz reason; the count of the others follows.
SHOWN_TROUBLES = 5


@dataclass(frozen=True)
class LagReading:
    """The lag and the broker's absence at one instant: read apart, a probe could pass its
    timeout between them, and one body would show a lag beside "unreachable"."""

    lag: dict[Position, int] | None  # None: not known (yet, or no more: the broker is away)
    away: tuple[float, str] | None  # (seconds, why) the broker has not answered; None: it does


class LagWatch:
    """Samples every input partition's lag every ``interval_s`` on a daemon thread."""

    def __init__(self, kafka: KafkaSettings, topics: Sequence[str], board: MetricsBoard,
                 interval_s: float = 5.0, window_s: float = 300.0,
                 writes_to: Callable[[], Sequence[str]] | None = None) -> None:
        """``writes_to``: the topics whose partitions are watched for refusing writes."""
        self._kafka, self._topics, self._board = kafka, list(topics), board
        self._writes_to = writes_to
        self._admin: Admin | None = None
        self._min_isr: dict[str, int] = {}
        self._troubles: list[PartitionTrouble] = []
        # Since when (monotonic) some watched partition has been in trouble; when last seen.
        self._troubled_since: float | None = None
        self._last_troubled_at: float | None = None
        self._admin_lock = threading.Lock()  # the sampling thread's admin client, shared
        self._interval_s, self._window_s = interval_s, window_s
        self._lock = threading.Lock()
        self._lag: dict[Position, int] | None = None
        # Since when (monotonic) the broker has not answered, and why; None: it answers.
        self._unreachable: tuple[float, str] | None = None
        self._last_unreachable_at: float | None = None
        self._sampling_since: float | None = None  # a sample in progress, since (monotonic)
        # (monotonic time, total lag, total offsets read) per sample, the last window's worth.
        self._samples: deque[tuple[float, int, int]] = deque()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LagWatch:
        self._thread = threading.Thread(target=self._run, name="txstream-lag", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._drop_admin()

    def troubles(self) -> list[PartitionTrouble]:
        """The watched partitions that refused writes at the last sample."""
        with self._lock:
            return list(self._troubles)

    def reading(self) -> LagReading:
        """The lag and the broker's absence, both as of now."""
        now = time.monotonic()
        with self._lock:
            if self._unreachable is not None:
                since, why = self._unreachable
                away: tuple[float, str] | None = (now - since, why)
            else:
                away = self._unanswered(now)
            lag = None if self._lag is None or away is not None else dict(self._lag)
            return LagReading(lag, away)

    def lag(self) -> dict[Position, int] | None:
        """Records behind each partition's end at the last sample; None: not known (yet, or
        no more: the broker does not answer)."""
        return self.reading().lag

    def unreachable(self) -> tuple[float, str] | None:
        """(seconds, why) the broker has not answered for; None while it answers. A sample
        still waiting after ``PROBE_TIMEOUT_S`` counts: a client may wait far longer."""
        return self.reading().away

    def unreachable_since(self, since: float) -> bool:
        """Whether the broker was found unreachable at or after ``since`` (monotonic)."""
        now = time.monotonic()
        with self._lock:
            seen = self._last_unreachable_at
            return (seen is not None and seen >= since) or self._unanswered(now) is not None

    def _unanswered(self, now: float) -> tuple[float, str] | None:
        started = self._sampling_since
        if started is None or now - started <= PROBE_TIMEOUT_S:
            return None
        return now - started, f"no answer within {PROBE_TIMEOUT_S:g} s"

    @property
    def bootstrap_servers(self) -> str:
        return self._kafka.bootstrap_servers

    def sample(self) -> None:
        """Read the partitions' ends once and record the lag against the board's offsets; a
        broker that does not answer is recorded as such, with the lag unknown."""
        consumed = self._board.view().consumed
        with self._lock:
            self._sampling_since = time.monotonic()
        try:
            ends = self._ends(consumed or {})
        except Exception as exc:
            self._lost(exc)
            raise
        # Still sampling: a metadata request left unanswered is the broker's absence too.
        if not self._sample_partitions():
            return
        with self._lock:
            self._unreachable = self._sampling_since = None
        if consumed is None:
            return  # what was read is not known yet (the state could not be read)
        lag = {pos: max(0, end - consumed.get(pos, 0)) for pos, end in ends.items()}
        with self._lock:
            self._lag = lag
            now = time.monotonic()
            self._samples.append((now, sum(lag.values()), sum(consumed.values())))
            # Keep one sample at or before the window's start, so the window is covered.
            while len(self._samples) > 1 and self._samples[1][0] <= now - self._window_s:
                self._samples.popleft()

    def troubled(self) -> tuple[float, str] | None:
        """(seconds, why) some watched partition has had no leader or too few replicas in
        sync for; None when none has at the last sample."""
        with self._lock:
            if self._troubled_since is None or not self._troubles:
                return None
            why = "; ".join(map(str, self._troubles))
            return time.monotonic() - self._troubled_since, why

    def troubled_since(self, since: float) -> bool:
        """Whether a watched partition was found in trouble at or after ``since``."""
        with self._lock:
            return self._last_troubled_at is not None and self._last_troubled_at >= since

    def sample_partitions(self) -> None:
        """Ask the metadata about the watched partitions now (after a failed batch: the next
        sample may come too late to tell what failed it). A sample already asking is waited
        for instead: its answer is as fresh."""
        if self._admin_lock.acquire(blocking=False):
            self._admin_lock.release()
            self._sample_partitions()
        else:
            with self._admin_lock:
                pass

    def _sample_partitions(self) -> bool:
        """The watched partitions that refuse writes; unchanged when the metadata is not had.
        False when the broker left the request unanswered (then marked unreachable): a
        client waits out its request timeout, and /healthz must not say 200 meanwhile."""
        topics = sorted(set(self._writes_to())) if self._writes_to is not None else []
        if not topics:
            return True
        with self._admin_lock:
            asked = time.monotonic()
            troubles = self._described(topics)
        if isinstance(troubles, Exception):
            if time.monotonic() - asked < PROBE_TIMEOUT_S:
                return True  # refused at once (an ACL, an old broker): not an absence
            with self._lock:
                self._sampling_since = self._sampling_since or asked
            self._lost(troubles)
            return False
        now = time.monotonic()
        with self._lock:
            self._troubles = troubles
            if troubles:
                self._troubled_since = self._troubled_since or now
                self._last_troubled_at = now
            else:
                self._troubled_since = None
        return True

    def _described(self, topics: list[str]) -> list[PartitionTrouble] | Exception:
        try:
            if self._admin is None:
                wait_ms = int(PROBE_TIMEOUT_S * 1000)
                self._admin = make_admin(self._kafka, request_timeout_ms=wait_ms)
            unknown = [t for t in topics if t not in self._min_isr]
            if unknown:
                told = min_insync_replicas(self._admin, unknown)
                self._min_isr.update({t: told.get(t, 1) for t in unknown})
            return partition_troubles(self._admin, topics, self._min_isr)
        except Exception as exc:  # metadata not had: said again at the next sample
            log.debug("partitions not described: %s", exc)
            self._drop_admin()
            return exc

    def _drop_admin(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            try:
                admin.close()
            except Exception as exc:  # closing a client of a broker gone
                log.debug("admin client not closed: %s", exc)

    def _lost(self, exc: Exception) -> None:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        now = time.monotonic()
        with self._lock:
            started, self._sampling_since = self._sampling_since or now, None
            self._lag = None  # unknown: the last figure is no longer true
            self._samples.clear()
            since = self._unreachable[0] if self._unreachable is not None else started
            self._unreachable = (since, why)
            self._last_unreachable_at = now

    def falling_behind(self, window_s: float) -> str | None:
        """Why the input is not being kept up with over the last ``window_s``, or None."""
        with self._lock:
            samples = list(self._samples)
        start = time.monotonic() - window_s
        if not samples or samples[0][0] > start:
            return None  # not watched for a whole window yet
        # The window's samples, from the last one at or before its start.
        first = max(i for i, (t, _, _) in enumerate(samples) if t <= start)
        samples = samples[first:]
        if any(lag == 0 for _, lag, _ in samples):
            return None
        lags = [lag for _, lag, _ in samples]
        if samples[-1][2] == samples[0][2]:
            return (f"no input read for {window_s:g}s while {lags[-1]} records wait "
                    f"(--health-lag-growing)")
        middle = samples[0][0] + (samples[-1][0] - samples[0][0]) / 2
        early = [lag for t, lag, _ in samples if t <= middle]
        late = [lag for t, lag, _ in samples if t > middle]
        if early and late and min(late) > max(early):
            return (f"input lag grew for {window_s:g}s: {lags[0]} -> {lags[-1]} records "
                    f"(--health-lag-growing)")
        return None

    def _ends(self, starts: dict[Position, int]) -> dict[Position, int]:
        # A position is never below 0 (one read from a damaged checkpoint would be).
        begin = {pos: max(0, offset) for pos, offset in starts.items()}
        # Fail within about PROBE_TIMEOUT_S (a new client waits 30 s for a broker by default).
        wait_ms = int(PROBE_TIMEOUT_S * 1000)
        with EndProbe(self._kafka, bootstrap_timeout_ms=wait_ms,
                      request_timeout_ms=wait_ms + 1000) as probe:
            return probe.topic_ends(self._topics, begin, timeout_s=PROBE_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception as exc:  # a broker away: said by unreachable() and /healthz
                log.debug("input lag not sampled: %s", exc)
            self._stop.wait(self._interval_s)


def query_problem(coordinator: Any) -> str | None:
    """Why the coordinator's query is not running, or None while it runs."""
    query = coordinator.query
    if query is None:
        return "query stopped"
    try:
        if query.isActive:
            return None
    except Exception as exc:  # py4j: the JVM that ran the query has exited
        return f"the Spark JVM is gone ({type(exc).__name__})"
    failure = coordinator.failure()
    return f"query failed: {failure}" if failure else "query stopped"


class HealthCheck:
    """The verdict of ``/healthz``: (healthy, a small JSON-able body). ``stopping`` says
    whether the coordinator was asked to stop: from then on the verdict is 503 "stopping"."""

    def __init__(self, problem: Callable[[], str | None], board: MetricsBoard,
                 lag: LagWatch | None = None, schedule: Path | None = None,
                 thresholds: HealthThresholds | None = None,
                 stopping: Callable[[], bool] | None = None) -> None:
        self._problem, self._board, self._lag = problem, board, lag
        self._schedule = schedule
        self._stopping = stopping or (lambda: False)
        self.thresholds = thresholds or HealthThresholds()

    def check(self) -> tuple[bool, dict[str, Any]]:
        if self._stopping():
            return False, {"status": "stopping", "reasons": ["stopping"]}
        view = self._board.view()
        body: dict[str, Any] = {"batches": view.batches}
        if view.last_batch_at is not None:
            body["last_batch_age_s"] = round(time.time() - view.last_batch_at, 3)
        reading = self._lag.reading() if self._lag is not None else None
        if reading is not None:
            lag = reading.lag
            body["input_lag"] = None if lag is None else sum(lag.values())  # None: unknown
        overdue = self._overdue_s()
        if overdue is not None:
            body["timer_overdue_s"] = round(overdue, 3)
        reasons = [r for r in (self._problem(), self._broker_reason(reading),
                               self._partition_reason(), self._lag_reason(),
                               self._timer_reason(overdue)) if r]
        body["status"] = "unhealthy" if reasons else "ok"
        if reasons:
            body["reasons"] = reasons
        return not reasons, body

    def _broker_reason(self, reading: LagReading | None) -> str | None:
        if self._lag is None or reading is None or reading.away is None:
            return None
        seconds, why = reading.away
        return f"broker {self._lag.bootstrap_servers} unreachable for {seconds:.0f}s ({why})"

    def _partition_reason(self) -> str | None:
        troubles = self._lag.troubles() if self._lag is not None else []
        if not troubles:
            return None
        shown = "; ".join(str(t) for t in troubles[:SHOWN_TROUBLES])
        more = len(troubles) - SHOWN_TROUBLES
        return f"partitions refusing writes: {shown}" + (f" (and {more} more)" if more > 0 else "")

    def _lag_reason(self) -> str | None:
        if self._lag is None:
            return None
        return self._lag.falling_behind(self.thresholds.lag_growing_s)

    def _timer_reason(self, overdue: float | None) -> str | None:
        limit = self.thresholds.timer_overdue_s
        if overdue is None or overdue <= limit:
            return None
        return f"a timer is overdue by {overdue:.1f}s (--health-timer-overdue {limit:g}s)"

    def _overdue_s(self) -> float | None:
        """How long the earliest timer of the driver's schedule has been due (None: none is)."""
        if self._schedule is None:
            return None
        try:
            timeouts = Schedule.load(self._schedule).timeouts
        except (ValueError, KeyError, TypeError):  # written atomically; damaged only by hand
            return None
        due = min(timeouts.values(), default=None)
        late = time.time() - due / 1000 if due is not None else None
        return late if late is not None and late > 0 else None
