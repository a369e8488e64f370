"""The ``txstream-events`` source against the real tansu broker and the local Spark session."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import NewTopic
from kafka.errors import RequestTimedOutError
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (
    StructType,
)

from tests.support.kafka_helpers import produce, wait_until
from txstream.kafka import KafkaSettings, make_admin, make_consumer, make_producer, topic_ids
from txstream.message import Decision, EndEvent, Message
from txstream.schema import EventKind
from txstream.sources.data_loss import TOPIC_IDS
from txstream.sources.event_rows import event_struct, route
from txstream.sources.events import Malformed, parse_event
from txstream.sources.kafka_io import group_slices, metadata_calls
from txstream.sources.kafka_source import (
    KafkaEventReader,
    KafkaEventSource,
    SliceGroup,
    SourceOptions,
    SourceReadError,
    TopicSlice,
    spread_budget,
)
from txstream.sources.offsets import records_of
from txstream.sources.progress import ENDS_READ
from txstream.state.keys import PROGRESS_KEY, UNROUTABLE, KeyLayout
from txstream.streaming.engine.query import register
from txstream.timer_schedule import TICK, Schedule
from txstream.topics import Topics
from txstream.wire import Record, encode_end, encode_half, unpack_headers

pytestmark = pytest.mark.spark


def _options(kafka: KafkaSettings, topics: Topics, **extra: Any) -> dict[str, str]:
    opts = {"kafka": json.dumps(kafka.as_dict()), "half_topic": topics.half,
            "end_topic": topics.end}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


def _stream(spark: Any, kafka: KafkaSettings, topics: Topics, **extra: Any) -> Any:
    register(spark)
    reader = spark.readStream.format("txstream-events")
    for key, value in _options(kafka, topics, **extra).items():
        reader = reader.option(key, value)
    return reader.load()


def _half(topics: Topics, txid: str, **fields: Any) -> Record:
    msg = Message(topic=fields.pop("topic", "orders"),
                  body=fields.pop("body", b"body-" + txid.encode()), transaction_id=txid,
                  producer_group="pg", born_timestamp=1_700_000_000_000, **fields)
    return encode_half(msg, topics)


def _end(topics: Topics, txid: str, decision: Decision = Decision.COMMIT_MESSAGE,
         **fields: Any) -> Record:
    return encode_end(EndEvent(transaction_id=txid, producer_group="pg", decision=decision,
                               **fields), topics)


def _reader(kafka: KafkaSettings, topics: Topics, **extra: Any) -> KafkaEventReader:
    """The reader as Spark's planner process drives it, called directly (no Spark query)."""
    return KafkaEventReader(SourceOptions.parse(_options(kafka, topics, **extra)), StructType())


