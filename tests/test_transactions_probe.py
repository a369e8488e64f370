"""The transactions probe (issue 40 §3): Apache Kafka isolates transactions, tansu hands a
read_committed reader the aborted record, the in-memory broker isolates them as Apache Kafka
(also when made like tansu: it follows Kafka there)."""

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


def test_the_memory_broker_isolates_transactions() -> None:
    for make in (MemoryBroker, MemoryBroker.like_tansu):
        with make(f"probe-{random.getrandbits(32)}", Clock()) as broker:
            answer = probe_transactions(broker.settings, "probe")
            assert answer.isolates, answer.reason
            # The probe's two transactions: an aborted record, a committed one, two markers.
            assert broker.end_offset("probe", 0) == 4
            assert broker.transactions_of("probe", 0).aborted == {0}
