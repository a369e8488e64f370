"""Parking end to end: real tansu, real Spark; halves read back from the half topic.

With ``park_after`` of half a second nearly every pending transaction is parked at once, so
each of these goes through park -> read back -> restore: a commit releases the half message as
it was sent, and back-checks come at the transaction's own times.
"""

from __future__ import annotations

import uuid

import pytest

from state.policy import Policy
from streaming.config import RunConfig
from streaming.query import start_coordinator
from txstream.message import Decision
from txstream.topics import Topics

from kafka_helpers import end_record, half_record, headers_of, now_ms, produce, wait_for

pytestmark = pytest.mark.spark

POLICY = Policy(transaction_timeout=3000, check_interval=3000, check_max=5)


def test_parked_transactions_release_and_are_checked_on_time(spark, kafka, checkpoint_dir,
                                                             unique: str) -> None:
    topics = Topics.with_prefix(f"pk{uuid.uuid4().hex[:8]}_")
    cfg = RunConfig(kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint_dir,
                    buckets=4, park_after_ms=500, query_name=f"park-{unique}")
    query = start_coordinator(spark, cfg)
    group, real = f"{unique}-group", f"{unique}-real"
    # Running first (the first batch takes seconds): the check times below are measured.
    produce(kafka, [half_record(topics, "warmup", group, f"{real}-w"),
                    end_record(topics, "warmup", group, Decision.COMMIT_MESSAGE)])
    wait_for(kafka, f"{real}-w", 1, timeout_s=120)
    born = now_ms()
    produce(kafka, [
        half_record(topics, "long", group, real, b"parked body", born_ms=born, keys="K1",
                    tags="TagP", properties={"p": "v"}, check_immunity_time_s=3600),
        half_record(topics, "unknown", group, real, b"checked", born_ms=born),
    ])
    # Both are parked by the batch that registers them; the commit must read "long" back.
    wait_for(kafka, topics.history, 7, timeout_s=120)
    produce(kafka, [end_record(topics, "long", group, Decision.COMMIT_MESSAGE)])
    [visible] = wait_for(kafka, real, 1, timeout_s=60)
    h = headers_of(visible)
    assert visible.value == b"parked body" and visible.key == b"K1"
    assert h["TAGS"] == "TagP" and h["p"] == "v" and h["UNIQ_KEY"] == "long"

    checks = wait_for(kafka, topics.check(group), 2, timeout_s=60)
    assert [headers_of(c)["TRANSACTION_CHECK_TIMES"] for c in checks[:2]] == ["1", "2"]
    assert checks[0].value == b"checked"
    first, second = checks[0].timestamp, checks[1].timestamp
    # Not early, and not lost; how late (batch time) is the benchmark's to measure, on a loaded
    # test machine a batch can take seconds.
    assert born + POLICY.transaction_timeout <= first < born + POLICY.transaction_timeout + 20_000
    # A record's timestamp is when its batch ended, its due time counts from when the batch
    # began: two checks can be sent less than an interval apart, never much less.
    assert first + POLICY.check_interval - 10_000 <= second < first + POLICY.check_interval + 20_000
    query.stop()
