"""The benchmark's workload: wire-format records, bulk production and topic readers.

Everything a producer would send goes through :mod:`txstream.wire`, so the coordinator reads
exactly what the client library writes. Bodies are random bytes (not one repeated body): the
state store compresses its files, and a repeated body would make the state look smaller than
real traffic makes it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from txstream.client.options import new_message_id
from txstream.kafka import KafkaSettings, make_admin, make_consumer, make_producer
from txstream.message import Decision, EndEvent, Message
from txstream.topics import Topics
from txstream.wire import Record, encode_end, encode_half

__all__ = [
    "Workload",
    "now_ms",
    "create_topics",
    "BulkProducer",
    "RecordWatcher",
]


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Workload:
    """One benchmark run's names and message shape."""

    topics: Topics
    group: str
    real_topic: str
    body_bytes: int = 200

    def txid(self, phase: str, i: int) -> str:
        """A transaction id as the client library makes them (a UUIDv7: state.keys); ``phase``
        and ``i`` only name the transaction in the message key, for reading records back."""
        return new_message_id()

    def half(self, txid: str, born_ms: int, immunity_s: int | None = None) -> Record:
        msg = Message(self.real_topic, os.urandom(self.body_bytes), keys=txid,
                      transaction_id=txid, msg_id=txid, producer_group=self.group,
                      born_timestamp=born_ms, check_immunity_time_s=immunity_s)
        return encode_half(msg, self.topics)

    def end(self, txid: str, decision: Decision = Decision.COMMIT_MESSAGE,
            born_ms: int | None = None) -> Record:
        event = EndEvent(txid, self.group, decision,
                         born_timestamp=now_ms() if born_ms is None else born_ms)
        return encode_end(event, self.topics)

    def committed(self, phase: str, count: int, start: int = 0) -> Iterator[Record]:
        """``count`` transactions: half message then commit, as a producer sends them."""
        for i in range(start, start + count):
            txid = self.txid(phase, i)
            born = now_ms()
            yield self.half(txid, born)
            yield self.end(txid, born_ms=born)


def create_topics(settings: KafkaSettings, names: Iterable[str], partitions: int) -> None:
    """Create topics with ``partitions`` partitions (existing ones are left as they are).

    Created up front: a topic the first send creates gets the broker's default partition count,
    not the coordinator's.
    """
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = make_admin(settings)
    try:
        for name in names:
            try:
                admin.create_topics([NewTopic(name, partitions, -1)])
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()
    consumer = make_consumer(settings)
    try:  # wait until the metadata shows them, or the first send may still auto-create
        deadline = time.monotonic() + 10
        for name in names:
            while not consumer.partitions_for_topic(name) and time.monotonic() < deadline:
                consumer.topics()
                time.sleep(0.05)
    finally:
        consumer.close()


class BulkProducer:
    """Send many records fast: big batches, leader-only acks, no idempotence (load only).

    The latency phase does not use this: it sends like the client library (acks=all).
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self._producer = make_producer(
            settings, acks=1, enable_idempotence=False, linger_ms=20,
            batch_size=512 * 1024, retries=5,
        )
        self.sent = 0

    def send(self, records: Iterable[Record]) -> int:
        n = 0
        for r in records:
            self._producer.send(r.topic, key=r.key, value=r.value, headers=list(r.headers))
            n += 1
        self.sent += n
        return n

    def flush(self) -> None:
        self._producer.flush(timeout=300)

    def close(self) -> None:
        self._producer.close(timeout=30)


class RecordWatcher:
    """Read topics from the beginning in a background thread, calling ``on_record(rec, at)``.

    ``at`` is the local receive time in ms: the consumer's end of commit -> visible latency.
    tansu holds a fetch for its whole ``fetch_max_wait_ms`` even when records arrive: 20 ms adds
    ~10 ms on average to that figure, where 5 ms cost a fifth of a core in this process and the
    broker, on the two cores the coordinator under test runs on.
    """

    def __init__(self, settings: KafkaSettings, topics: Iterable[str],
                 on_record: Callable[[Any, float], None]) -> None:
        self._settings = settings
        self._topics = list(topics)
        self._on_record = on_record
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-reader", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> RecordWatcher:
        self._thread.start()
        self._ready.wait(30)
        return self

    def _run(self) -> None:
        from kafka import TopicPartition

        consumer = make_consumer(self._settings, fetch_max_wait_ms=20, max_poll_records=5000)
        try:
            tps = []
            for topic in self._topics:
                parts = consumer.partitions_for_topic(topic) or set()
                tps.extend(TopicPartition(topic, p) for p in sorted(parts))
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            self._ready.set()
            while not self._stop.is_set():
                batch = consumer.poll(timeout_ms=20)
                at = time.time() * 1000
                for records in batch.values():
                    for rec in records:
                        self._on_record(rec, at)
        except BaseException as exc:  # reported by the phase that reads the figures
            self.error = exc
        finally:
            self._ready.set()
            consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
