"""No record can stop the coordinator: the size limit it writes under, with a limit set here.

A half message whose records would not fit is refused as it comes; a dead letter too big to
carry its record carries a reference to it; a record the producer or the broker refuses for
its size goes to the dead-letter topic as a reference, and the batch goes on.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import end_record, half_record, output_row, produce, wait_until
from txstream.kafka import KafkaSettings, read_topic
from txstream.message import Decision
from txstream.sinks.kafka_sink import SinkOptions, send_rows
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.topics import Topics
from txstream.wire import H, Record, header_dict

LIMIT = 4_000


def _dead_letters(kafka: KafkaSettings, topics: Topics) -> dict[str, dict[str, str]]:
    return {(r.key or b"").decode(): {**header_dict(r.headers), "_value": str(len(r.value or b""))}
            for r in read_topic(kafka, topics.dead_letter)}


@pytest.mark.spark
def test_oversized_inputs_are_dead_lettered_and_the_coordinator_goes_on(
    spark: Any, kafka: KafkaSettings, checkpoint_dir: Path
) -> None:
    topics = Topics.with_prefix(f"s{uuid.uuid4().hex[:8]}_")
    real = f"{topics.prefix}real"
    query = start_coordinator(spark, RunConfig(
        kafka=kafka, topics=topics, checkpoint_dir=checkpoint_dir, max_message_bytes=LIMIT,
        policy=Policy(transaction_timeout=60_000), query_name=f"size-{topics.prefix}"))
    try:
        produce(kafka, [
            # Not an event, and too big for its dead letter to carry it whole.
            Record(topics.half, b"junk", b"j" * 6_000, (("X", b"1"),)),
            # A half message the broker took, whose release and discard would not fit.
            half_record(topics, "too-big", "G", real, body=b"b" * (LIMIT - 100)),
            # And the business as usual afterwards.
            half_record(topics, "fine", "G", real, body=b"ok"),
            end_record(topics, "fine", "G", Decision.COMMIT_MESSAGE),
        ])
        released = wait_until(lambda: read_topic(kafka, real), timeout_s=120)
        dead = wait_until(lambda: (d := _dead_letters(kafka, topics)) and len(d) >= 2 and d,
                          timeout_s=60)
        assert query.isActive and query.exception() is None
    finally:
        query.stop()
    assert [r.value for r in released] == [b"ok"]
    junk, big = dead["junk"], dead["too-big"]
    assert junk[H.DLQ_CODE] == "UNKNOWN_EVENT" and junk["_value"] == "0"
    assert int(junk[H.DLQ_ORIGINAL_BYTES]) >= 6_000 and junk[H.DLQ_ORIGIN_TOPIC] == topics.half
    assert big[H.DLQ_CODE] == "OUTPUTS_TOO_LARGE" and f"limit of {LIMIT} bytes" in \
        big[H.DLQ_REASON]
    assert big[H.DLQ_ORIGIN_OFFSET] != "-1"  # where to read the refused half message back


@pytest.mark.kafka
def test_a_record_the_producer_refuses_is_dead_lettered_and_the_rest_is_written(
    kafka: KafkaSettings, unique: str
) -> None:
    real, dead_letters = f"{unique}_real", f"{unique}_dlq"
    options = SinkOptions(kafka=kafka, dead_letter_topic=dead_letters, max_message_bytes=2_000)
    rows = [output_row("visible", real, b"k1", b"small", None, "r1", 1),
            output_row("visible", real, b"k2", b"x" * 5_000, None, "r2", 1),
            output_row("check", real, b"k3", b"small too", None, "r3", 1)]
    commit = send_rows(options, rows)
    assert commit.counts == {"visible": 1, "check": 1, "dead_letter": 1}
    assert sorted(r.key for r in read_topic(kafka, real)) == [b"k1", b"k3"]
    [reference] = read_topic(kafka, dead_letters)
    h = header_dict(reference.headers)
    assert reference.key == b"k2" and not reference.value
    assert h[H.DLQ_CODE] == "REFUSED_BY_BROKER" and h[H.DLQ_ORIGIN_TOPIC] == real
    assert "MessageSizeTooLargeError" in h[H.DLQ_REASON]
    assert h[H.RECORD_ID] == "r2" and int(h[H.DLQ_ORIGINAL_BYTES]) > 5_000


@pytest.mark.kafka
def test_a_record_for_a_topic_the_broker_will_not_create_is_dead_lettered(
    kafka: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from txstream.kafka import provision
    from txstream.sinks import delivery

    # tansu creates topics on first use and cannot be told not to: answer for a broker that
    # does not, at the one place the sink asks (and forget what this process learnt before).
    monkeypatch.setattr(provision, "broker_auto_create", lambda admin: False)
    monkeypatch.setattr(delivery, "_AUTO_CREATE", {})
    present, missing, dead_letters = f"{unique}_here", f"{unique}_nowhere", f"{unique}_dlq"
    produce(kafka, [Record(present, b"seed", b"x"), Record(dead_letters, b"seed", b"x")])
    options = SinkOptions(kafka=kafka, dead_letter_topic=dead_letters)
    commit = send_rows(options, [output_row("visible", present, b"k1", b"v", None, "r1", 1),
                                 output_row("visible", missing, b"k2", b"v", None, "r2", 1)])
    assert commit.counts == {"visible": 1, "dead_letter": 1}
    [reference] = [r for r in read_topic(kafka, dead_letters) if r.key == b"k2"]
    h = header_dict(reference.headers)
    assert h[H.DLQ_CODE] == "MISSING_TOPIC" and h[H.DLQ_ORIGIN_TOPIC] == missing
    assert "txstream topics create" in h[H.DLQ_REASON]