def test_reads_records_as_they_lie_and_they_decode_to_events_or_reasons(
    spark, kafka, topics
) -> None:
    half = _half(topics, "tx-half", tags="TagA", keys="order-1", msg_id="m-1",
                 properties={"color": "blue", "size": "L"}, check_immunity_time_s=7)
    commit = _end(topics, "tx-half", from_check=True, check_times=2)
    rollback = _end(topics, "tx-rb", Decision.ROLLBACK_MESSAGE, operator="ops",
                    remark="disk full", born_timestamp=42)
    bad_headers = (("TRAN_MSG", b"false"), ("PGROUP", b"\xff\xfe"), ("dup", b""), ("dup", b"2"))
    malformed = [
        Record(topics.half, b"k-not-half", b"v1", bad_headers),
        _half(topics, "k-too-big", body=b"x" * 64),  # over max_body=32 below
        _half(topics, "k-bad-topic", topic="bad topic!"),
        Record(topics.end, b"k-unknown", None, (("COMMIT_OR_ROLLBACK", b"MAYBE"),
                                                ("PGROUP", b"pg"))),
        Record(topics.end, None, b"no key", (("COMMIT_OR_ROLLBACK", b"COMMIT_MESSAGE"),
                                             ("PGROUP", b"pg"))),
    ]
    sent = [half, commit, rollback, *malformed]
    produce(kafka, sent)

    name = f"events_{uuid.uuid4().hex[:8]}"
    query = (_stream(spark, kafka, topics).writeStream.format("memory")
             .queryName(name).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    rows = [r.asDict() for r in spark.table(name).collect()]
    # Every batch also carries its progress row (how far the end topic is read).
    assert {r["kind"] for r in rows if r["state_key"] == PROGRESS_KEY} == {EventKind.PROGRESS}
    rows = [r for r in rows if r["kind"] != EventKind.PROGRESS]
    assert len(rows) == len(sent)

    # The source hands over each record as it lies, with the state key its id routes to.
    by_record = {(r["kind"], r["key"]): r for r in rows}
    layout = KeyLayout()
    for record in sent:
        kind = EventKind.HALF if record.topic == topics.half else EventKind.END
        row = by_record[(kind, record.key)]
        assert row["value"] == record.value and row["error"] is None
        assert unpack_headers(row["headers"]) == [(k, v or b"") for k, v in record.headers]
        assert row["state_key"] == route(record.key, layout)
        assert row["src_partition"] is not None and row["src_offset"] is not None
    assert by_record[(EventKind.END, None)]["state_key"] == UNROUTABLE

    # The operator decodes each row once: an event, or the reason it is none.
    def decoded(kind: int, key: bytes | None) -> Any:
        row = by_record[(kind, key)]
        return parse_event(row["kind"], row["key"], row["value"], row["headers"],
                           row["src_partition"], row["src_offset"], max_body=32)

    h = decoded(EventKind.HALF, b"tx-half")
    assert isinstance(h, Message)
    assert (h.transaction_id, h.producer_group, h.topic) == ("tx-half", "pg", "orders")
    assert (h.body, h.tags, h.keys, h.msg_id) == (b"body-tx-half", "TagA", "order-1", "m-1")
    assert h.properties == {"color": "blue", "size": "L"}
    assert (h.born_timestamp, h.check_immunity_time_s) == (1_700_000_000_000, 7)
    row = by_record[(EventKind.HALF, b"tx-half")]
    assert (h.queue_id, h.queue_offset) == (row["src_partition"], row["src_offset"])

    c = decoded(EventKind.END, b"tx-half")
    assert isinstance(c, EndEvent) and c.decision is Decision.COMMIT_MESSAGE
    assert (c.from_check, c.check_times) == (True, 2)
    rb = decoded(EventKind.END, b"tx-rb")
    assert isinstance(rb, EndEvent)
    assert (rb.decision, rb.operator, rb.remark) == (Decision.ROLLBACK_MESSAGE, "ops",
                                                     "disk full")
    assert (rb.from_check, rb.check_times, rb.born_timestamp) == (False, None, 42)

    reasons = {key: decoded(kind, key) for kind, key in [
        (EventKind.HALF, b"k-not-half"), (EventKind.HALF, b"k-too-big"),
        (EventKind.HALF, b"k-bad-topic"), (EventKind.END, b"k-unknown"), (EventKind.END, None)]}
    assert all(isinstance(r, Malformed) for r in reasons.values())
    assert "TRAN_MSG" in reasons[b"k-not-half"].reason or "UTF-8" in reasons[b"k-not-half"].reason
    assert "exceeds the limit of 32" in reasons[b"k-too-big"].reason
    assert "bad topic!" in reasons[b"k-bad-topic"].reason
    assert "MAYBE" in reasons[b"k-unknown"].reason
    assert "transaction id" in reasons[None].reason


def test_restart_from_checkpoint_reads_every_record_once(
    spark, kafka, topics, checkpoint_dir: Path
) -> None:
    first = [r for i in range(20) for r in (_half(topics, f"a{i}"), _end(topics, f"a{i}"))]
    produce(kafka, first)
    out = checkpoint_dir / "out"
    cp = checkpoint_dir / "cp"

    def start(trigger: dict[str, Any]) -> Any:
        return (_stream(spark, kafka, topics, max_offsets_per_trigger=10)
                .select("kind", "key", "src_partition", "src_offset")
                .writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(cp)).trigger(**trigger).start())

    query = start({"processingTime": "0 seconds"})
    # Stop part-way: after a few batches committed, with records left and a batch maybe running.
    wait_until(lambda: sum(1 for p in query.recentProgress if p["numInputRows"]) >= 2, 90)
    query.stop()
    # Rows: the records (at most the limit) and the batch's progress row.
    sizes = [p["numInputRows"] - 1 for p in query.recentProgress if p["numInputRows"]]
    assert sizes[0] == 10 and max(sizes) <= 10, sizes  # the limit is used, and held
    done_before = sum(sizes)
    assert done_before < len(first)

    second = [r for i in range(10) for r in (_half(topics, f"b{i}"), _end(topics, f"b{i}"))]
    produce(kafka, second)
    query = start({"availableNow": True})
    query.awaitTermination(120)
    assert query.exception() is None
    sizes = [p["numInputRows"] - 1 for p in query.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 10, sizes  # records; each batch also has its progress row

    rows = [r for r in spark.read.parquet(str(out)).collect() if r.kind != EventKind.PROGRESS]
    where = [(r.kind, r.src_partition, r.src_offset) for r in rows]
    assert len(where) == len(set(where)) == len(first) + len(second)  # no loss, no duplicate
    got = sorted((r.kind, bytes(r.key).decode()) for r in rows)
    want = sorted((k, f"{p}{i}") for p, n in (("a", 20), ("b", 10)) for i in range(n)
                  for k in (EventKind.HALF, EventKind.END))
    assert got == want


@pytest.mark.kafka
def test_latest_offset_limits_and_new_partitions(kafka, topics) -> None:
    reader = _reader(kafka, topics, topic_partitions=2)
    start = reader.initialOffset()
    assert start == {topics.half: {"0": 0, "1": 0}, topics.end: {"0": 0, "1": 0},
                     ENDS_READ: {"at": 0}, TOPIC_IDS: _ids(kafka, topics)}
    # 12 records on half/0, 3 on half/1, none on the end topic.
    records = [Record(topics.half, b"k", b"v%d" % i, ()) for i in range(15)]
    producer = make_producer(kafka)
    for i, r in enumerate(records):
        producer.send(r.topic, key=r.key, value=r.value, partition=0 if i < 12 else 1)
    producer.flush()
    producer.close()

    latest = reader.latestOffset(start, ReadAllAvailable())
    assert records_of(latest) == {topics.half: {"0": 12, "1": 3}, topics.end: {"0": 0, "1": 0}}
    limited = reader.latestOffset(start, ReadMaxRows(9))
    assert records_of(limited) == {topics.half: {"0": 6, "1": 3},
                                   topics.end: {"0": 0, "1": 0}}
    assert reader.getDefaultReadLimit() == ReadAllAvailable()
    # No new data: the same offsets, as the same JSON (Spark compares the text).
    again = reader.latestOffset(latest, ReadMaxRows(9))
    assert json.dumps(again) == json.dumps(latest)
    # A partition the checkpoint does not know (added after it was written) is read from 0.
    old_checkpoint = {topics.half: {"0": 12}, topics.end: {"0": 0, "1": 0}}
    assert reader.latestOffset(old_checkpoint, ReadAllAvailable())[topics.half] == {
        "0": 12, "1": 3}
    slices = reader.partitions(old_checkpoint, latest)
    assert slices == [SliceGroup((TopicSlice(topics.half, 1, 0, 3, EventKind.HALF, 0,
                                             latest[TOPIC_IDS][topics.half]),),
                                 latest[ENDS_READ]["at"])]
    assert sum(b.num_rows for b in _read(kafka, topics, slices[0])) == 3 + 1  # and progress

    # The broker has fewer records than the checkpoint read (a memory broker restarted).
    ahead = {topics.half: {"0": 20, "1": 3}, topics.end: {"0": 0, "1": 0}}
    with pytest.raises(SourceReadError,
                       match=r"HALF_TOPIC/0 ends at 12, below the checkpoint's 20"):
        _reader(kafka, topics, loss_confirm_ms="0").latestOffset(ahead, ReadAllAvailable())
    lenient = _reader(kafka, topics, fail_on_data_loss="false", loss_confirm_ms="0")
    assert lenient.latestOffset(ahead, ReadAllAvailable())[topics.half] == {"0": 0, "1": 3}

    # Trigger.AvailableNow: nothing produced after prepare is planned.
    reader.prepareForTriggerAvailableNow()
    produce(kafka, [Record(topics.end, b"late", b"v", ())])
    assert records_of(reader.latestOffset(latest, ReadAllAvailable())) == records_of(latest)


def _create_again(kafka: KafkaSettings, topic: str) -> None:
    """Delete ``topic`` and create it again, with 1 partition."""
    admin = make_admin(kafka)
    try:
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics() or None)
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


