"""RocketMQ's transaction example end to end: the example producer and consumer, the real
coordinator (local Spark), the real tansu broker.

The seed's expectation: the consumer receives exactly 1, 4 and 7 (checked COMMIT); 2, 5, 8
are rolled back; 0, 3, 6, 9 stay UNKNOW through check_max answered checks and are discarded.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.support.seed_helpers import SeedRun
from txstream.kafka import KafkaSettings
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.topics import Topics

pytestmark = pytest.mark.spark

POLICY = Policy(transaction_timeout=1000, check_interval=1000, check_max=3)


def test_seed_example_delivers_1_4_7_and_discards_0_3_6_9(
    spark: object, kafka: KafkaSettings, checkpoint_dir: Path
) -> None:
    suffix = uuid.uuid4().hex[:8]
    topics = Topics.with_prefix(f"e{suffix}_")
    query = start_coordinator(spark, RunConfig(
        kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint_dir,
        buckets=8, query_name=f"example-{suffix}",
    ))
    seed = SeedRun(kafka, topics)
    try:
        seed.run(POLICY.check_interval / 1000)
    finally:
        query.stop()
    assert sorted(seed.received) == [f"Hello RocketMQ {i}" for i in (1, 4, 7)]
    assert seed.discarded() == [f"Hello RocketMQ {i}" for i in (0, 3, 6, 9)]
    assert all("check_max=3" in reason for reason in seed.discard_reasons())
    assert "Consumer===  MessageBody: Hello RocketMQ 4" in seed.lines
    assert len(seed.sent) == 10
    assert [r.local_transaction_state.value for r in seed.sent] == ["UNKNOW"] * 10
