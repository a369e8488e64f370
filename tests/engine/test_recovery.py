"""A new checkpoint over used topics, and a catch-up after an outage longer than the reserved
time: the real coordinator query (local Spark) on the real broker (tansu).

The simulation (``pytest -m sim``) plays these among many other schedules; here the same two
situations run through Spark and Kafka themselves: the progress time as the query's event-time
watermark, the recovery from the history topic through the source.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.support.kafka_helpers import (
    end_record,
    half_record,
    headers_of,
    produce,
    read_topic,
    wait_until,
)
from txstream.console.timeline_text import describe
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.outputs import decode_history
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.streaming.engine.records import coordinator_tag
from txstream.topics import Topics
from txstream.wire import H, Record

pytestmark = pytest.mark.spark

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW


def _txid(i: int) -> str:
    """A UUIDv7 as the client makes them (its state key is a time window's)."""
    return f"{int(time.time() * 1000):012X}7{i:03X}8{uuid.uuid4().hex[:15].upper()}"


def _config(kafka: KafkaSettings, topics: Topics, checkpoint: Path, policy: Policy,
            max_offsets: int = 0) -> RunConfig:
    return RunConfig(kafka=kafka, topics=topics, policy=policy, checkpoint_dir=str(checkpoint),
                     max_offsets_per_trigger=max_offsets,
                     query_name=f"recovery-{uuid.uuid4().hex[:6]}")


def _released(kafka: KafkaSettings, topic: str) -> Counter[str]:
    return Counter(headers_of(r)["UNIQ_KEY"] for r in read_topic(kafka, topic))


def _outcomes(kafka: KafkaSettings, topics: Topics) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for record in read_topic(kafka, topics.history):
        for note in decode_history(record.value, record.key):
            if note["event"] in ("released", "rolled_back", "discarded", "release_lost"):
                out.setdefault(str(note["transaction_id"]), []).append(str(note["event"]))
    return out


POLICY = Policy(transaction_timeout=60_000, check_interval=60_000, check_max=2,
                orphan_end_timeout=120_000, resolved_retention=5_000)


def test_a_new_checkpoint_over_used_topics_releases_nothing_twice_and_loses_nothing(
        spark, kafka: KafkaSettings, unique: str, tmp_path: Path) -> None:
    topics, real = Topics.with_prefix(f"{unique}_"), f"{unique}_real"
    committed = [_txid(i) for i in range(10)]
    rolled_back = [_txid(100 + i) for i in range(5)]
    pending = [_txid(200 + i) for i in range(5)]
    records: list[Record] = []
    for txid in committed + rolled_back + pending:
        records.append(half_record(topics, txid, "G", real, body=txid.encode()))
    records += [end_record(topics, t, "G", COMMIT) for t in committed]
    records += [end_record(topics, t, "G", ROLLBACK) for t in rolled_back]
    records += [end_record(topics, t, "G", UNKNOW) for t in pending]
    produce(kafka, records)

    first = start_coordinator(spark, _config(kafka, topics, tmp_path / "first", POLICY))
    wait_until(lambda: len(_outcomes(kafka, topics)) == 15, 180)
    assert _released(kafka, real) == Counter(committed)
    first.stop()
    # Its last batch died after releasing one pending transaction, before the history note
    # that says so (0029): the commit and the release are there, the history does not tell.
    died = pending[0]
    epoch = int(time.time() * 1000) - 1000
    produce(kafka, [end_record(topics, died, "G", COMMIT), Record(real, None, died.encode(), (
        ("UNIQ_KEY", died.encode()), (H.TRANSACTION_ID, died.encode()),
        (H.RECORD_ID, f"{coordinator_tag(topics)}.1.{epoch}.0".encode())))])

    # The checkpoint is lost; a new one over the same topics. The pending ones commit now.
    second = start_coordinator(spark, _config(kafka, topics, tmp_path / "second", POLICY))
    produce(kafka, [end_record(topics, t, "G", COMMIT) for t in pending[1:]])
    wait_until(lambda: all(t in _outcomes(kafka, topics) for t in pending), 180)
    second.stop()

    assert _released(kafka, real) == Counter(committed + pending)  # each once, none lost
    outcomes = _outcomes(kafka, topics)
    assert all(outcomes[t] == ["released"] for t in committed + pending)
    assert all(outcomes[t] == ["rolled_back"] for t in rolled_back)
    found = [note for record in read_topic(kafka, topics.history)
             for note in decode_history(record.value, record.key)
             if note["transaction_id"] == died and note["event"] == "released"]
    assert [note.get("found_on") for note in found] == [real]
    assert describe(found[0]).startswith(f"found already released on {real}")  # its history


def test_a_catch_up_after_an_outage_longer_than_the_reserved_time_releases_every_commit(
        spark, kafka: KafkaSettings, unique: str, tmp_path: Path) -> None:
    """The coordinator is down while 100 orphan end events, then 40 half messages each followed
    by its commit are written, for longer than the reserved time; it comes back reading 12
    records per micro-batch. Every commit is released; nothing is discarded."""
    topics, real = Topics.with_prefix(f"{unique}_"), f"{unique}_real"
    policy = Policy(transaction_timeout=2_000, check_interval=2_000, check_max=3,
                    reserved_time=8_000, orphan_end_timeout=60_000, resolved_retention=5_000)
    produce(kafka, [end_record(topics, f"orphan-{i}", "G", COMMIT) for i in range(100)])
    txids = [_txid(i) for i in range(40)]
    produce(kafka, [r for t in txids for r in (half_record(topics, t, "G", real),
                                               end_record(topics, t, "G", COMMIT))])
    time.sleep(10)  # the outage: longer than the reserved time
    query = start_coordinator(spark, _config(kafka, topics, tmp_path / "cp", policy,
                                             max_offsets=12))
    wait_until(lambda: all(t in _outcomes(kafka, topics) for t in txids), 300)
    query.stop()
    assert _released(kafka, real) == Counter(txids)
    assert read_topic(kafka, topics.discard) == []
    letters = [headers_of(r) for r in read_topic(kafka, topics.dead_letter)]
    assert not [h for h in letters if h.get("DLQ_CODE") == "CONTRADICTS_OUTCOME"]