def _ids(kafka: KafkaSettings, topics: Topics) -> dict[str, str]:
    consumer = make_consumer(kafka)
    try:
        consumer.topics()
        return topic_ids(consumer, [topics.half, topics.end])
    finally:
        consumer.close()


@pytest.mark.kafka
def test_a_half_topic_created_again_is_read_again_even_past_the_checkpoint(kafka, topics
                                                                            ) -> None:
    """Deleted and created again, the half topic's offsets start over and here pass the
    checkpoint's before the source looks: only the topic's id tells."""
    reader = _reader(kafka, topics, topic_partitions=1)
    start = reader.initialOffset()
    produce(kafka, [_half(topics, f"T{i}") for i in range(3)])

    def planned() -> dict | None:
        offset = reader.latestOffset(start, ReadAllAvailable())
        return offset if records_of(offset)[topics.half] == {"0": 3} else None

    read = wait_until(planned)
    before = _ids(kafka, topics)
    _create_again(kafka, topics.half)
    produce(kafka, [_half(topics, f"N{i}") for i in range(5)])
    after = wait_until(lambda: (ids := _ids(kafka, topics))[topics.half] != before[
        topics.half] and ids)
    assert after[topics.end] == before[topics.end]
    strict = _reader(kafka, topics)
    with pytest.raises(SourceReadError, match="was deleted and created again"):
        strict.latestOffset(read, ReadAllAvailable())
    lenient = _reader(kafka, topics, fail_on_data_loss="false")
    again = lenient.latestOffset(read, ReadAllAvailable())
    assert records_of(again)[topics.half] == {"0": 0}  # read again from the start next
    assert again[TOPIC_IDS] == after
    assert records_of(lenient.latestOffset(again, ReadAllAvailable()))[topics.half] == {"0": 5}


