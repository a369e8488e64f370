"""Small Kafka helpers for tests: produce records, read a topic to its end, wait for output."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kafka import TopicPartition

from txstream.kafka import KafkaSettings, make_consumer, make_producer
from txstream.message import Decision, EndEvent, Message
from txstream.outputs import decode_history
from txstream.schema import OutputRow
from txstream.topics import Topics
from txstream.wire import Record, encode_end, encode_half

T = TypeVar("T")

__all__ = [
    "produce",
    "read_topic",
    "wait_for",
    "wait_until",
    "now_ms",
    "half_record",
    "end_record",
    "history_of",
    "headers_of",
    "output_row",
    "discard_by_answers",
]


def produce(
    settings: KafkaSettings, records: Iterable[Record], timestamp_ms: int | None = None
) -> None:
    """Write ``records``; ``timestamp_ms`` stands for a broker timestamp in the past (tansu
    keeps a producer's timestamp even on a ``LogAppendTime`` topic)."""
    producer = make_producer(settings)
    try:
        futures = [
            producer.send(r.topic, key=r.key, value=r.value, headers=list(r.headers),
                          timestamp_ms=timestamp_ms)
            for r in records
        ]
        producer.flush()
        for f in futures:
            f.get(timeout=10)
    finally:
        producer.close()


def read_topic(settings: KafkaSettings, topic: str, timeout_s: float = 2.0) -> list[Any]:
    """Every record of ``topic`` (all partitions) up to its current end, in offset order."""
    consumer = make_consumer(settings)
    try:
        parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        done: set[TopicPartition] = set()
        while time.monotonic() < deadline and len(done) < len(tps):
            batch = consumer.poll(timeout_ms=200)
            for recs in batch.values():
                out.extend(recs)
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None and consumer.position(tp) >= hw:
                    done.add(tp)
        return sorted(out, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def wait_until(predicate: Callable[[], T], timeout_s: float = 60.0, interval_s: float = 0.25) -> T:
    """Poll ``predicate`` until it returns something truthy; fail with its last value."""
    deadline = time.monotonic() + timeout_s
    value = predicate()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = predicate()
    assert value, f"condition not met within {timeout_s}s (last value: {value!r})"
    return value


def wait_for(
    settings: KafkaSettings, topic: str, count: int, timeout_s: float = 60.0
) -> list[Any]:
    """Wait until ``topic`` holds at least ``count`` records and return them all."""
    return wait_until(lambda: (r := read_topic(settings, topic)) and len(r) >= count and r,
                      timeout_s)


# --- records of the wire format, for tests that play producer without the client library ----


def now_ms() -> int:
    return int(time.time() * 1000)


def half_record(
    topics: Topics,
    txid: str,
    group: str,
    topic: str,
    body: bytes = b"body",
    born_ms: int | None = None,
    **fields: Any,
) -> Record:
    msg = Message(topic, body, transaction_id=txid, msg_id=txid, producer_group=group,
                  born_timestamp=now_ms() if born_ms is None else born_ms, **fields)
    return encode_half(msg, topics)


def end_record(
    topics: Topics, txid: str, group: str, decision: Decision, **fields: Any
) -> Record:
    fields.setdefault("born_timestamp", now_ms())
    return encode_end(EndEvent(txid, group, decision, **fields), topics)


def mixed_transactions(topics: Topics, tag: str, real: str, n: int
                       ) -> tuple[list[Record], set[str]]:
    """n transactions, every third rolled back; returns the records and the committed ids."""
    records, commits = [], set()
    for i in range(n):
        txid = f"{tag}-{i}"
        decision = Decision.ROLLBACK_MESSAGE if i % 3 == 2 else Decision.COMMIT_MESSAGE
        records += [half_record(topics, txid, "g", real, txid.encode()),
                    end_record(topics, txid, "g", decision)]
        if decision is Decision.COMMIT_MESSAGE:
            commits.add(txid)
    return records, commits


def history_of(settings: KafkaSettings, topics: Topics, txid: str) -> list[dict[str, Any]]:
    """The history notes the coordinator wrote for one transaction, oldest first."""
    return [
        note
        for r in read_topic(settings, topics.history)
        for note in decode_history(r.value, r.key)
        if note["transaction_id"] == txid
    ]


def headers_of(record: Any) -> dict[str, str]:
    return {k: (v or b"").decode("utf-8", "replace") for k, v in record.headers}


def output_row(kind: str, topic: str, key: bytes | None, value: bytes | None,
               headers: bytes | None = None, record_id: str | None = None,
               batch_ms: int | None = None, not_before_ms: int | None = None,
               body_at: tuple[int, int] | None = None) -> OutputRow:
    """An operator output row as the sink takes it; the columns the sink does not read stay
    null. ``body_at``: where in the half topic its body lies (its value is then null)."""
    return OutputRow(kind, topic, key, value, headers, record_id, batch_ms, not_before_ms,
                     *(body_at or (None, None)))


def discard_by_answers(settings: KafkaSettings, topics: Topics, txid: str, group: str,
                       topic: str, timeout_s: float = 60.0) -> None:
    """A half message whose back-checks are all answered UNKNOW, until the coordinator
    discards it for ``check_max``. Every check is answered: only an answer to the latest
    check counts, so one read after the next check was sent (a loaded machine) is made good
    by the next answer."""
    produce(settings, [half_record(topics, txid, group, topic)])
    answered: set[str] = set()

    def discarded() -> bool:
        for r in read_topic(settings, topics.check(group)):
            number = headers_of(r).get("TRANSACTION_CHECK_TIMES")
            if r.key == txid.encode() and number and number not in answered:
                answered.add(number)
                produce(settings, [end_record(topics, txid, group, Decision.UNKNOW,
                                              from_check=True, check_times=int(number))])
        return any(r.key == txid.encode() for r in read_topic(settings, topics.discard))

    wait_until(discarded, timeout_s)


def release_rows(real: str, topics: Topics, n: int = 3) -> list[Any]:
    """``n`` releases to ``real`` and their ``released`` notes, with the ids of one batch's
    key (``t.1.5.<i>``, notes ``t.1.5.n<i>``), as a sink task gets them."""
    from txstream.outputs import encode_history
    from txstream.schema import Kind
    from txstream.wire import H, pack_headers

    rows: list[Any] = []
    for i in range(n):
        txid, rid = f"tx-{i}", f"t.1.5.{i}"
        rows.append(output_row(Kind.VISIBLE, real, f"order-{i}".encode(), f"body {i}".encode(),
                               pack_headers(((H.TRANSACTION_ID, txid.encode()),
                                             (H.RECORD_ID, rid.encode()))), rid, 5))
        [(history, _)] = encode_history([(txid, 5, "released", {})], b"1", topics)
        rows.append(output_row(Kind.HISTORY, topics.history, history.key, history.value,
                               pack_headers(((H.RECORD_ID, f"t.1.5.n{i}".encode()),)),
                               f"t.1.5.n{i}", 5))
    return rows
