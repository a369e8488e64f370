"""The Prometheus endpoint and /healthz of a real coordinator: scraped over HTTP, counted against
what the test sent (real tansu broker, local Spark)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pyspark.sql import Row

from tests.support.kafka_helpers import end_record, half_record, produce, wait_for, wait_until
from tests.support.ports import reserve_port
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator
from txstream.streaming.engine.metric_totals import MetricsBoard
from txstream.streaming.engine.metrics import serve_coordinator, serve_metrics
from txstream.streaming.engine.query import OBSERVATION
from txstream.topics import Topics
from txstream.wire import Record

COMMIT, ROLLBACK = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE
Sample = tuple[str, tuple[tuple[str, str], ...]]


def scrape(url: str) -> dict[Sample, float]:
    """Every sample, by name and sorted labels."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(m: dict[Sample, float], name: str, **labels: str) -> float:
    return m[(name, tuple(sorted(labels.items())))]


def health(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _config(kafka: KafkaSettings, topics: Topics, checkpoint_dir: Path, name: str) -> RunConfig:
    # No back-check within the test: every count below comes from the events sent.
    policy = Policy(transaction_timeout=120_000, check_interval=120_000)
    return RunConfig(kafka=kafka, topics=topics, policy=policy, checkpoint_dir=checkpoint_dir,
                     buckets=8, query_name=name, metrics_port=reserve_port(),
                     metrics_host="127.0.0.1")


@pytest.mark.spark
def test_metrics_and_health_of_a_running_coordinator(
    spark: object, kafka: KafkaSettings, topics: Topics, checkpoint_dir: Path, unique: str
) -> None:
    config = _config(kafka, topics, checkpoint_dir, f"metrics-{unique}")
    coordinator = Coordinator(config).start()
    server = serve_coordinator(coordinator)
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

        def settled() -> dict[Sample, float] | None:
            m = scrape(server.url)
            lag = [v for (name, _), v in m.items() if name == "txstream_input_lag_records"]
            done = (m.get(("txstream_duplicates_total", ()), 0) >= 1 and lag
                    and sum(lag) == 0 and m.get(("txstream_rejected_total", ()), 0) >= 1)
            return m if done else None

        m = wait_until(settled, timeout_s=60)
        assert value(m, "txstream_half_messages_total", producer_group=group, topic=real) == 6
        assert value(m, "txstream_commits_total", producer_group=group, topic=real) == 3
        assert value(m, "txstream_rollbacks_total", producer_group=group, topic=real) == 2
        assert sum(v for (name, labels), v in m.items()
                   if name == "txstream_dead_letters_total") == 2
        assert value(m, "txstream_duplicates_total") == 1
        assert value(m, "txstream_rejected_total") == 1
        names = {name for name, _ in m}
        assert "txstream_checks_sent_total" not in names  # no check: a family without samples
        assert value(m, "txstream_pending_transactions", status="PENDING",
                     producer_group=group) == 1
        assert 0 < value(m, "txstream_oldest_pending_age_seconds") < 600
        # Histograms as Prometheus reads them: cumulative buckets up to +Inf == count.
        assert value(m, "txstream_commit_to_visible_seconds_count") == 3
        assert value(m, "txstream_commit_to_visible_seconds_bucket", le="+Inf") == 3
        assert 0 < value(m, "txstream_commit_to_visible_seconds_sum") < 360
        assert value(m, "txstream_batch_duration_seconds_count") >= 1
        assert value(m, "txstream_check_lateness_seconds_count") == 0
        lags = {dict(labels)["topic"] for name, labels in m if name ==
                "txstream_input_lag_records"}
        assert lags == {topics.half, topics.end}
        used, most = (value(m, "txstream_driver_heap_used_bytes"),
                      value(m, "txstream_driver_heap_max_bytes"))
        assert 0 < used <= most
        assert value(m, "process_cpu_seconds_total") > 0
        status, body = health(server.health_url)
        assert status == 200 and body["status"] == "ok" and body["input_lag"] == 0, body
        assert body["batches"] >= 1
        coordinator.query.stop()
        status, body = health(server.health_url)
        assert status == 503 and body["reasons"] == ["query stopped"], body
    finally:
        server.close()
        coordinator.stop()


@pytest.mark.spark
def test_pending_gauges_after_a_restart_come_from_the_state(
    spark: object, kafka: KafkaSettings, topics: Topics, checkpoint_dir: Path, unique: str
) -> None:
    """A restarted coordinator shows what its checkpoint holds open before any key ran."""
    config = _config(kafka, topics, checkpoint_dir, f"restart-{unique}")
    group, real = f"{unique}-g", f"{unique}-real"
    first = Coordinator(config).start()
    try:
        produce(kafka, [half_record(topics, f"{unique}-{i}", group, real) for i in range(4)])
        wait_until(lambda: first.listener.board.view().open_counts.get(("PENDING", group)) == 4,
                   timeout_s=120)
    finally:
        first.stop()
    lines: list[str] = []
    second = Coordinator(config, emit=lines.append).start()
    server = serve_coordinator(second)
    pending = ("txstream_pending_transactions", (("producer_group", group), ("status", "PENDING")))
    try:
        # Read beside the query's first batch: known within seconds, and before any batch ran.
        m = wait_until(lambda: (m := scrape(server.url)).get(pending) == 4 and m, timeout_s=60)
        assert value(m, "txstream_batch_duration_seconds_count") == 0  # none ran yet here
        # The progress line counts those registered before the restart too: one more comes.
        produce(kafka, [half_record(topics, f"{unique}-late", group, real)])
        line = wait_until(lambda: next((x for x in lines if x.startswith("batch ")), None),
                          timeout_s=120)
        assert line.endswith("| pending 5"), line
    finally:
        server.close()
        second.stop()


class _Progress(NamedTuple):
    batchId: int
    numInputRows: int
    observedMetrics: dict[str, Row]
    durationMs: dict[str, int]
    sources: tuple[Any, ...] = ()


def test_serve_metrics_binds_the_given_port_and_closes_it() -> None:
    port = reserve_port()
    board = MetricsBoard()
    summary = json.dumps({"k": 1, "c": [["rejected", 7]]})
    board.add_progress(_Progress(0, 7, {OBSERVATION: Row(key_summaries=[summary])}, {}))
    server = serve_metrics(port, board)
    try:
        assert server.port == port and server.host == "0.0.0.0"  # what is bound, said as is
        assert value(scrape(f"http://127.0.0.1:{port}/metrics"), "txstream_rejected_total") == 7
        with pytest.raises(urllib.error.HTTPError) as no_health:
            urllib.request.urlopen(server.health_url, timeout=10)
        assert no_health.value.code == 404
    finally:
        server.close()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    # the same port can be served again at once (a restarted coordinator)
    again = serve_metrics(port, board, host="127.0.0.1")
    assert again.host == "127.0.0.1"
    again.close()