def _rows_read(reader: KafkaEventReader, start: dict, end: dict) -> list[dict[str, Any]]:
    return [row for part in reader.partitions(start, end) for batch in reader.read(part)
            for row in batch.to_pylist()]


def _halves_read(reader: KafkaEventReader, start: dict, end: dict) -> list[str]:
    return [bytes(row["key"]).decode() for row in _rows_read(reader, start, end)
            if row["kind"] == EventKind.HALF]


@pytest.mark.kafka
def test_a_planned_batch_past_a_partitions_end_waits_for_it_and_skips_only_a_new_topic(
        kafka, topics) -> None:
    """A task's read of a planned batch that the partition ends before (a new leader's high
    watermark, for a while) waits ``loss_confirm_ms`` for the records before taking them for
    lost (fail_on_data_loss=false); a topic created again since planning loses them at once."""
    reader = KafkaEventReader(SourceOptions.parse(_options(
        kafka, topics, topic_partitions=1, fail_on_data_loss="false", read_timeout_ms=300,
        loss_confirm_ms=60_000)), event_struct())
    start = reader.initialOffset()  # (creates the topics: the half one with 1 partition)
    produce(kafka, [_half(topics, f"T{i}") for i in range(2)])
    wait_until(lambda: records_of(reader.latestOffset(start, ReadAllAvailable()))[
        topics.half] == {"0": 2} or None)
    ids = _ids(kafka, topics)
    past = {topics.half: {"0": 4}, topics.end: {"0": 0}, TOPIC_IDS: ids}
    late = threading.Timer(1.5, produce, (kafka, [_half(topics, f"T{i}") for i in (2, 3)]))
    late.start()
    try:  # (before: records [2, 4) skipped after one read timeout, 300 ms)
        assert _halves_read(reader, start, past) == ["T0", "T1", "T2", "T3"]
    finally:
        late.join()
    _create_again(kafka, topics.half)
    wait_until(lambda: _ids(kafka, topics).get(topics.half) not in (None, ids[topics.half])
               or None)
    began = time.monotonic()  # gone for good: not waited for the 60 s of loss_confirm_ms
    assert _halves_read(reader, start, past) == []
    assert time.monotonic() - began < 30


