"""Sending one task's records: the sink's producer, held records, all-or-nothing acknowledgement.

A task counts as done only once the broker acknowledged every record it sent (idempotent,
acks=all); anything less raises :class:`SendFailed`, which fails the micro-batch so that it
runs again from the checkpoint. Except a record the broker refuses for what it is (too large,
an invalid or forbidden topic): a replay would be refused again, and one record would stop the
coordinator for good. Such a record goes to the dead-letter topic as a reference (where it was
going, its id, size and the broker's reason), and the batch goes on. A refused release's dead
letter is keyed by its transaction id and carries what it takes to release it again once the
cause is mended (its headers, its body or where the body lies: ``txstream dead-letters
release``), and the note that said ``released`` says ``release_refused`` instead, with why and
where the dead letter lies.

The history records go last, once every other record of the task is acknowledged: Kafka
acknowledges each partition on its own, so a note sent with the release it states could be
stored while the release is refused (a leader election, too few in-sync replicas), and a new
checkpoint would then take the note for the release (docs/decisions/0030-notes-after-releases.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

from txstream.errors import SendFailed
from txstream.kafka import (
    KafkaSettings,
    Producer,
    SendFuture,
    cached_client,
    drop_cached_client,
    make_producer,
)
from txstream.kafka.errors import (
    InvalidRecordError,
    InvalidTopicError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    TopicAuthorizationFailedError,
)
from txstream.outputs import (
    KAFKA_MAX_MESSAGE_BYTES,
    encode_reference,
    encode_refused_release,
    record_bytes,
    restate_refused,
)
from txstream.refusals import Code
from txstream.schema import Kind, OutputRow
from txstream.topics import Topics
from txstream.wire import H, Record, pack_headers

__all__ = ["Delivery", "RefusedRelease", "MissingTopic", "Stalled", "make_sink_producer",
           "missing_topic", "wait_ms", "refused_by_broker", "unacknowledged", "restated_note",
           "flush_watching", "Prepared", "STALL_S"]

_MAX_ERRORS_SHOWN = 3
# A producer that completes none of its sends for this long is taken for wedged (kafka-python
# 3 can stop sending for good after a leader's node dies: txstream.client.renewal). Longer
# than a request's timeout (30 s): an acks=all write may wait that long for a slow follower.
STALL_S = 35.0
_FLUSH_SLICE_S = 1.0
# A prepared row: the output row with its headers unpacked for the producer.
Prepared = tuple[OutputRow, list[tuple[str, bytes]]]


def make_sink_producer(settings: KafkaSettings,
                       max_message_bytes: int = KAFKA_MAX_MESSAGE_BYTES) -> Producer:
    """The sink's producer: acks=all and idempotent like every txstream producer, tuned for
    writing thousands of records at once: kafka-python builds every record in Python on the
    caller's thread while its I/O thread competes for the GIL, and one request in flight with
    1 MiB batches cut its CPU per record by a quarter (docs/decisions/0011-kafka-client-tuning.md).
    A batch never exceeds the largest message the broker takes, and a record that would is
    refused before it is sent.
    """
    return make_producer(settings, role="sink", batch_size=min(1 << 20, max_message_bytes),
                         max_request_size=max_message_bytes,
                         max_in_flight_requests_per_connection=1)


def _producer_key(settings: KafkaSettings, limit: int) -> tuple[str, str, int]:
    return ("sink", settings.key, limit)


class MissingTopic(Exception):
    """The record's topic does not exist and the broker does not create topics on first use:
    a producer would wait for its metadata until it gave up, batch after batch."""


# Per process: topics known to exist, and whether the broker creates missing ones (None: it
# does not tell, so Kafka's default, yes).
_EXISTING: set[tuple[str, str]] = set()
_AUTO_CREATE: dict[str, bool | None] = {}


def missing_topic(settings: KafkaSettings, topic: str) -> bool:
    """Whether ``topic`` is missing on a broker that will not create it."""
    from txstream.kafka.provision import admin_client, broker_auto_create, topic_states

    servers = settings.bootstrap_servers
    if (servers, topic) in _EXISTING or _AUTO_CREATE.get(servers, False) is not False:
        return False
    with admin_client(settings) as admin:
        if topic_states(admin, [topic])[topic].present:
            _EXISTING.add((servers, topic))
            return False
        if servers not in _AUTO_CREATE:
            _AUTO_CREATE[servers] = broker_auto_create(admin)
    return _AUTO_CREATE[servers] is False


def refused_by_broker(exc: BaseException | None) -> bool:
    """Whether the broker (or the producer, checking as the broker would) refused a record for
    what it is: sending it again would be refused again."""
    return isinstance(exc, (MessageSizeTooLargeError, RecordListTooLargeError, InvalidTopicError,
                            InvalidRecordError, TopicAuthorizationFailedError, MissingTopic))


def unacknowledged(futures: Iterable[tuple[Prepared, SendFuture]]
                   ) -> tuple[list[tuple[Prepared, BaseException]],
                              list[tuple[str, BaseException | None]]]:
    """The flushed sends that did not succeed: those the broker refused for what they are
    (:func:`refused_by_broker`), and the others by topic, with their error (None: no answer)."""
    refused: list[tuple[Prepared, BaseException]] = []
    failed: list[tuple[str, BaseException | None]] = []
    for prepared, future in futures:
        if future.succeeded():
            continue
        exc = future.exception if future.is_done else None
        if exc is not None and refused_by_broker(exc):
            refused.append((prepared, exc))
        else:
            failed.append((prepared[0].topic, exc))
    return refused, failed


def wait_ms(not_before_ms: int, batch_ms: int | None) -> float:
    """How long until ``not_before_ms`` (a timer's deadline, at most the lead past the batch's
    start: a worker whose clock runs behind the driver's waits no longer than that)."""
    wait = not_before_ms - time.time() * 1000
    if batch_ms is not None:
        wait = min(wait, not_before_ms - batch_ms)
    return wait


class Stalled(SendFailed):
    """No send of the producer completed for :data:`STALL_S` while some waited."""


def flush_watching(producer: Producer, futures: Iterable[SendFuture], timeout_s: float,
                   stall_s: float | None = None) -> None:
    """``producer.flush()``, watched: raises KafkaTimeoutError after ``timeout_s``, and
    :class:`Stalled` once none of ``futures`` completed for ``stall_s`` (a wedged client
    would otherwise hold the task for the whole timeout, 120 s by default)."""
    from txstream.kafka.errors import KafkaTimeoutError

    if not getattr(producer, "flushes_in_background", True):
        producer.flush(timeout=timeout_s)  # the in-memory broker's: answered at once
        return
    stall_s = STALL_S if stall_s is None else stall_s
    waiting = list(futures)
    start = progress_at = time.monotonic()
    done = sum(f.is_done for f in waiting)
    while True:
        now = time.monotonic()
        try:
            producer.flush(timeout=max(0.001, min(_FLUSH_SLICE_S, start + timeout_s - now)))
            return
        except KafkaTimeoutError:
            now = time.monotonic()
            if now - start >= timeout_s:
                raise
        if (completed := sum(f.is_done for f in waiting)) > done:
            done, progress_at = completed, now
        elif now - progress_at >= stall_s:
            raise Stalled(f"no record of {len(waiting)} acknowledged or refused for "
                          f"{now - progress_at:.0f} s: the producer is taken for wedged")


class RefusedRelease(NamedTuple):
    """A release the broker refused, as the metrics count it: its producer group, topic and
    refusal code."""

    producer_group: str
    topic: str
    code: str


class Delivery:
    """The records one task sends, acknowledged all together at the end (:meth:`finish`).

    A record that must wait for its deadline (``not_before_ms``) is put aside and sent at the
    end, in deadline order: waiting for it never delays the records behind it.
    """

    def __init__(self, settings: KafkaSettings, flush_timeout_s: float,
                 dead_letter_topic: str | None = None,
                 max_message_bytes: int = KAFKA_MAX_MESSAGE_BYTES,
                 half_topic: str | None = None) -> None:
        self.settings = settings
        self.flush_timeout_s = flush_timeout_s
        self.dead_letter_topic = dead_letter_topic
        self.limit = max_message_bytes
        self.half_topic = half_topic  # where a refused release's body lies
        # Releases refused: what their notes now say, by transaction id; and for the metrics.
        self.restated: dict[str, dict[str, object]] = {}
        self.refused_releases: list[RefusedRelease] = []
        self.futures: list[tuple[Prepared, SendFuture]] = []
        self.counts: Counter[str] = Counter()
        self.held: list[tuple[int, int, Prepared]] = []
        self.notes: list[Prepared] = []  # the history records: sent once the rest is acked
        self.refused: list[tuple[Prepared, BaseException]] = []

    def _producer(self) -> Producer:
        return cached_client(_producer_key(self.settings, self.limit),
                             lambda: make_sink_producer(self.settings, self.limit))

    def _drop_producer(self) -> None:
        drop_cached_client(_producer_key(self.settings, self.limit))

    def send(self, rows: Iterable[Prepared]) -> None:
        now: list[Prepared] = []
        for prepared in rows:
            row = prepared[0]
            if row.kind == Kind.HISTORY:
                self.notes.append(prepared)
            elif row.not_before_ms is not None and wait_ms(row.not_before_ms, row.batch_ms) > 0:
                self.held.append((row.not_before_ms, len(self.held), prepared))
            else:
                now.append(prepared)
        self._send_now(now)

    def _send_now(self, rows: list[Prepared]) -> None:
        topic = None
        try:
            producer = self._producer()
            for prepared in rows:
                row, headers = prepared
                topic, key, value = row.topic, row.key, row.value
                if key is None and value is None:
                    # kafka-python refuses such a record (Kafka does not): e.g. the dead letter
                    # of a keyless tombstone. An empty value is the nearest it can send.
                    value = b""
                try:
                    if missing_topic(self.settings, topic):
                        raise MissingTopic(f"topic {topic} does not exist and the broker does "
                                           "not create topics: txstream topics create")
                    future = producer.send(topic, key=key, value=value, headers=headers)
                except Exception as exc:
                    if not refused_by_broker(exc):
                        raise
                    self.refused.append((prepared, exc))  # too large: refused before sending
                    continue
                self.futures.append((prepared, future))
                self.counts[row.kind] += 1
        except Exception as exc:
            self._drop_producer()
            raise SendFailed(f"sending record {len(self.futures) + 1} (topic {topic}) "
                             f"failed: {type(exc).__name__}: {exc}") from exc

    def _send_held(self) -> None:
        for not_before, _, prepared in sorted(self.held, key=lambda h: (h[0], h[1])):
            wait = wait_ms(not_before, prepared[0].batch_ms)
            if wait > 0:
                time.sleep(wait / 1000)
            self._send_now([prepared])
        self.held = []

    def _flush(self) -> None:
        try:
            flush_watching(self._producer(), (f for _, f in self.futures), self.flush_timeout_s)
        except Exception as exc:
            self._drop_producer()
            raise SendFailed(f"flushing {len(self.futures)} records failed: "
                             f"{type(exc).__name__}: {exc}") from exc

    def finish(self) -> dict[str, int]:
        """Send what was held, flush; dead-letter what the broker refused for what it is;
        raise SendFailed unless the broker acknowledged every other record. Then the same for
        the history records: a note is never stored before what it states."""
        self._send_held()
        self._acknowledged()
        notes, self.notes = self.notes, []
        if notes:
            self.futures = []
            self._send_now([restated_note(note, self.restated) for note in notes]
                           if self.restated else notes)
            self._acknowledged()
        return +self.counts

    def _acknowledged(self) -> None:
        """Flush; raise SendFailed unless every record sent was acknowledged or refused for
        what it is (then dead-lettered)."""
        self._flush()
        refused, failed = unacknowledged(self.futures)
        for prepared, exc in refused:
            self.refused.append((prepared, exc))
            self.counts[prepared[0].kind] -= 1
        if failed:
            # An idempotent producer may be left in a fatal state: the next task gets another.
            self._drop_producer()
            shown = "; ".join(f"{topic}: {exc or 'no acknowledgement'}"
                              for topic, exc in failed[:_MAX_ERRORS_SHOWN])
            raise SendFailed(f"{len(failed)} of {len(self.futures)} records were not "
                             f"acknowledged by the broker: {shown}")
        if self.refused:
            self._dead_letter_refused()

    def _dead_letter_refused(self) -> None:
        """Each refused record as a reference on the dead-letter topic; raise SendFailed if
        there is none to write to, or if those are not acknowledged either."""
        refused, self.refused = self.refused, []
        if self.dead_letter_topic is None:
            (row, _), exc = refused[0]
            raise SendFailed(f"the broker refused a record for {row.topic} and the sink has no "
                             f"dead-letter topic: {type(exc).__name__}: {exc}")
        self._drop_producer()  # a refusal may leave an idempotent producer out of sequence
        self.futures = []
        topics = Topics(dead_letter=self.dead_letter_topic)
        self._send_now([self._dead_letter(prepared, exc, topics) for prepared, exc in refused])
        self._flush()
        if self.refused or not all(future.succeeded() for _, future in self.futures):
            raise SendFailed(f"{len(refused)} records refused by the broker could not be "
                             f"dead-lettered either")
        for (row, _), future in self.futures:
            txid = row.key.decode("utf-8", "replace") if row.key is not None else ""
            if txid in self.restated:
                where = future.value
                assert where is not None  # every one succeeded (above)
                self.restated[txid]["dead_letter"] = f"{where.partition}@{where.offset}"

    def _dead_letter(self, prepared: Prepared, exc: BaseException, topics: Topics) -> Prepared:
        """A refused record's dead letter; a release's says so in its note and its count."""
        row, headers = prepared
        code, reason = _refusal(prepared, exc, self.limit)
        txid = dict(headers).get(H.TRANSACTION_ID)
        if row.kind != Kind.VISIBLE or txid is None:
            return _reference(prepared, code, reason, topics, self.limit)
        text = txid.decode("utf-8", "replace")
        self.restated[text] = {"code": code, "reason": reason}
        group = dict(headers).get(H.PGROUP, b"").decode("utf-8", "replace")
        self.refused_releases.append(RefusedRelease(group, row.topic, code))
        at = (self.half_topic, row.body_partition, row.body_offset) if (
            self.half_topic and row.body_partition is not None
            and row.body_offset is not None) else None
        record = encode_refused_release(Record(row.topic, row.key, row.value, tuple(headers)),
                                        text, reason, code, at, topics, self.limit)
        return _as_row(prepared, record)


def _refusal(prepared: Prepared, exc: BaseException, limit: int) -> tuple[str, str]:
    """The refusal's code and reason."""
    row, headers = prepared
    if isinstance(exc, MissingTopic):
        return Code.MISSING_TOPIC, str(exc)
    size = record_bytes(row.key, row.value, headers)
    return Code.REFUSED_BY_BROKER, (f"the broker refused the record for {row.topic} ({size} "
                                    f"bytes, the limit is {limit}): {type(exc).__name__}: {exc}")


def restated_note(note: Prepared, refused: dict[str, dict[str, object]]) -> Prepared:
    """A history record whose ``released`` notes of refused releases say so."""
    row, headers = note
    value = restate_refused(row.value, refused)
    return note if value is None else (row._replace(value=value), headers)


def _reference(prepared: Prepared, code: str, reason: str, topics: Topics,
               limit: int) -> Prepared:
    """A refused record's dead letter: a reference to it, under the refused record's id."""
    row, headers = prepared
    size = record_bytes(row.key, row.value, headers)
    record = encode_reference(row.topic, row.key, size, reason, code, (-1, -1), topics)
    return _as_row(prepared, record)


def _as_row(prepared: Prepared, record: Record) -> Prepared:
    """``record`` to write instead of ``prepared``, under the refused record's id (a replay
    finds it there, and neither writes it nor dead-letters it again)."""
    row, _ = prepared
    with_id = [*record.headers,
               *([(H.RECORD_ID, row.record_id.encode("ascii"))] if row.record_id else [])]
    reference = row._replace(kind=Kind.DEAD_LETTER, topic=record.topic, key=record.key,
                             value=record.value, headers=pack_headers(with_id))
    return reference, with_id
