"""The ``txstream-records`` sink against the real tansu broker and the local Spark session."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from tests.support.kafka_helpers import output_row, read_topic
from txstream.broker import EmbeddedBroker
from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings, make_producer
from txstream.schema import OUTPUT_SCHEMA, OutputRow
from txstream.sinks.kafka_sink import KafkaRecordWriter, SinkCommit, SinkOptions, send_rows
from txstream.streaming.engine.query import register
from txstream.wire import pack_headers

pytestmark = pytest.mark.spark


def _write(spark: Any, kafka: KafkaSettings, rows: list[tuple[Any, ...]], base: Path) -> Any:
    """Stream ``rows`` (OUTPUT_SCHEMA) through the sink in one micro-batch and wait for it."""
    register(spark)
    spark.createDataFrame(rows, OUTPUT_SCHEMA).coalesce(1).write.parquet(str(base / "in"))
    query = (spark.readStream.schema(OUTPUT_SCHEMA).parquet(str(base / "in"))
             .writeStream.format("txstream-records")
             .option("kafka", json.dumps(kafka.as_dict()))
             .option("checkpointLocation", str(base / "cp"))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    return query


def _row(kind: str, topic: str, key: bytes | None, value: bytes | None,
         headers: list[tuple[str, bytes]]) -> OutputRow:
    """An OUTPUT_SCHEMA row with its headers packed; the columns the sink does not read stay
    null."""
    return output_row(kind, topic, key, value, pack_headers(headers))


def test_sink_writes_key_value_and_headers_byte_exact(
    spark, kafka, unique, checkpoint_dir: Path
) -> None:
    visible, check = f"{unique}_visible", f"{unique}_check"  # not created: the broker does it
    odd = [("UNIQ_KEY", b"m-1"), ("bin", bytes(range(256))), ("empty", b""), ("dup", b"1"),
           ("dup", b"2"), ("utf8-\u00e9", "\u00e9t\u00e9".encode())]
    rows = [
        ("visible", visible, b"k\x00\xff", b"\x00body\xfe", odd),
        ("visible", visible, None, b"keyless", []),
        ("check", check, b"tx3", b"", [("CHECK", b"1")]),
        ("check", check, b"tx4", b"v" * 100_000, []),
    ]
    query = _write(spark, kafka, [_row(*r) for r in rows], checkpoint_dir)
    assert query.exception() is None
    assert sum(p["numInputRows"] for p in query.recentProgress) == 4

    got = {(topic, r.key, r.value, tuple((k, bytes(v)) for k, v in r.headers))
           for topic in (visible, check) for r in read_topic(kafka, topic)}
    want = {(r[1], r[2], r[3], tuple(r[4])) for r in rows}
    assert got == want


def test_sink_failure_fails_the_batch_with_send_failed(
    spark, kafka, unique, checkpoint_dir: Path
) -> None:
    # A sink with no dead-letter topic (option dead_letter_topic unset) cannot set a refused
    # record aside: the batch fails (the coordinator's sink always has one: test_size_limits).
    topic = f"{unique}_out"
    too_big = b"x" * (2 * 1024 * 1024)  # over the largest message (Kafka's 1 MB)
    rows = [_row("visible", topic, b"ok", b"fine", []),
            _row("visible", topic, b"big", too_big, [])]
    with pytest.raises(StreamingQueryException,
                       match=r"SendFailed: the broker refused a record for .*MessageSizeTooLarge"):
        _write(spark, kafka, rows, checkpoint_dir)
    # The batch was not committed: a restart runs it again (here: fails again, same reason).
    assert not list((checkpoint_dir / "cp" / "commits").glob("[0-9]*"))


@pytest.mark.kafka
def test_a_record_made_ahead_of_its_deadline_is_not_sent_before_it(kafka, unique) -> None:
    # Policy.timer_lead: a back-check run ahead carries its deadline; no producer may see it
    # earlier. Waiting for it does not hold up the rows behind it. The deadline is 2 s out: the
    # first record to a new topic waits for the topic's creation, which took 400 ms on a slow CI.
    topic = f"{unique}_held"
    start = int(time.time() * 1000)
    deadline = start + 2000
    rows = [output_row("check", topic, b"held", b"c", None, "r0", start, deadline),
            output_row("visible", topic, b"now", b"v", None, "r1", start, None)]
    send_rows(SinkOptions(kafka=kafka), rows)
    stamps = {r.key: r.timestamp for r in read_topic(kafka, topic)}
    assert stamps[b"now"] < deadline <= stamps[b"held"] < deadline + 2000


@pytest.mark.kafka
def test_a_hold_never_lasts_longer_than_the_lead(kafka, unique) -> None:
    # A worker whose clock is behind the driver's: the deadline looks far off, but it was
    # never more than the lead (here 300 ms) after the batch started.
    topic = f"{unique}_skew"
    now = int(time.time() * 1000)
    started = time.monotonic()
    send_rows(SinkOptions(kafka=kafka),
              [output_row("check", topic, b"k", b"c", None, "r0", now + 9_700, now + 10_000)])
    assert 0.25 < time.monotonic() - started < 3
    assert len(read_topic(kafka, topic)) == 1


@pytest.mark.kafka
def test_invalid_rows_are_refused_before_anything_is_sent(kafka, unique) -> None:
    topic = f"{unique}_good"
    options = SinkOptions(kafka=kafka)
    rows = [output_row("visible", topic, b"k", b"v", None),
            output_row("visible", "bad topic!", b"k", b"v", None),
            output_row("dead_letter", topic, b"k", b"v", b"\x00\x05")]  # headers cut short
    with pytest.raises(SendFailed, match=r"2 of 3 records cannot be written.*bad topic!.*"
                                         r"end inside a header's lengths"):
        send_rows(options, rows)
    assert read_topic(kafka, topic) == []  # nothing half-written

    result = send_rows(options, [
        output_row("visible", topic, b"k", b"v", None),
        output_row("history", topic, b"k", b"h", pack_headers([("a", None)])),
        output_row("dead_letter", topic, None, None, b"")])
    assert isinstance(result, SinkCommit)
    assert result.counts == {"visible": 1, "history": 1, "dead_letter": 1}
    # kafka-python writes a null header value as empty, and cannot send neither key nor value.
    got = sorted((r.key or b"", r.value, r.headers) for r in read_topic(kafka, topic))
    assert got == [(b"", b"", []), (b"k", b"h", [("a", b"")]), (b"k", b"v", [])]


@pytest.mark.kafka
def test_unacknowledged_records_raise_send_failed() -> None:
    broker = EmbeddedBroker().start()
    try:
        options = SinkOptions(kafka=KafkaSettings(bootstrap_servers=broker.bootstrap_servers),
                              flush_timeout_s=1.0)
        rows = [output_row("visible", "t", b"k", b"v", b"")]
        assert send_rows(options, rows).counts == {"visible": 1}
    finally:
        broker.stop()
    # The cached producer still knows the topic's leader, so send() accepts the record and
    # only the missing acknowledgement can tell: the flush runs out of time.
    with pytest.raises(SendFailed, match="KafkaTimeoutError"):
        send_rows(options, [output_row("visible", "t", b"k", b"v", b"")])


@pytest.mark.kafka
def test_a_first_record_for_a_new_topic_does_not_stall_a_big_first_batch(kafka, unique) -> None:
    """A worker's first batch after a (re)start, with a backlog: thousands of records for a
    known topic and one for a topic the broker creates on that write (a new group's check
    topic, the history topic). A fresh kafka-python producer stalled on this until the
    delivery timeout, and the batch failed (the next test has the cause)."""
    known = f"{unique}_known"
    send_rows(SinkOptions(kafka=kafka), [output_row("visible", known, b"k", b"v", None)])
    headers = pack_headers([("UNIQ_KEY", b"m"), ("PGROUP", b"g")])
    for round_ in range(3):
        # Other client settings: the sink caches producers by settings, so this one is fresh.
        fresh = KafkaSettings(kafka.bootstrap_servers, extra={"client_id": f"{unique}-{round_}"})
        rows = [output_row("visible", known, b"k%d" % i, bytes(300), headers) for i in range(5000)]
        rows.append(output_row("check", f"{unique}_new{round_}", b"k", b"check", None))
        result = send_rows(SinkOptions(kafka=fresh, flush_timeout_s=20.0), rows)
        assert result.counts == {"visible": 5000, "check": 1}
    assert len(read_topic(kafka, known, timeout_s=10)) == 1 + 3 * 5000


@pytest.mark.kafka
def test_records_for_a_known_topic_outlive_a_new_topics_first_metadata(kafka, unique) -> None:
    """tansu tells a fresh client about every topic; kafka-python tracks none of them, so the
    first metadata refresh for a new topic used to forget the others. Records for a known
    topic still in the producer's buffer (here, by a long linger) then waited for a leader
    nobody asked for: the sink's stall, deterministic. Every txstream producer is built by
    make_producer, so this holds for the sink, the client library and the tools alike."""
    known = f"{unique}_known"
    send_rows(SinkOptions(kafka=kafka), [output_row("visible", known, b"k", b"v", None)])
    producer = make_producer(kafka, linger_ms=1000)
    try:
        waiting = [producer.send(known, key=b"k%d" % i, value=b"v") for i in range(20)]
        producer.send(f"{unique}_new", value=b"first").get(timeout=10)
        producer.flush(timeout=10)
        assert [f.succeeded() for f in waiting] == [True] * 20
    finally:
        producer.close(timeout=1)
    assert len(read_topic(kafka, known, timeout_s=10)) == 1 + 20


def test_an_incomplete_batch_warns_only_about_records_it_wrote(caplog) -> None:
    """Stopping the query mid-batch aborts it: a user stopping ``txstream run`` must not read
    a failure into that, but records already written by the batch's finished tasks are worth
    a warning, saying whether the rerun writes them again."""
    settings = json.dumps(KafkaSettings(bootstrap_servers="127.0.0.1:9").as_dict())
    writer = KafkaRecordWriter(SinkOptions.parse({"kafka": settings}))
    caplog.set_level(logging.INFO, logger="txstream.sinks.kafka_sink")

    writer.abort([None, SinkCommit()], 7)
    assert [(r.levelno, "wrote nothing" in r.message) for r in caplog.records] == [
        (logging.INFO, True)]

    caplog.clear()
    writer.abort([SinkCommit({"visible": 3, "history": 1}), None], 8)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "4 records" in record.message
    assert "not written twice" in record.message

    caplog.clear()
    blind = KafkaRecordWriter(SinkOptions.parse({"kafka": settings, "replay_check": "false"}))
    blind.abort([SinkCommit({"visible": 2})], 9)
    [record] = caplog.records
    assert record.levelno == logging.WARNING and "a second time" in record.message
