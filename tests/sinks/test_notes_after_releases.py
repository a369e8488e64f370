"""A history note is never stored before the release it states, on a broker whose partitions
acknowledge each on its own (Apache Kafka, 3 nodes): a real topic below min.insync.replicas
refuses the release while the history topic takes writes
(docs/decisions/0030-notes-after-releases.md)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kafka import KafkaAdminClient

from tests.support.kafka_helpers import output_row, read_topic, wait_until
from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings
from txstream.kafka_broker import KafkaBroker
from txstream.outputs import decode_history, encode_history
from txstream.schema import Kind
from txstream.sinks.kafka_sink import SinkOptions, send_rows
from txstream.topics import Topics
from txstream.wire import H, pack_headers

FAST_FAILOVER = {"broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 500}


def _rows(real: str, topics: Topics) -> list[object]:
    release = output_row(Kind.VISIBLE, real, b"order-1", b"the body",
                         pack_headers(((H.TRANSACTION_ID, b"tx-1"), (H.RECORD_ID, b"t.1.5.0"))),
                         "t.1.5.0", 5)
    [(history, _)] = encode_history([("tx-1", 5, "released", {})], b"1", topics)
    note = output_row(Kind.HISTORY, topics.history, history.key, history.value,
                      pack_headers(((H.RECORD_ID, b"t.1.5.1"),)), "t.1.5.1", 5)
    return [release, note]


def test_a_release_refused_by_its_partition_leaves_no_note(
        own_kafka_cluster: Callable[..., KafkaBroker], unique: str) -> None:
    topics, real = Topics.with_prefix(f"{unique}_"), f"{unique}-orders"
    with own_kafka_cluster(nodes=3, configs=FAST_FAILOVER) as kafka:
        settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers)
        admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
        try:  # the real topic on nodes 0 and 1; the history on all three
            admin.create_topics({real: {"assignments": {0: [0, 1]}}, topics.history: {}},
                                wait_for_metadata=True)
        finally:
            admin.close()
        assert wait_until(lambda: kafka.leader(real) == 0)
        kafka.kill_node(1)
        wait_until(lambda: kafka.describe_partition(real)["isr_nodes"] == [0], timeout_s=30)
        options = SinkOptions(kafka=settings, flush_timeout_s=8.0)
        with pytest.raises(SendFailed):
            send_rows(options, _rows(real, topics))  # type: ignore[arg-type]
        # The history took writes all along (2 of its 3 replicas in sync): no note of a
        # release that is not there.
        assert read_topic(settings, topics.history) == []
        kafka.restart_node(1)
        wait_until(lambda: sorted(kafka.describe_partition(real)["isr_nodes"]) == [0, 1],
                   timeout_s=60)
        send_rows(options, _rows(real, topics))  # type: ignore[arg-type]  # the batch again
        assert [r.value for r in read_topic(settings, real)] == [b"the body"]
        [note] = read_topic(settings, topics.history)
        assert [n["event"] for n in decode_history(note.value)] == ["released"]