@pytest.mark.kafka
def test_a_new_checkpoint_marks_the_half_messages_a_coordinator_before_it_may_have_read(
        kafka, topics) -> None:
    """0029: below where the half topic ended when the recovery began, a half message comes as
    HALF_AGAIN; one written since, as HALF."""
    history = f"{topics.half}_HISTORY"
    produce(kafka, [_half(topics, f"old{i}") for i in range(3)]
            + [Record(history, b"1", b"[]"), _end(topics, "old0")])
    reader = KafkaEventReader(SourceOptions.parse(_options(kafka, topics, journal_topic=history)),
                              event_struct())
    start = wait_until(lambda: (o := reader.initialOffset()).get("_journal") and o)
    assert sum(start["_journal"]["half"].values()) == 3
    produce(kafka, [_half(topics, f"new{i}") for i in range(2)])
    got: list[tuple[str, int]] = []
    for _ in range(2):  # the history read back, then the half and end topics
        end = reader.latestOffset(start, ReadAllAvailable())
        got += [(bytes(row["key"]).decode(), row["kind"]) for row in _rows_read(reader, start, end)
                if row["kind"] in (EventKind.HALF, EventKind.HALF_AGAIN, EventKind.END)]
        start = end
    assert sorted(got) == sorted([(f"old{i}", EventKind.HALF_AGAIN) for i in range(3)]
                                 + [(f"new{i}", EventKind.HALF) for i in range(2)]
                                 + [("old0", EventKind.END)])


@pytest.mark.kafka
def test_the_offset_ticks_when_a_scheduled_timer_is_due(kafka, topics, tmp_path) -> None:
    timers = tmp_path / "timers.json"
    reader = _reader(kafka, topics, timer_file=timers)
    start = reader.initialOffset()
    assert start[TICK] == {"at": 0, "known": 1}
    # Nothing scheduled, no input: the same offset, so Spark runs no batch.
    assert json.dumps(reader.latestOffset(start, ReadAllAvailable())) == json.dumps(start)
    far = int(time.time() * 1000) + 3_600_000
    Schedule({7: far}).save(timers)
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    # A timeout passed: the tick moves to now, and that batch reads no records.
    Schedule({7: far, 8: 5}).save(timers)
    before = int(time.time() * 1000)
    ticked = reader.latestOffset(start, ReadAllAvailable())
    assert ticked[TICK]["known"] == 1 and ticked[TICK]["at"] >= before
    # The batch it starts reads no records; its progress row says how far the end topic is.
    assert {t: ps for t, ps in ticked.items() if t not in (TICK, ENDS_READ)} == {
        t: ps for t, ps in start.items() if t not in (TICK, ENDS_READ)}
    assert ticked[ENDS_READ]["at"] >= start[ENDS_READ]["at"]
    assert reader.partitions(start, ticked) == [SliceGroup((), ticked[ENDS_READ]["at"])]
    # The batch that tick started ran the timeout: once committed, it moves no more.
    assert reader.latestOffset(ticked, ReadAllAvailable()) == ticked
    # Input moves the topic offsets and keeps the tick.
    produce(kafka, [Record(topics.end, b"k", b"v", ())])
    # The broker's high watermark may trail the acknowledgement by a fetch: the record is in
    # the next trigger's offset at the latest.
    moved = wait_until(lambda: (o := reader.latestOffset(ticked, ReadAllAvailable()))
                       and sum(o[topics.end].values()) == 1 and o, timeout_s=10)
    assert moved[TICK] == ticked[TICK]
    # A checkpoint from before ticks (no tick in its offset) runs batches back to back.
    old = {t: ps for t, ps in moved.items() if t != TICK}
    assert reader.latestOffset(old, ReadAllAvailable())[TICK]["known"] == 0
    # Without a timer file the offset holds no tick at all.
    assert TICK not in _reader(kafka, topics).latestOffset(old, ReadAllAvailable())


def _read(kafka: KafkaSettings, topics: Topics, part: TopicSlice | SliceGroup,
          **extra: Any) -> list[Any]:
    """What a Spark task gets from ``read``: Arrow batches."""
    source = KafkaEventSource(_options(kafka, topics, **extra))
    return list(source.streamReader(_event_struct()).read(part))


def _event_struct() -> StructType:
    return event_struct()


