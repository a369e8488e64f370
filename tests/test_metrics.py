"""The Prometheus endpoint of a real coordinator: scraped over HTTP, counted against what the
test sent (real tansu broker, local Spark)."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from state.policy import Policy
from streaming.engine.config import RunConfig
from streaming.engine.coordinator import Coordinator
from streaming.engine.metrics import serve_metrics
from streaming.engine.progress import CoordinatorStats
from txstream.broker import free_port
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.topics import Topics
from txstream.wire import Record

from kafka_helpers import end_record, half_record, produce, wait_for, wait_until

COMMIT, ROLLBACK = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.mark.spark
def test_metrics_count_what_the_coordinator_did(
    spark: object, kafka: KafkaSettings, topics: Topics, checkpoint_dir: Path, unique: str
) -> None:
    # No back-check within the test: every count below comes from the events sent.
    policy = Policy(transaction_timeout=120_000, check_interval=120_000)
    config = RunConfig(kafka=kafka, topics=topics, policy=policy, checkpoint_dir=checkpoint_dir,
                       buckets=8, query_name=f"metrics-{unique}")
    coordinator = Coordinator(config).start()
    server = serve_metrics(0, coordinator.listener.stats, host="127.0.0.1")
    try:
        real, group = f"{unique}-real", f"{unique}-g"
        ids = [f"{unique}-{i}" for i in range(6)]
        records = [half_record(topics, t, group, real, body=t.encode()) for t in ids]
        records += [end_record(topics, t, group, COMMIT) for t in ids[:3]]
        records += [end_record(topics, t, group, ROLLBACK) for t in ids[3:5]]
        records += [
            end_record(topics, ids[0], group, COMMIT),  # a duplicate commit
            end_record(topics, ids[5], "intruder", ROLLBACK),  # wrong group: rejected
            Record(topics.end, None, b"no key", ()),  # malformed: dead letter
        ]
        produce(kafka, records)
        wait_for(kafka, real, 3, timeout_s=120)

        def settled() -> dict[str, float] | None:
            m = scrape(server.url)
            return m if m["txstream_dead_letters_total"] >= 2 and m[
                "txstream_released_total"] >= 3 and m["txstream_duplicates_total"] >= 1 else None

        m = wait_until(settled, timeout_s=60)
        assert m["txstream_halves_total"] == 6
        assert m["txstream_released_total"] == 3
        assert m["txstream_rolled_back_total"] == 2
        assert m["txstream_duplicates_total"] == 1
        assert m["txstream_rejected_total"] == 1
        assert m["txstream_dead_letters_total"] == 2
        assert m["txstream_checks_sent_total"] == 0
        assert m["txstream_discarded_total"] == 0
        assert m["txstream_pending"] == 1
        assert m["txstream_batches_total"] >= 1
        assert m["txstream_input_rows_total"] >= len(records)
        assert m["txstream_last_batch_seconds"] > 0
        assert 0 < m["txstream_commit_to_visible_avg_seconds"] <= m[
            "txstream_commit_to_visible_max_seconds"] < 120
        assert m["txstream_check_lateness_max_seconds"] == 0
    finally:
        server.close()
        coordinator.stop()


def test_serve_metrics_binds_the_given_port_and_closes_it() -> None:
    port = free_port()
    stats = CoordinatorStats()
    with stats.lock:
        stats.totals["released"] = 7
    server = serve_metrics(port, stats)
    try:
        assert server.port == port
        assert scrape(f"http://127.0.0.1:{port}/metrics")["txstream_released_total"] == 7
    finally:
        server.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    # the same port can be served again at once (a restarted coordinator)
    again = serve_metrics(port, stats, host="127.0.0.1")
    again.close()
