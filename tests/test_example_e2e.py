"""RocketMQ's transaction example end to end: the example producer and consumer, the real
coordinator (local Spark), the real tansu broker.

The seed's expectation: the consumer receives exactly 1, 4 and 7 (checked COMMIT); 2, 5, 8
are rolled back; 0, 3, 6, 9 stay UNKNOW through check_max answered checks and are discarded.
"""

from __future__ import annotations

import importlib.util
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType

import pytest

from state.policy import Policy
from streaming.engine.config import RunConfig
from streaming.engine.query import start_coordinator
from txstream.kafka import KafkaSettings
from txstream.topics import Topics
from txstream.wire import H, header_dict

from kafka_helpers import read_topic, wait_until

pytestmark = pytest.mark.spark

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
POLICY = Policy(transaction_timeout=1000, check_interval=1000, check_max=3)


def _load(name: str) -> ModuleType:
    """The example scripts are not a package: load them by path, as a user runs them."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_seed_example_delivers_1_4_7_and_discards_0_3_6_9(
    spark: object, kafka: KafkaSettings, checkpoint_dir: Path
) -> None:
    producer_example = _load("transaction_producer")
    consumer_example = _load("transaction_consumer")
    suffix = uuid.uuid4().hex[:8]
    prefix = f"e{suffix}_"
    topics = Topics.with_prefix(prefix)
    real_topic = f"TranTest_{suffix}"
    query = start_coordinator(spark, RunConfig(
        kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint_dir,
        buckets=8, query_name=f"example-{suffix}",
    ))

    stop = threading.Event()
    received: list[str] = []
    sent: list[object] = []
    consumer_started = threading.Event()
    lines: list[str] = []
    consumer = threading.Thread(target=consumer_example.run, kwargs=dict(
        bootstrap_servers=kafka.bootstrap_servers, topic=real_topic, topic_prefix=prefix,
        group=f"consumer_test_clustering_{suffix}", stop=stop, out=lines.append,
        on_message=lambda m: received.append(m.body.decode()), started=consumer_started,
    ))
    producer = threading.Thread(target=lambda: sent.extend(producer_example.run(
        kafka.bootstrap_servers, topic=real_topic, topic_prefix=prefix,
        group=f"please_rename_unique_group_name_{suffix}", stop=stop, out=lines.append,
    )))
    consumer.start()
    assert consumer_started.wait(30)
    producer.start()
    try:
        def discarded() -> list[str]:
            return sorted(r.value.decode() for r in read_topic(kafka, topics.discard))

        wait_until(lambda: len(discarded()) >= 4 and len(received) >= 3, timeout_s=150)
        time.sleep(3 * POLICY.check_interval / 1000)  # anything more would show up by now
        assert sorted(received) == [f"Hello RocketMQ {i}" for i in (1, 4, 7)]
        assert discarded() == [f"Hello RocketMQ {i}" for i in (0, 3, 6, 9)]
        for record in read_topic(kafka, topics.discard):
            reason = header_dict(record.headers)[H.DISCARD_REASON]
            assert "check_max=3" in reason, reason
        assert "Consumer===  MessageBody: Hello RocketMQ 4" in lines
    finally:
        stop.set()
        producer.join(30)
        consumer.join(30)
        query.stop()
    assert len(sent) == 10
    assert [r.local_transaction_state.value for r in sent] == ["UNKNOW"] * 10
