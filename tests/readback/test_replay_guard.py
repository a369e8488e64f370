"""Exactly-once release: record ids that a replayed batch repeats, and the sink's
search for what a crashed run already wrote (``txstream.readback.replay``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import NewTopic

from tests.support.kafka_helpers import read_topic
from txstream.kafka import KafkaSettings, make_admin, make_producer
from txstream.message import Message
from txstream.schema import OUTPUT_COLUMNS, OUTPUT_SCHEMA
from txstream.state.bucket import Bucket
from txstream.state.policy import Policy
from txstream.streaming.engine.records import coordinator_tag, record_id
from txstream.topics import Topics
from txstream.wire import H, pack_headers

T0 = 1_700_000_000_000


def test_numbers_continue_across_the_state_and_repeat_from_the_same_state() -> None:
    bucket = Bucket()
    assert bucket.take_numbers(3, T0) == (T0, 0)
    assert bucket.take_numbers(2, T0 + 500) == (T0, 3)  # the epoch stays, numbers go on
    saved = bucket.encode()
    first, replay = Bucket.decode(saved), Bucket.decode(saved)
    assert first.take_numbers(4, T0 + 900) == replay.take_numbers(4, T0 + 900) == (T0, 5)
    assert Bucket.decode(first.encode()) == first and first.next_number == 9


def test_a_new_bucket_starts_its_numbering_at_the_batch_time() -> None:
    half = Message("orders", b"b", transaction_id="p", msg_id="p", producer_group="G",
                   born_timestamp=T0)
    bucket = Bucket()
    bucket.apply(half, T0, Policy())
    fresh = Bucket.decode(bucket.encode())
    assert (fresh.epoch, fresh.next_number, len(fresh)) == (None, 0, 1)
    assert fresh.take_numbers(1, T0 + 7) == (T0 + 7, 0)
    with pytest.raises(ValueError):
        Bucket().take_numbers(-1, T0)


def test_record_ids_name_the_coordinator_bucket_epoch_and_number() -> None:
    tag = coordinator_tag(Topics.with_prefix("a_"))
    assert tag != coordinator_tag(Topics.with_prefix("b_")) and len(tag) == 8
    assert record_id(tag, 5, T0, 12) == f"{tag}.5.{T0}.12"


def _real_topic(kafka: KafkaSettings, unique: str, partitions: int) -> str:
    topic = f"{unique}-real"
    admin = make_admin(kafka)
    try:
        admin.create_topics([NewTopic(topic, partitions, -1)])
    finally:
        admin.close()
    return topic


@pytest.mark.kafka
def test_written_ids_finds_exactly_the_records_on_their_topics(
    kafka: KafkaSettings, unique: str
) -> None:
    from txstream.readback.replay import written_ids

    topic, absent = _real_topic(kafka, unique, 3), f"{unique}-never-written"
    tag, other = "0badc0de", "0ddba11e"
    batch_ms = int(time.time() * 1000)
    ids = [record_id(tag, b, batch_ms, n) for b in range(3) for n in range(4)]
    producer = make_producer(kafka)
    try:
        old = batch_ms - 3_600_000  # an hour before: another batch of this coordinator
        producer.send(topic, b"early", headers=[(H.RECORD_ID, f"{tag}.0.{old}.0".encode())],
                      timestamp_ms=old, partition=0)
        for i, rid in enumerate(ids[:8]):  # keyed and keyless, over every partition
            producer.send(topic, key=None if i % 2 else rid.encode(), value=b"v",
                          headers=[(H.RECORD_ID, rid.encode())])
        # Another coordinator's record with one of our numbers must not count as ours.
        producer.send(topic, b"x", headers=[(H.RECORD_ID, ids[9].replace(tag, other).encode())])
        producer.send(topic, b"no id")
        producer.flush()
    finally:
        producer.close()
    wanted = {topic: set(ids), absent: {record_id(tag, 0, batch_ms, 99)}}
    assert written_ids(kafka, wanted, batch_ms) == set(ids[:8])
    assert written_ids(kafka, {absent: {ids[0]}}, batch_ms) == set()
    assert written_ids(kafka, {}, batch_ms) == set()


@pytest.mark.kafka
def test_a_look_finds_a_predecessors_release_by_its_transaction_id(
    kafka: KafkaSettings, unique: str
) -> None:
    """A new checkpoint's question (0029): which of these transactions did a coordinator before
    it release, under an id this checkpoint did not give?"""
    from txstream.readback.release_index import released_by_others as released_earlier

    topic, absent = _real_topic(kafka, unique, 2), f"{unique}-never-written"
    tag, other, now = "0badc0de", "0ddba11e", int(time.time() * 1000)
    ours = f"{tag}.7.{now}."  # this checkpoint's ids for the state key
    releases = {"tx-before": f"{tag}.7.{now - 60_000}.3",  # the predecessor's
                "tx-other-key": f"{tag}.2.{now - 90_000}.0",  # the predecessor's, another key
                "tx-ours": f"{ours}0",  # this checkpoint released it (a replay asks again)
                "tx-not-ours": f"{other}.7.{now - 60_000}.1"}  # another coordinator's
    producer = make_producer(kafka)
    try:
        for i, (txid, rid) in enumerate(releases.items()):
            producer.send(topic, b"m", partition=i % 2, headers=[
                (H.TRANSACTION_ID, txid.encode()), (H.RECORD_ID, rid.encode())])
        producer.send(topic, b"no id", headers=[(H.TRANSACTION_ID, b"tx-unnamed")])
        producer.flush()
    finally:
        producer.close()
    since = now - 120_000
    wanted = {topic: {txid: since for txid in [*releases, "tx-unnamed", "tx-never"]},
              absent: {"tx-elsewhere": since}}
    assert released_earlier(kafka, wanted, tag, ours) == {"tx-before", "tx-other-key"}
    assert released_earlier(kafka, {topic: {}}, tag, ours) == set()


def test_a_task_outside_spark_is_always_checked() -> None:
    from txstream.readback.replay import replay_suspected

    assert replay_suspected() is True


def _write(spark: Any, kafka: KafkaSettings, rows: list[tuple[Any, ...]], base: Path,
           replay_check: bool) -> None:
    """Stream OUTPUT_SCHEMA ``rows`` through the sink in one micro-batch, checkpointed."""
    from txstream.streaming.engine.query import register

    register(spark)
    source = base / "in"
    if not source.exists():
        spark.createDataFrame(rows, OUTPUT_SCHEMA).coalesce(1).write.parquet(str(source))
    query = (spark.readStream.schema(OUTPUT_SCHEMA).parquet(str(source))
             .writeStream.format("txstream-records")
             .option("kafka", json.dumps(kafka.as_dict()))
             .option("replay_check", str(replay_check).lower())
             .option("checkpointLocation", str(base / "cp"))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination(180)
    finally:
        query.stop()  # released before the next run may take the checkpoint
    assert query.exception() is None


@pytest.mark.spark
@pytest.mark.parametrize("replay_check", [True, False])
def test_a_batch_replayed_after_its_commit_was_lost_is_not_written_twice(
    spark: Any, kafka: KafkaSettings, unique: str, checkpoint_dir: Path, replay_check: bool
) -> None:
    topic, history = f"{unique}-real", f"{unique}-history"
    tag, batch_ms = "5eed5eed", int(time.time() * 1000)

    def row(kind: str, to: str, number: int | None) -> tuple[Any, ...]:
        rid = record_id(tag, number % 4, batch_ms, number) if number is not None else None
        headers = pack_headers([(H.RECORD_ID, rid.encode())] if rid else [])
        given = {"kind": kind, "topic": to, "key": None if number and number % 2 else b"k",
                 "value": f"v{number}".encode(), "headers": headers, "record_id": rid,
                 "batch_ms": batch_ms if rid else None}
        return tuple(given.get(name) for name, _ in OUTPUT_COLUMNS)

    rows = [row("visible", topic, n) for n in range(20)] + [
        row("history", history, n) for n in range(20, 25)] + [row("visible", topic, None)]
    _write(spark, kafka, rows, checkpoint_dir, replay_check)
    # The crash: the batch was written, its commit never recorded. The restart replays it.
    commits = checkpoint_dir / "cp" / "commits"
    assert (commits / "0").exists()
    for name in ("0", ".0.crc"):  # the log entry and its checksum file
        (commits / name).unlink(missing_ok=True)
    _write(spark, kafka, rows, checkpoint_dir, replay_check)
    assert (checkpoint_dir / "cp" / "commits" / "0").exists()

    copies = 1 if replay_check else 2
    got = sorted(r.value for r in read_topic(kafka, topic))
    assert got == sorted([f"v{n}".encode() for n in range(20)] * copies + [b"vNone"] * 2)
    assert len(read_topic(kafka, history)) == 5 * copies


def test_a_replay_numbered_otherwise_finds_its_transactions_records_by_transaction(
        kafka: KafkaSettings, unique: str) -> None:
    # A replay that found a body gone the crashed run had read emits other records before the
    # rest, which it numbers otherwise (decision 0005): a release, check request or discard
    # of the call is found by its transaction on its topic; a message's own key is no
    # transaction, and an earlier call's numbers are not this one's.
    from tests.support.kafka_helpers import output_row
    from txstream.sinks.kafka_sink import SinkOptions, send_rows

    real, check, tag, batch_ms = f"{unique}-real", f"{unique}-check", "5eed5eed", int(
        time.time() * 1000)

    def row(kind: str, topic: str, key: bytes, txid: str | None, number: int) -> Any:
        rid = record_id(tag, 7, batch_ms, number)
        headers = [(H.RECORD_ID, rid.encode())] + (
            [(H.TRANSACTION_ID, txid.encode())] if txid else [])
        return output_row(kind, topic, key, f"{kind}-{key.decode()}-{txid}".encode(),
                          pack_headers(headers), rid, batch_ms)

    options = SinkOptions(kafka=kafka)
    send_rows(options, [row("visible", real, b"order-4", "tx-d", 5)])  # an earlier call's
    send_rows(options, [row("visible", real, b"order-1", "tx-a", 10),
                        row("check", check, b"tx-b", None, 11)])
    # The replay: a dead letter first (a body found gone), the rest one number on; a message
    # whose key is tx-a's id, with no transaction of its own; tx-d's release of this call.
    commit = send_rows(options, [row("dead_letter", f"{unique}-dlq", b"tx-c", None, 10),
                                 row("visible", real, b"order-1", "tx-a", 11),
                                 row("check", check, b"tx-b", None, 12),
                                 row("visible", real, b"tx-a", None, 13),
                                 row("visible", real, b"order-4", "tx-d", 14)])
    assert commit.already_written == 2
    assert sorted(r.value for r in read_topic(kafka, real)) == [
        b"visible-order-1-tx-a", b"visible-order-4-tx-d", b"visible-order-4-tx-d",
        b"visible-tx-a-None"]
    assert [r.value for r in read_topic(kafka, check)] == [b"check-tx-b-None"]