@pytest.mark.kafka
def test_read_never_hangs_on_missing_records(kafka, topics) -> None:
    reader = _reader(kafka, topics)
    reader.initialOffset()
    produce(kafka, [Record(topics.end, b"k", b"v", ())] * 2)
    partition = next(p for p, n in reader.latestOffset(reader.initialOffset(),
                                                       ReadAllAvailable())[topics.end].items()
                     if n > 0)
    # Planned up to offset 50, but the broker only has a couple of records: a clear error.
    beyond = TopicSlice(topics.end, int(partition), 0, 50, False)
    began = time.monotonic()
    with pytest.raises(SourceReadError, match="stuck at offset"):
        _read(kafka, topics, beyond, read_timeout_ms=700)
    assert time.monotonic() - began < 10


class _NotUtf8(str):
    """A header name kafka-python writes as bytes that are not UTF-8, as any client could."""

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"\xff\xfe-name"


@pytest.mark.kafka
def test_unreadable_record_becomes_malformed_instead_of_stopping_the_source(
    kafka, topics
) -> None:
    reader = _reader(kafka, topics, read_timeout_ms=2000)
    start = reader.initialOffset()
    good = [("COMMIT_OR_ROLLBACK", b"COMMIT_MESSAGE"), ("PGROUP", b"pg")]
    producer = make_producer(kafka)
    try:
        # Partition 0: one record per record batch. Partition 1: all in one batch.
        for partition, flush_each in ((0, True), (1, False)):
            for key, headers in ((b"a", good), (b"bad", [(_NotUtf8("x"), b"y")]), (b"b", good)):
                producer.send(topics.end, key=key, value=None, headers=headers,
                              partition=partition)
                if flush_each:
                    producer.flush()
        producer.flush()
    finally:
        producer.close()
    began = time.monotonic()
    end = reader.latestOffset(start, ReadAllAvailable())  # planning must get past it too
    assert end[topics.end] == {"0": 3, "1": 3}
    rows = {}
    for part in reader.partitions(start, end):
        for batch in _read(kafka, topics, part, read_timeout_ms=2000):
            for row in batch.to_pylist():
                if row["kind"] != EventKind.PROGRESS:
                    rows[(row["src_partition"], row["src_offset"])] = row
    assert time.monotonic() - began < 10
    assert sorted(rows) == [(p, o) for p in (0, 1) for o in range(3)]  # each offset once
    assert {row["kind"] for row in rows.values()} == {EventKind.END}
    assert [rows[(0, o)]["error"] is None for o in range(3)] == [True, False, True]
    bad = rows[(0, 1)]
    assert bad["error"].startswith("unreadable record (CorruptRecordError")
    assert (bad["key"], bad["value"], bad["state_key"]) == (None, None, UNROUTABLE)
    assert rows[(0, 2)]["key"] == b"b" and rows[(0, 2)]["state_key"] != UNROUTABLE
    # kafka-python cannot parse past a bad record inside its batch: the rest of that batch is
    # dead-lettered as unreadable (with its offsets) rather than lost or blocking.
    assert [rows[(1, o)]["error"] is None for o in range(3)] == [True, False, False]


def _end_rows(kafka: KafkaSettings, topics: Topics, reader: KafkaEventReader, start: dict
              ) -> dict[tuple[int, int], dict]:
    end = wait_until(lambda: (o := reader.latestOffset(start, ReadAllAvailable()))[topics.end]
                     != start[topics.end] and o)
    return {(row["src_partition"], row["src_offset"]): row
            for part in reader.partitions(start, end)
            for batch in _read(kafka, topics, part, read_timeout_ms=2000)
            for row in batch.to_pylist() if row["kind"] != EventKind.PROGRESS}


