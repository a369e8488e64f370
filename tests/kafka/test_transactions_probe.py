"""Kafka transactions (txstream/kafka/transactions.py). The probe: Apache Kafka isolates
transactions, tansu hands a read_committed reader the aborted record, the in-memory broker
isolates them as Apache Kafka (also when made like tansu: it follows Kafka there). A commit the
broker leaves unanswered is given up within its time, in doubt."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import pytest
from kafka.admin import KafkaAdminClient

from tests.support.kafka_helpers import wait_until
from tests.support.memory_helpers import Clock
from txstream.kafka import KafkaSettings
from txstream.kafka.errors import KafkaTimeoutError
from txstream.kafka.memory import MemoryBroker
from txstream.kafka.reading import read_topic as read_committed
from txstream.kafka.transactions import (
    commit_within,
    learn_topics,
    make_transactional_producer,
    probe_transactions,
)


def test_apache_kafka_isolates_transactions(apache_kafka_settings: KafkaSettings) -> None:
    answer = probe_transactions(apache_kafka_settings, f"probe_{random.getrandbits(32)}")
    assert answer.isolates, answer.reason


def test_tansu_does_not_isolate_transactions(tansu_settings: KafkaSettings) -> None:
    answer = probe_transactions(tansu_settings, f"probe_{random.getrandbits(32)}")
    assert not answer.isolates
    assert "aborted record" in answer.reason


def test_the_memory_broker_isolates_transactions() -> None:
    for make in (MemoryBroker, MemoryBroker.like_tansu):
        with make(f"probe-{random.getrandbits(32)}", Clock()) as broker:
            answer = probe_transactions(broker.settings, "probe")
            assert answer.isolates, answer.reason
            # The probe's two transactions: an aborted record, a committed one, two markers.
            assert broker.end_offset("probe", 0) == 4
            assert broker.transactions_of("probe", 0).aborted == {0}


def test_a_commit_the_broker_leaves_unanswered_is_given_up_in_doubt_within_its_time(
        own_kafka_cluster: Callable[..., Any]) -> None:
    kafka = own_kafka_cluster(nodes=1).start()
    settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers)
    topic = f"commit_{random.getrandbits(32)}"
    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    try:
        admin.create_topics({topic: {"num_partitions": 1}}, wait_for_metadata=True)
    finally:
        admin.close()
    producer = make_transactional_producer(settings, f"txstream-test-{topic}", role="sink")
    try:
        producer.begin_transaction()
        producer.send(topic, value=b"once").get(timeout=30)
        kafka.pause_node(0)  # the commit is sent to a broker that answers nothing
        started = time.monotonic()
        try:
            with pytest.raises(KafkaTimeoutError, match="in doubt"):
                commit_within(producer, 3.0)
            waited = time.monotonic() - started
        finally:
            kafka.resume_node(0)
        assert waited < 10, f"the commit was waited for {waited:.1f} s, not 3"
        # In doubt, not failed: the commit sent before the pause completes once the broker
        # answers again (so a caller must not send the transaction again: the sink leaves it
        # to its replay check), and the record is there once.
        seen = wait_until(lambda: read_committed(settings, topic) or None, timeout_s=60)
        assert [r.value for r in seen] == [b"once"]
    finally:
        producer.close(timeout=5)


def test_a_new_producer_learns_all_its_topics_in_one_ask(
        apache_kafka_settings: KafkaSettings) -> None:
    """learn_topics: every topic known after one metadata round, where each first send would
    wait a round of its own; a topic already known costs nothing, a fake's producer is left
    alone."""
    tag = random.getrandbits(32)
    topics = [f"learn_{tag}_{n}" for n in range(3)]
    admin = KafkaAdminClient(bootstrap_servers=apache_kafka_settings.bootstrap_servers)
    try:
        admin.create_topics({t: {"num_partitions": 2} for t in topics}, wait_for_metadata=True)
    finally:
        admin.close()
    producer = make_transactional_producer(apache_kafka_settings, f"txstream-learn-{tag}")
    try:
        metadata = producer._metadata  # type: ignore[attr-defined]  # the pinned kafka-python's
        assert all(metadata.partitions_for_topic(t) is None for t in topics)
        learn_topics(producer, topics, wait_s=10)
        assert all(metadata.partitions_for_topic(t) == {0, 1} for t in topics)
        started = time.monotonic()
        learn_topics(producer, topics, wait_s=10)
        assert time.monotonic() - started < 0.05
        started = time.monotonic()
        learn_topics(producer, ["not a topic's name"], wait_s=10)  # its send says why
        assert time.monotonic() - started < 1
    finally:
        producer.close()
    with MemoryBroker(f"learn-{tag}", Clock()) as broker:
        fake = make_transactional_producer(broker.settings, "txstream-learn")
        learn_topics(fake, topics, wait_s=10)  # nothing to learn, nothing raised
