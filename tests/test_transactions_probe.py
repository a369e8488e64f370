"""The transactions probe (issue 40 §3): Apache Kafka isolates transactions, tansu hands a
read_committed reader the aborted record, the in-memory broker has none."""

from __future__ import annotations

import random

from txstream.kafka import KafkaSettings
from txstream.kafka.memory import MemoryBroker
from txstream.kafka.transactions import probe_transactions

from memory_helpers import Clock


def test_apache_kafka_isolates_transactions(apache_kafka_settings: KafkaSettings) -> None:
    answer = probe_transactions(apache_kafka_settings, f"probe_{random.getrandbits(32)}")
    assert answer.isolates, answer.reason


def test_tansu_does_not_isolate_transactions(tansu_settings: KafkaSettings) -> None:
    answer = probe_transactions(tansu_settings, f"probe_{random.getrandbits(32)}")
    assert not answer.isolates
    assert "aborted record" in answer.reason


def test_the_memory_broker_has_no_transactions() -> None:
    with MemoryBroker(f"probe-{random.getrandbits(32)}", Clock()) as broker:
        answer = probe_transactions(broker.settings, "probe")
    assert not answer.isolates and "no Kafka transactions" in answer.reason
