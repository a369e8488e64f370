"""A producer that acknowledges nothing for a while is replaced by a new one.

kafka-python 3's idempotent producer can wedge for good: on Apache Kafka, with a node paused
and then killed while the producer bumps its epoch (KIP-360), its sender thread stays in the
state that waits for a new producer id and never sends a record again; every send then times
out, though the cluster is healthy (found by the three-node soak, seed 101). A new client
gets a new producer id and sends. What the old one held is in doubt, as any send that timed
out is: the caller was told so (``SendInDoubt``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from txstream.kafka import Producer, close_quietly

__all__ = ["ProducerRenewal"]

log = logging.getLogger(__name__)


class ProducerRenewal:
    """Holds the producer ``make`` made; :meth:`unacknowledged` after each send that was not
    acknowledged, :meth:`acknowledged` after each that was. Once no send was acknowledged for
    ``after_s`` while some failed, the next :meth:`unacknowledged` replaces the producer."""

    def __init__(self, make: Callable[[], Producer], after_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make, self._after_s, self._clock = make, after_s, clock
        self._lock = threading.Lock()
        self._producer = make()
        self._failing_since: float | None = None
        self.renewals = 0

    @property
    def producer(self) -> Producer:
        return self._producer

    def acknowledged(self) -> None:
        self._failing_since = None

    def unacknowledged(self, used: Producer) -> None:
        """A send of ``used`` was not acknowledged in time."""
        with self._lock:
            now = self._clock()
            if used is not self._producer:
                return  # replaced already
            if self._failing_since is None:
                self._failing_since = now
                return
            if now - self._failing_since < self._after_s:
                return
            waited = now - self._failing_since
            old, self._producer = self._producer, self._make()
            self._failing_since, self.renewals = None, self.renewals + 1
        log.warning("no send acknowledged for %.0f s: the Kafka producer is replaced by a new "
                    "one (its client may have stopped sending; the sends that failed are in "
                    "doubt)", waited)
        close_quietly(old)
