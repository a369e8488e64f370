"""A broker outage under a running coordinator: ridden out up to ``--broker-outage-limit``.

While the broker is away the query may keep waiting (a request answered late is answered), or
fail: its source, its sink or a body read-back gives up after its own timeout (30 s). A failure
that the broker caused restarts the query from its checkpoint once the broker answers again,
as a restarted process would (docs/decisions/0027-broker-outage.md); a failure the broker did
not cause, or an outage longer than the limit, ends the coordinator with the failure in one
line. ``/healthz`` says 503 throughout (the broker watch and the waiting query).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the CLI imports this module without the coordinator's packages installed
    from txstream.streaming.engine.health import LagWatch

__all__ = ["OutageRide", "ride_out"]

log = logging.getLogger(__name__)


class OutageRide:
    """Decides, after the query failed, whether to restart it, and waits for the broker.

    The broker counts as the cause when the watch found it unreachable since the query last
    started: a failure with the broker answering throughout is the coordinator's own, and a
    query that fails again after a restart with no new outage would fail forever.
    """

    def __init__(self, watch: LagWatch, limit_s: float, emit: Callable[[str], None] | None = None,
                 poll_s: float = 1.0) -> None:
        self._watch, self._limit_s, self._emit = watch, limit_s, emit
        self._poll_s = poll_s
        self.started_at = time.monotonic()  # the query's last (re)start
        self.restarts = 0
        self._was = "broker"  # what the last failure was ridden out for
        self.waiting: str | None = None  # what /healthz says while the query waits
        self._failure: str | None = None  # the failure the query restarts after

    def past_limit(self, failure: str | None = None) -> str | None:
        """The coordinator's end, in one line, once the broker has been away longer than the
        limit (the query waiting or failed), or, the query failed, a partition it needs has
        had too few replicas in sync that long; None until then."""
        away = self._away(failure is not None)
        if away is None or away[0] <= self._limit_s:
            return None
        failed = f"; the query failed with: {failure}" if failure else ""
        return (f"{away[2]} for {away[0]:.0f}s, past --broker-outage-limit {self._limit_s:g}s "
                f"({away[1]}){failed}")

    def _away(self, failed: bool) -> tuple[float, str, str] | None:
        """(seconds, why, what) of the broker's absence, else (once the query failed) of a
        partition's trouble: a batch that needs one short of replicas fails until they are
        back (docs/decisions/0021-bodies-read-back.md)."""
        if (away := self._watch.unreachable()) is not None:
            return (*away, f"broker {self._watch.bootstrap_servers} unreachable")
        if failed and (trouble := self._watch.troubled()) is not None:
            return (*trouble, "partitions short of in-sync replicas")
        return None

    def verdict(self, failure: str, stop: threading.Event) -> str | None:
        """After the query failed with ``failure``: None once the broker answers again, and
        the partitions it needs have their replicas, within the limit (restart the query),
        else the failure to end with."""
        if not self._cluster_caused():
            return failure
        self._failure = failure
        while not stop.is_set():
            away = self._away(True)
            if away is not None:
                self._was = away[2]
            if away is None:
                self.waiting = None
                return None
            if (final := self.past_limit(failure)) is not None:
                self.waiting = None
                return final
            self.waiting = (f"query failed while {away[2]} ({failure}); restarting it once "
                            f"that is over ({away[0]:.0f}s of --broker-outage-limit "
                            f"{self._limit_s:g}s)")
            stop.wait(self._poll_s)
        return None

    def _cluster_caused(self) -> bool:
        """Whether the broker was away, or a partition short of replicas, since the query
        last started. The metadata is asked only when the broker answered: asked of a broker
        away it waits out a request timeout while /healthz could say why the query failed."""
        watch = self._watch
        if watch.unreachable_since(self.started_at):
            return True
        watch.sample_partitions()
        return watch.unreachable_since(self.started_at) or watch.troubled_since(self.started_at)

    def restarted(self) -> None:
        self.restarts += 1
        self.started_at = time.monotonic()
        if self._emit:
            over = (f"broker {self._watch.bootstrap_servers} answers again"
                    if self._was.startswith("broker") else "the partitions have their replicas")
            self._emit(f"{over}: the query restarted from its checkpoint (restart "
                       f"{self.restarts}; it had failed with: {self._failure})")


def ride_out(coordinator: Any, ride: OutageRide, stop: threading.Event) -> str | None:
    """Wait on the coordinator's query until ``stop`` is set (None) or it fails for good (the
    failure, one line); a failure the broker caused restarts it (:class:`OutageRide`)."""
    while True:
        try:
            while coordinator.query.isActive and not stop.is_set():
                if (final := ride.past_limit()) is not None:
                    return final  # the query still waits for the broker: it is stopped
                coordinator.query.awaitTermination(1.0)
        except Exception:  # awaitTermination raises the query's failure, said in one line
            pass
        if stop.is_set():
            return None
        failure = coordinator.failure() or "query stopped"
        log.debug("the query failed: %s", coordinator.failure_detail())
        final = ride.verdict(failure, stop)
        if final is not None or stop.is_set():
            return final
        try:
            coordinator.restart_query()
        except Exception as exc:  # py4j: the JVM is gone, or the checkpoint unreadable
            return f"the query could not restart after the broker came back: {exc}"
        ride.restarted()
