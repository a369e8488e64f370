"""Whether a broker isolates Kafka transactions: the probe, and the transactional producer.

A broker may take the transactional calls and still hand aborted records to a
``read_committed`` reader: tansu does (docs/decisions/0005-replay-check.md). Nothing in the
protocol says which kind a broker is, so :func:`probe_transactions` tries it: it writes a
record in a transaction, aborts it, commits a second one after it, and reads both back
``read_committed``. A broker that isolates returns only the second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from txstream.errors import TransactionsUnavailable
from txstream.kafka.clients import close_quietly, make_consumer, make_producer
from txstream.kafka.errors import (
    InvalidProducerEpochError,
    ProducerFencedError,
    TopicAlreadyExistsError,
    for_code,
)
from txstream.kafka.protocols import Producer, TopicPartition
from txstream.kafka.settings import KafkaSettings

__all__ = ["Isolation", "probe_transactions", "make_transactional_producer", "fenced",
           "commit_within", "learn_topics", "PROBE_TIMEOUT_S"]

PROBE_TIMEOUT_S = 30.0
_PROBE_RETENTION_MS = 3_600_000  # the probe's records are of no use after it


class Isolation(NamedTuple):
    """A probe's answer: whether ``read_committed`` readers see no aborted record, and why
    (one line, for the coordinator's start)."""

    isolates: bool
    reason: str


def fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says another producer took this transactional id (a newer attempt of
    the same task, or the same task in another worker process)."""
    if isinstance(exc, (ProducerFencedError, InvalidProducerEpochError)):
        return True
    # kafka-python's later calls raise a plain KafkaError naming the error it is stuck in.
    return "ProducerFenced" in str(exc) or "InvalidProducerEpoch" in str(exc)


# kafka-python waits its retry backoff twice while it finds and connects to the transaction
# coordinator: 220 ms of a new producer's init_transactions at the default 100 ms, 60 ms at
# 20 (Apache Kafka 4.4, loopback). A sink task makes one whenever its partition's id last ran
# in another worker process. The retries keep the default's time budget for transient errors.
_TRANSACTIONAL_DEFAULTS: dict[str, Any] = {"retry_backoff_ms": 20, "retries": 25}


def make_transactional_producer(settings: KafkaSettings, transactional_id: str, *,
                                role: str | None = None, **overrides: Any) -> Producer:
    """An idempotent, acks=all producer under ``transactional_id``, its transactions
    initialised: a producer of an earlier holder of the id is fenced, and its open
    transaction aborted (so it no longer holds back ``read_committed`` readers)."""
    producer = make_producer(settings, role=role, transactional_id=transactional_id,
                             **{**_TRANSACTIONAL_DEFAULTS, **overrides})
    try:
        producer.init_transactions()
    except BaseException:
        close_quietly(producer)
        raise
    return producer


def commit_within(producer: Producer, timeout_s: float) -> None:
    """``producer.commit_transaction()``, waited for ``timeout_s`` at most (kafka-python's
    waits for ever: a coordinator that never answers would hold the task). Raises
    KafkaTimeoutError then: the commit is in doubt, the caller must not send it again."""
    from txstream.kafka.errors import KafkaTimeoutError

    # kafka-python's own commit_transaction() is these three calls with no timeout on the
    # wait (3.0.12, pinned in pyproject.toml).
    manager = getattr(producer, "_transaction_manager", None)
    sender = getattr(producer, "_sender", None)
    if manager is None or sender is None:  # not kafka-python's (the in-memory broker's)
        producer.commit_transaction()
        return
    result = manager.begin_commit()
    sender.wakeup()
    if not result.wait(timeout_ms=timeout_s * 1000):
        raise KafkaTimeoutError(f"the transaction's commit was not answered within "
                                f"{timeout_s:g} s: it is in doubt")


# How long a transaction's producer waits for its topics' metadata, asked all at once, before
# sending anyway (a topic not there yet is then waited for as each send waits for it).
LEARN_TOPICS_WAIT_S = 1.0


def learn_topics(producer: Producer, topics: Iterable[str],
                 wait_s: float = LEARN_TOPICS_WAIT_S) -> None:
    """Asks the broker about every one of ``topics`` the producer does not know yet, in one
    metadata request, and waits for the answer ``wait_s`` at most. A new kafka-python producer
    otherwise learns each topic when it first sends to it, one metadata round of ~90 ms each
    on Apache Kafka: a sink task whose producer was fenced and made anew sent its transaction
    in ~220 ms instead of ~50 (docs/decisions/0032-transactions.md). Only a hint: nothing is
    raised, and a send to a topic still unknown waits for it as before."""
    metadata = getattr(producer, "_metadata", None)
    sender = getattr(producer, "_sender", None)
    if metadata is None or sender is None:  # not kafka-python's (the in-memory broker's)
        return
    new = []
    for topic in {t for t in topics if metadata.partitions_for_topic(t) is None}:
        try:
            sender.add_topic(topic)  # as kafka-python's send does: its thread adds it
        except (TypeError, ValueError):  # an invalid name: its send says so
            continue
        new.append(topic)
    deadline = time.monotonic() + wait_s
    while new and time.monotonic() < deadline:
        answered = threading.Event()
        metadata.request_update().add_both(lambda event, *_: event.set(), answered)
        sender.wakeup()
        answered.wait(max(0.0, deadline - time.monotonic()))
        new = [t for t in new if metadata.partitions_for_topic(t) is None]


def probe_transactions(settings: KafkaSettings, topic: str,
                       timeout_s: float = PROBE_TIMEOUT_S) -> Isolation:
    """Whether the broker isolates transactions, tried on ``topic`` (created if missing, one
    partition). Raises :class:`TransactionsUnavailable` when the probe cannot tell (the
    broker is unreachable, the topic cannot be written or read)."""
    _ensure_probe_topic(settings, topic)
    token = uuid.uuid4().hex
    try:
        producer = make_transactional_producer(settings, f"txstream-probe-{token}",
                                               role="probe")
    except Exception as exc:
        return Isolation(False, f"the broker refused a transactional producer "
                                f"({type(exc).__name__}: {exc})")
    try:
        aborted_at, committed_at = _write_probe(producer, topic, token, timeout_s)
    except Exception as exc:
        return Isolation(False, f"the broker refused a transaction ({type(exc).__name__}: "
                                f"{exc})")
    finally:
        close_quietly(producer)
    seen = _read_committed(settings, topic, aborted_at, committed_at, timeout_s)
    if aborted_at in seen:
        return Isolation(False, "the broker does not isolate transactions: a read_committed "
                                "reader was handed an aborted record")
    return Isolation(True, "the broker isolates transactions")


def _ensure_probe_topic(settings: KafkaSettings, topic: str) -> None:
    from txstream.kafka.clients import make_admin

    try:
        admin = make_admin(settings, role="probe")
    except Exception as exc:
        raise TransactionsUnavailable(f"cannot ask the broker about transactions: "
                                      f"{type(exc).__name__}: {exc}") from exc
    try:
        answer = admin.create_topics(
            {topic: {"num_partitions": 1, "replication_factor": -1,
                     "configs": {"retention.ms": str(_PROBE_RETENTION_MS)}}},
            raise_errors=False)
        for result in answer["topics"]:
            error = for_code(result["error_code"])
            if result["error_code"] and error is not TopicAlreadyExistsError:
                raise TransactionsUnavailable(
                    f"cannot create the transactions probe topic {topic}: {error.__name__} "
                    f"{result.get('error_message') or ''}".rstrip())
    finally:
        admin.close()


def _write_probe(producer: Producer, topic: str, token: str, timeout_s: float
                 ) -> tuple[int, int]:
    """A record in an aborted transaction, then one in a committed one: their offsets."""
    producer.begin_transaction()
    sent = producer.send(topic, key=b"aborted", value=token.encode(), partition=0)
    producer.flush(timeout=timeout_s)
    aborted_at = sent.get(timeout=timeout_s).offset
    producer.abort_transaction()
    producer.begin_transaction()
    sent = producer.send(topic, key=b"committed", value=token.encode(), partition=0)
    producer.flush(timeout=timeout_s)
    committed_at = sent.get(timeout=timeout_s).offset
    producer.commit_transaction()
    return aborted_at, committed_at


def _read_committed(settings: KafkaSettings, topic: str, start: int, last: int,
                    timeout_s: float) -> set[int]:
    """The offsets a read_committed reader returns of ``[start, last]``, read until it
    returned ``last`` (committed after the rest, so nothing before it is still to come)."""
    tp = TopicPartition(topic, 0)
    consumer = make_consumer(settings, role="probe", isolation_level="read_committed",
                             fetch_max_wait_ms=100)
    seen: set[int] = set()
    try:
        consumer.assign([tp])
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while last not in seen:
            if time.monotonic() > deadline:
                raise TransactionsUnavailable(
                    f"the transactions probe could not read back its committed record from "
                    f"{topic} within {timeout_s:g} s")
            for rec in consumer.poll(timeout_ms=100).get(tp, ()):
                if start <= rec.offset <= last:
                    seen.add(rec.offset)
    finally:
        close_quietly(consumer)
    return seen
