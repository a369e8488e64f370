"""``txstream bench`` at a tiny size: it runs every phase and prints every field.

Not its speed: the figures of a run this small (and on a shared test machine) mean nothing;
PERFORMANCE.md holds the real ones. One subprocess, as a user runs it, with everything in one
JVM (``--in-process``) to stay within a test's time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.spark

FIELDS = ("raw_pipe_tx_per_s", "tx_per_s", "ratio", "ceiling_tx_per_s", "ceiling_ratio",
          "commit_to_visible_ms", "check_lateness_ms", "batch_ms_vs_pending")
POINT_FIELDS = ("pending", "state_store", "busy_batch_ms_p50", "rss_mb", "state_memory_mb",
                "cpu_ms_per_busy_batch", "load_seconds", "steal_pct", "live_heap_mb")


def _bench(*args: str, timeout_s: float = 280) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("TXSTREAM_BOOTSTRAP_SERVERS", None)
    return subprocess.run([sys.executable, "-m", "txstream.streaming.cli", "bench", *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.timeout(900)  # every phase, on a machine the other test workers load
def test_bench_runs_every_phase_and_prints_every_field() -> None:
    proc = _bench("--transactions", "300", "--rate", "40", "--latency-seconds", "4",
                  "--unknown-every", "4", "--transaction-timeout", "2s",
                  "--pending", "300", "--stores", "default,rocksdb", "--pending-rate", "20",
                  "--pending-seconds", "3", "--in-process", "--json", timeout_s=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in FIELDS:
        assert result[name] is not None, name
    assert result["raw_pipe_tx_per_s"] > 0 and result["tx_per_s"] > 0 and result["ratio"] > 0
    # The ceiling's stand-in released the whole backlog through the coordinator's query.
    assert result["ceiling"]["throughput"]["measured_transactions"] > 0
    assert result["ceiling_ratio"] > 0
    for name in ("commit_to_visible_ms", "check_lateness_ms", "ceiling_commit_to_visible_ms"):
        figures = result[name]
        assert figures["count"] > 0 and figures["p50"] is not None and figures["p99"] is not None
    points = result["batch_ms_vs_pending"]
    assert {p["state_store"] for p in points} == {"default", "rocksdb"}
    for point in points:
        assert point["error"] is None, point["error"]
        for name in POINT_FIELDS:
            assert point[name] is not None, name
        assert point["rss_mb"] > 0
        # Idle with every timer hours away, the coordinator runs no batch at all.
        assert point["idle_batches"] == 0 and point["idle_batch_ms_p50"] is None
    assert set(result["targets"]) >= {"coordinator_to_ceiling (tx/s) >= 0.8",
                                      "check_lateness p99 <= 1 s",
                                      "heap per pending transaction (rocksdb) <= 200 B"}
    # The coordinator against its ceiling, warm, in an A-B-B-A order, by rate and by CPU.
    fair = result["fair"]
    assert fair["order"] == ["coordinator", "ceiling", "ceiling", "coordinator"]
    assert all(len(fair["tx_per_s"][q]) == 2 and min(fair["tx_per_s"][q]) > 0
               for q in ("coordinator", "ceiling"))
    assert result["coordinator_to_ceiling"] > 0 and result["coordinator_to_ceiling_cpu"] > 0
    # Each phase says how much CPU the hypervisor took from this machine while it ran.
    assert set(result["steal_pct"]) == {"pipe", "coordinator", "ceiling", "floor", "pending"}
    assert all(0 <= v <= 100 for v in result["steal_pct"].values())
    # And how much CPU each throughput span used per transaction, which steal does not bend.
    cpu = result["cpu"]
    assert set(cpu) == {"pipe", "coordinator", "ceiling", "coordinator_at_rate",
                        "ceiling_at_rate", "coordinator_idle"}
    for span, use in cpu.items():
        assert use is not None and use["cores"] > 0, span
        assert (use["us_per_tx"] is None) == (span == "coordinator_idle"), span
        assert use["us_per_tx"] is None or use["us_per_tx"] > 0, span
    assert result["cpu_ratio"] > 0
    assert result["latency"]["load_generator_cores"] > 0  # the offered load's own share
    # Where a batch's time goes: Spark's floor, the ceiling and the coordinator at one rate.
    cost = result["fixed_cost"]
    assert cost["offered_tx_per_s"] == 40 and cost["idle_cores"] > 0
    for query in ("floor", "floor_python_io", "ceiling", "coordinator"):
        figures = cost[query]
        assert figures["batch_ms_p50"] > 0 and figures["cpu_ms_per_batch"] > 0, query
        assert figures["batch_parts_ms_p50"]["addBatch"] > 0, query
    assert cost["floor"]["rows_per_batch"] == cost["floor_python_io"]["rows_per_batch"] >= 1
    assert cost["coordinator"]["commit_to_visible_ms"]["count"] > 0
    # Progress goes to stderr, so stdout is the JSON object alone.
    assert "raw pipe" in proc.stderr


def test_bench_prints_a_table_of_the_phases_it_ran() -> None:
    proc = _bench("--phases", "pipe", "--transactions", "200")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for name in ("raw_pipe_tx_per_s", "tx_per_s", "ratio", "ceiling_tx_per_s", "cpu_us_per_tx",
                 "commit_to_visible_ms", "check_lateness_ms", "batch_ms_vs_pending", "targets"):
        assert name in out
    assert "not measured" in out  # the coordinator phases were skipped, and it says so


@pytest.mark.timeout(900)  # two coordinator starts, minutes each on a loaded machine
def test_the_recovery_phase_times_a_cold_start_and_a_restart() -> None:
    proc = _bench("--phases", "recovery", "--recovery-restarts", "1", "--json",
                  timeout_s=840)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    rec = result["recovery"]
    assert rec["cold_start_s"] > 0 and len(rec["restart_to_visible_s"]) == 1
    assert rec["restart_to_visible_median_s"] == rec["restart_to_visible_s"][0] > 0
    assert rec["spin_before_s"] > 0 and rec["spin_after_s"] > 0
    assert {"recovery: restart -> visible, median, at a 1.3-s spin <= 10 s",
            "recovery: cold start -> first release, at a 1.3-s spin <= 20 s"} <= set(
        result["targets"])
    assert "recovery: restart 1 to 5 commits visible" in proc.stderr


def test_the_connector_phase_runs_the_floor_through_sparks_kafka_connector(
        apache_kafka_settings: Any) -> None:
    # On Apache Kafka: tansu answers ListOffsets wrongly, which Spark's Kafka source plans by
    # (a batch of 40 records took 5.7 s there).
    proc = _bench("--phases", "floor,connector", "--latency-seconds", "4", "--json",
                  "--bootstrap-servers", apache_kafka_settings.bootstrap_servers, timeout_s=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cost = json.loads(proc.stdout.strip().splitlines()[-1])["fixed_cost"]
    for query in ("floor", "floor_python_io", "floor_python_source", "floor_python_sink",
                  "floor_kafka"):
        figures = cost[query]
        assert figures["batch_ms_p50"] > 0 and figures["first_batch_ms"] > 0, query
        assert figures["batch_parts_ms_p50"]["addBatch"] > 0, query
    assert cost["floor_kafka"]["rows_per_batch"] == cost["floor"]["rows_per_batch"]
