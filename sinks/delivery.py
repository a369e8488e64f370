"""Sending one task's records: the sink's producer, held records, all-or-nothing acknowledgement.

A task counts as done only once the broker acknowledged every record it sent (idempotent,
acks=all); anything less raises :class:`SendFailed`, which fails the micro-batch so that it
runs again from the checkpoint.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings, cached_client, drop_cached_client, make_producer
from txstream.schema import OutputRow

__all__ = ["Delivery", "make_sink_producer", "wait_ms"]

_MAX_ERRORS_SHOWN = 3
# A prepared row: the output row with its headers unpacked for the producer.
Prepared = tuple[OutputRow, list[tuple[str, bytes]]]


def make_sink_producer(settings: KafkaSettings) -> Any:
    """The sink's producer: acks=all and idempotent like every txstream producer, tuned for
    writing thousands of records at once: kafka-python builds every record in Python on the
    caller's thread while its I/O thread competes for the GIL, and one request in flight with
    1 MiB batches cut its CPU per record by a quarter (docs/decisions/0011-kafka-client-tuning.md).
    """
    return make_producer(settings, batch_size=1 << 20, max_in_flight_requests_per_connection=1)


def _producer_key(settings: KafkaSettings) -> tuple[str, str]:
    return ("sink", repr(sorted(settings.as_dict().items())))


def _producer(settings: KafkaSettings) -> Any:
    return cached_client(_producer_key(settings), lambda: make_sink_producer(settings))


def wait_ms(not_before_ms: int, batch_ms: int | None) -> float:
    """How long until ``not_before_ms`` (a timer's deadline, at most the lead past the batch's
    start: a worker whose clock runs behind the driver's waits no longer than that)."""
    wait = not_before_ms - time.time() * 1000
    if batch_ms is not None:
        wait = min(wait, not_before_ms - batch_ms)
    return wait


class Delivery:
    """The records one task sends, acknowledged all together at the end (:meth:`finish`).

    A record that must wait for its deadline (``not_before_ms``) is put aside and sent at the
    end, in deadline order: waiting for it never delays the records behind it.
    """

    def __init__(self, settings: KafkaSettings, flush_timeout_s: float) -> None:
        self.settings = settings
        self.flush_timeout_s = flush_timeout_s
        self.futures: list[tuple[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.held: list[tuple[int, int, Prepared]] = []

    def send(self, rows: Iterable[Prepared]) -> None:
        now: list[Prepared] = []
        for prepared in rows:
            row = prepared[0]
            if row.not_before_ms is not None and wait_ms(row.not_before_ms, row.batch_ms) > 0:
                self.held.append((row.not_before_ms, len(self.held), prepared))
            else:
                now.append(prepared)
        self._send_now(now)

    def _send_now(self, rows: list[Prepared]) -> None:
        topic = None
        try:
            producer = _producer(self.settings)
            for row, headers in rows:
                topic, key, value = row.topic, row.key, row.value
                if key is None and value is None:
                    # kafka-python refuses such a record (Kafka does not): e.g. the dead letter
                    # of a keyless tombstone. An empty value is the nearest it can send.
                    value = b""
                self.futures.append((topic, producer.send(topic, key=key, value=value,
                                                          headers=headers)))
                self.counts[row.kind] += 1
        except Exception as exc:
            drop_cached_client(_producer_key(self.settings))
            raise SendFailed(f"sending record {len(self.futures) + 1} (topic {topic}) "
                             f"failed: {type(exc).__name__}: {exc}") from exc

    def _send_held(self) -> None:
        for not_before, _, prepared in sorted(self.held, key=lambda h: (h[0], h[1])):
            wait = wait_ms(not_before, prepared[0].batch_ms)
            if wait > 0:
                time.sleep(wait / 1000)
            self._send_now([prepared])
        self.held = []

    def finish(self) -> dict[str, int]:
        """Send what was held, flush; raise SendFailed unless the broker acknowledged every
        record."""
        self._send_held()
        try:
            _producer(self.settings).flush(timeout=self.flush_timeout_s)
        except Exception as exc:
            drop_cached_client(_producer_key(self.settings))
            raise SendFailed(f"flushing {len(self.futures)} records failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        failed = [(topic, fut) for topic, fut in self.futures if not fut.succeeded()]
        if failed:
            # An idempotent producer may be left in a fatal state: the next task gets another.
            drop_cached_client(_producer_key(self.settings))
            shown = "; ".join(
                f"{topic}: {fut.exception if fut.is_done else 'no acknowledgement'}"
                for topic, fut in failed[:_MAX_ERRORS_SHOWN]
            )
            raise SendFailed(f"{len(failed)} of {len(self.futures)} records were not "
                             f"acknowledged by the broker: {shown}")
        return dict(self.counts)