@pytest.mark.kafka
def test_records_compressed_with_any_of_kafkas_codecs_are_read(kafka, topics,
                                                               monkeypatch) -> None:
    """A Java or librdkafka producer may compress with gzip, snappy, lz4 or zstd: each is read.
    A codec kafka-python could not read makes its records unreadable (dead-lettered), never
    stops the source."""
    from kafka import codec as kafka_codec

    reader = _reader(kafka, topics, read_timeout_ms=2000)
    start = reader.initialOffset()
    codecs = ("gzip", "snappy", "lz4", "zstd")
    for partition, codec in enumerate(codecs):
        producer = make_producer(kafka, compression_type=codec)
        try:
            for txid in (f"{codec}-1", f"{codec}-2"):
                r = _end(topics, txid)
                producer.send(r.topic, key=r.key, value=r.value, headers=list(r.headers),
                              partition=partition % 2)
            producer.flush()
        finally:
            producer.close()
    rows = _end_rows(kafka, topics, reader, start)
    assert sorted(bytes(r["key"]).decode() for r in rows.values()) == sorted(
        f"{c}-{i}" for c in codecs for i in (1, 2))
    assert all(r["error"] is None for r in rows.values())
    monkeypatch.setattr(kafka_codec, "has_zstd", lambda: False)
    unreadable = _end_rows(kafka, topics, _reader(kafka, topics, read_timeout_ms=2000), start)
    assert sorted(unreadable) == sorted(rows)
    failed = {k for k, r in unreadable.items() if r["error"] is not None}
    assert failed == {k for k, r in rows.items() if bytes(r["key"]).startswith(b"zstd")}
    assert all("UnsupportedCodecError" in unreadable[k]["error"] for k in failed)


def test_spread_budget_is_fair_and_never_exceeds() -> None:
    assert spread_budget([100, 100], 10) == [5, 5]
    assert spread_budget([2, 100, 100], 10) == [2, 4, 4]
    assert spread_budget([0, 3, 50], 1000) == [0, 3, 50]
    assert spread_budget([5, 9, 7], 2) == [0, 1, 1]  # the ones furthest behind first
    assert spread_budget([10, 10, 10], 4) == [2, 1, 1]
    for avail, budget in (([7, 1, 30, 0], 13), ([3] * 9, 5), ([1000], 1)):
        take = spread_budget(avail, budget)
        assert sum(take) == min(budget, sum(avail))
        assert all(0 <= t <= a for t, a in zip(take, avail))


def test_slices_are_grouped_into_as_many_tasks_as_asked_by_size() -> None:
    s = [TopicSlice("h", 0, 0, 100, True), TopicSlice("h", 1, 0, 10, True),
         TopicSlice("e", 0, 5, 95, False), TopicSlice("e", 1, 0, 20, False)]
    groups = group_slices(s, 2)
    assert [sum(p.end - p.start for p in g.slices) for g in groups] == [110, 110]
    assert [g.slices for g in groups] == [(s[0], s[1]), (s[2], s[3])]
    assert group_slices(s[:1], 2) == [SliceGroup((s[0],))]
    assert len(group_slices(s, 8)) == 4 and group_slices([], 2) == []


def test_a_kafka_error_while_planning_names_the_broker() -> None:
    options = SourceOptions(kafka=KafkaSettings(bootstrap_servers="127.0.0.1:1"))
    with pytest.raises(SourceReadError, match=r"^broker 127\.0\.0\.1:1: the topics' metadata did "
                                              r"not come: RequestTimedOutError: "), \
            metadata_calls(options):
        raise RequestTimedOutError("Request timed out after 29999 ms")


@pytest.mark.kafka
def test_a_quiet_source_waits_before_asking_and_still_finds_what_came(kafka, topics) -> None:
    clock = [1_000_000]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += int(seconds * 1000)

    reader = KafkaEventReader(SourceOptions.parse(_options(kafka, topics, idle_wait_ms=200)),
                              StructType(), clock=lambda: clock[0], sleep=sleep)
    start = reader.initialOffset()
    assert records_of(reader.latestOffset(start, ReadAllAvailable())) == records_of(start)
    assert waits == []  # quiet only from now on
    clock[0] += 499
    reader.latestOffset(start, ReadAllAvailable())
    assert waits == []
    clock[0] += 1
    reader.latestOffset(start, ReadAllAvailable())
    assert waits == [0.2]  # quiet for QUIET_AFTER_MS: wait, then ask
    produce(kafka, [_end(topics, "tx-after-quiet")])
    clock[0] += 1_000
    moved = reader.latestOffset(start, ReadAllAvailable())
    assert waits == [0.2, 0.2]
    assert sum(records_of(moved)[topics.end].values()) == 1  # found after the wait
    clock[0] += 5_000
    reader.latestOffset(moved, ReadAllAvailable())
    assert waits == [0.2, 0.2]  # something new at the last ask: no wait
