"""``txstream pending``, ``resolve`` and ``history`` through the CLI, against a real
coordinator (local Spark, real tansu broker)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import (
    discard_by_answers,
    end_record,
    half_record,
    history_of,
    now_ms,
    produce,
    read_topic,
    wait_for,
    wait_until,
)
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.state.policy import Policy
from txstream.streaming.cli import main
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.streaming.engine.spark_settings import ROCKSDB_SETTINGS
from txstream.topics import Topics

pytestmark = pytest.mark.spark

# Checks start after 1 s; nobody answers them (no producer of the groups stays online), so a
# transaction stays pending with checks sent and none answered. Reserved time 60 s: a half
# message born two minutes ago is discarded at once.
POLICY = Policy(transaction_timeout=1000, check_interval=2000, check_max=2,
                reserved_time=60_000, orphan_end_timeout=5000)


@dataclass
class Running:
    kafka: KafkaSettings
    topics: Topics
    checkpoint: Path
    query: Any

    @property
    def args(self) -> list[str]:
        prefix = self.topics.half.removesuffix("RMQ_SYS_TRANS_HALF_TOPIC")
        return ["--bootstrap-servers", self.kafka.bootstrap_servers, "--topic-prefix", prefix]


def _start(spark: Any, kafka: KafkaSettings, checkpoint: Path) -> Running:
    topics = Topics.with_prefix(f"a{uuid.uuid4().hex[:8]}_")
    query = start_coordinator(spark, RunConfig(
        kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint, buckets=8,
        query_name=f"admin-{uuid.uuid4().hex[:6]}"))
    txid, real = f"warmup-{uuid.uuid4().hex[:6]}", f"{topics.half}_warmup"
    produce(kafka, [half_record(topics, txid, "warmup", real),
                    end_record(topics, txid, "warmup", Decision.COMMIT_MESSAGE)])
    wait_for(kafka, real, 1, timeout_s=120)
    return Running(kafka, topics, checkpoint, query)


@pytest.fixture(scope="module")
def coord(spark: Any, kafka: KafkaSettings, tmp_path_factory: pytest.TempPathFactory):
    running = _start(spark, kafka, tmp_path_factory.mktemp("admin-cp"))
    yield running
    running.query.stop()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _produce_unknown(coord: Running, capsys: pytest.CaptureFixture[str], group: str,
                     topic: str, body: str) -> str:
    rc, out, _ = _cli(capsys, "produce", *coord.args, "--topic", topic, "--group", group,
                      "--unknown", body)
    assert rc == 0
    return out.split()[0]


def _pending(coord: Running, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    rc, out, err = _cli(capsys, "pending", "--checkpoint-dir", str(coord.checkpoint), "--json")
    assert rc == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    return {r["transaction_id"]: r for r in rows}


def test_pending_lists_waiting_transactions_while_the_coordinator_runs(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    before = now_ms()
    txid = _produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "waiting")
    row = wait_until(lambda: (r := _pending(coord, capsys).get(txid)) and r["checks_sent"] >= 1
                     and r, timeout_s=60)
    assert row["status"] == "PENDING"
    assert row["producer_group"] == f"{unique}-g" and row["topic"] == f"{unique}-real"
    assert row["checks_answered"] == 0  # nobody of the group answers
    assert before <= row["born_ms"] <= now_ms()
    assert row["age_ms"] >= 1000  # the first check came after the 1 s transaction timeout
    assert row["next_check_ms"] > row["born_ms"] + POLICY.transaction_timeout
    rc, out, _ = _cli(capsys, "pending", "--checkpoint-dir", str(coord.checkpoint))
    assert rc == 0
    header, table = out.splitlines()[0], out.splitlines()[1:]
    assert "pending transaction(s)" in header and "batch " in header
    assert table[0].split()[:4] == ["TRANSACTION", "STATUS", "GROUP", "TOPIC"]
    line = next(t for t in table if t.startswith(txid))
    assert line.split()[1:4] == ["PENDING", f"{unique}-g", f"{unique}-real"]


def test_resolve_rollback_is_recorded_as_the_operators_decision(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    real = f"{unique}-real"
    txid = _produce_unknown(coord, capsys, f"{unique}-g", real, "to roll back")
    wait_until(lambda: txid in _pending(coord, capsys), timeout_s=60)
    rc, out, err = _cli(capsys, "resolve", txid, "--rollback", *coord.args, "--operator",
                        "alice", "--reason", "customer cancelled", "--wait", "60")
    assert rc == 0, err
    assert f"ROLLBACK_MESSAGE for {txid} by alice written to {coord.topics.end}" in out
    assert "coordinator: rolled_back" in out and "admin decision by alice" in out

    notes = history_of(coord.kafka, coord.topics, txid)
    last = notes[-1]
    assert (last["event"], last["operator"], last["remark"]) == (
        "rolled_back", "alice", "customer cancelled")
    rc, out, _ = _cli(capsys, "history", txid, *coord.args)
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == f"transaction {txid}"
    assert "half message registered: group " + f"{unique}-g, real topic {real}" in lines[1]
    assert "rolled back, never visible" in lines[-1] and "admin decision by alice" in lines[-1]
    assert "remark: customer cancelled" in lines[-1]
    wait_until(lambda: txid not in _pending(coord, capsys), timeout_s=30)
    assert read_topic(coord.kafka, real) == []

    # A contradicting decision afterwards is refused, as the console refuses it: nothing
    # written. With --force it is written, and the coordinator refuses it and says so.
    ends = len(read_topic(coord.kafka, coord.topics.end))
    rc, out, err = _cli(capsys, "resolve", txid, "--commit", *coord.args, "--operator", "bob")
    assert rc == 1 and "refused" in err and "already rolled_back" in err, err
    assert len(read_topic(coord.kafka, coord.topics.end)) == ends
    rc, out, err = _cli(capsys, "resolve", txid, "--commit", *coord.args, "--operator", "bob",
                        "--wait", "60", "--force")
    assert rc == 1
    assert "already rolled_back" in err
    assert "coordinator: rejected" in out
    rc, out, _ = _cli(capsys, "history", txid, *coord.args)
    assert "dead letter" in out and "COMMIT_MESSAGE refused" in out


def test_resolve_refuses_an_id_with_no_history_unless_forced(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    txid = f"{unique}-never-sent"
    ends = len(read_topic(coord.kafka, coord.topics.end))
    rc, out, err = _cli(capsys, "resolve", txid, "--commit", *coord.args, "--operator", "dave")
    assert rc == 1 and out == "", out
    assert f"txstream: refused: no history for {txid}" in err and "--force" in err, err
    assert len(read_topic(coord.kafka, coord.topics.end)) == ends  # nothing written
    rc, out, err = _cli(capsys, "resolve", txid, "--commit", *coord.args, "--operator", "dave",
                        "--force")
    assert rc == 0, err
    assert f"COMMIT_MESSAGE for {txid} by dave written to {coord.topics.end}" in out
    assert "warning: no history" in err
    assert len(read_topic(coord.kafka, coord.topics.end)) == ends + 1


def test_resolve_commit_releases_the_message_and_names_the_user(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    real = f"{unique}-real"
    txid = _produce_unknown(coord, capsys, f"{unique}-g", real, "to commit")
    wait_until(lambda: txid in _pending(coord, capsys), timeout_s=60)
    monkeypatch.setenv("USER", "carol")
    rc, out, err = _cli(capsys, "resolve", txid, "--commit", *coord.args, "--wait", "60")
    assert rc == 0, err
    assert "coordinator: released" in out and "admin decision by carol" in out
    [record] = wait_for(coord.kafka, real, 1, timeout_s=30)
    assert record.value == b"to commit"
    rc, out, _ = _cli(capsys, "history", txid, *coord.args, "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["event"] == "half"
    assert events[-1]["event"] == "released" and events[-1]["operator"] == "carol"


def test_history_shows_discards_and_dead_letters(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    txid, group = f"{unique}-old", f"{unique}-g"
    discard_by_answers(coord.kafka, coord.topics, txid, group, f"{unique}-real")
    wait_until(lambda: any(n["event"] == "discarded"
                           for n in history_of(coord.kafka, coord.topics, txid)), timeout_s=60)
    produce(coord.kafka, [end_record(coord.topics, txid, "intruder", Decision.COMMIT_MESSAGE)])
    wait_until(lambda: any(n["event"] == "rejected"
                           for n in history_of(coord.kafka, coord.topics, txid)), timeout_s=60)
    rc, out, _ = _cli(capsys, "history", txid, *coord.args)
    assert rc == 0
    assert "discarded: still unknown after 2 answered checks" in out
    assert f"discard record {coord.topics.discard}[" in out
    assert "dead letter " + coord.topics.dead_letter in out
    assert "does not own transaction" in out

    rc, _, err = _cli(capsys, "history", f"{unique}-never", *coord.args)
    assert rc == 1 and "no history" in err


def test_pending_from_another_process_while_the_coordinator_runs(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    txid = _produce_unknown(coord, capsys, f"{unique}-g", f"{unique}-real", "seen from afar")
    wait_until(lambda: txid in _pending(coord, capsys), timeout_s=60)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "txstream.streaming.cli", "pending", "--checkpoint-dir",
         str(coord.checkpoint)], capture_output=True, text=True, timeout=180,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert any(line.startswith(txid) and " PENDING " in line
               for line in proc.stdout.splitlines()), proc.stdout
    print(f"txstream pending in a new process: {took:.1f}s")
    assert coord.query.isActive  # reading the state did not disturb the coordinator


def test_pending_after_the_coordinator_stopped(
    spark: Any, kafka: KafkaSettings, checkpoint_dir: Path, capsys: pytest.CaptureFixture[str],
    unique: str
) -> None:
    running = _start(spark, kafka, checkpoint_dir)
    try:
        txid = f"{unique}-left"
        produce(kafka, [half_record(running.topics, txid, f"{unique}-g", f"{unique}-real")])
        # Written and committed: a batch cut short by the stop is replayed on restart, and
        # its state is not the last committed one until then.
        wait_until(lambda: txid in _pending(running, capsys), timeout_s=60)
    finally:
        running.query.stop()
    rows = _pending(running, capsys)
    assert list(rows) == [txid]
    assert rows[txid]["producer_group"] == f"{unique}-g"

    rc, _, err = _cli(capsys, "pending", "--checkpoint-dir", str(checkpoint_dir / "nope"))
    assert rc == 2 and "not a coordinator checkpoint" in err
    rc, _, err = _cli(capsys, "pending", "--checkpoint-dir", str(checkpoint_dir),
                      "--driver-memory", "lots")
    assert rc == 2 and "--driver-memory" in err and "2g or 1536m" in err


def test_demo_roles_against_a_running_coordinator(
    coord: Running, capsys: pytest.CaptureFixture[str], unique: str
) -> None:
    """The docker compose services, minus Docker: `demo --role consumer` and `--role producer`
    against a coordinator running elsewhere (this module's)."""
    topic = f"{unique}-TranTest"
    roles = [*coord.args, "--topic", topic, "--group", f"{unique}-p"]
    consumer = subprocess.Popen(
        [sys.executable, "-m", "txstream.streaming.cli", "demo", "--role", "consumer", *roles,
         "--consumer-group", f"{unique}-c"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rc, out, _ = _cli(capsys, "demo", "--role", "producer", *roles, "--timeout", "120")
        assert rc == 0, out
        assert re.search(r"released\s+3\s+Hello RocketMQ 1, 4, 7$", out, re.M)
        assert re.search(r"rolled back\s+3\s+Hello RocketMQ 2, 5, 8$", out, re.M)
        assert re.search(r"discarded\s+4\s+Hello RocketMQ 0, 3, 6, 9$", out, re.M)
        time.sleep(3)  # the consumer prints what the coordinator released last
        consumer.send_signal(signal.SIGTERM)  # what `docker compose stop` sends
        printed, _ = consumer.communicate(timeout=60)
    finally:
        if consumer.poll() is None:
            consumer.kill()
    assert consumer.returncode == 0, printed
    bodies = re.findall(r"MessageBody: (.*)$", printed, re.M)
    assert sorted(bodies) == ["Hello RocketMQ 1", "Hello RocketMQ 4", "Hello RocketMQ 7"]


def test_the_rocksdb_store_keeps_pending_transactions_across_a_restart(
    spark: Any, kafka: KafkaSettings, checkpoint_dir: Path, capsys: pytest.CaptureFixture[str],
    unique: str
) -> None:
    """`--state-store rocksdb` (with its changelog checkpoints): the pending tool reads the
    state, and a coordinator restarted on the checkpoint still holds the half message."""
    for key, value in ROCKSDB_SETTINGS.items():
        spark.conf.set(key, value)
    topics = Topics.with_prefix(f"r{uuid.uuid4().hex[:8]}_")
    config = RunConfig(kafka=kafka, topics=topics, checkpoint_dir=checkpoint_dir,
                       policy=Policy(transaction_timeout=120_000),
                       query_name=f"rocks-{uuid.uuid4().hex[:6]}")
    txid, real = f"{unique}-held", f"{unique}-real"
    try:
        query = start_coordinator(spark, config)
        running = Running(kafka, topics, checkpoint_dir, query)
        try:
            produce(kafka, [half_record(topics, txid, f"{unique}-g", real)])
            wait_until(lambda: txid in _pending(running, capsys), timeout_s=90)
        finally:
            query.stop()
        query = start_coordinator(spark, config)
        try:
            produce(kafka, [end_record(topics, txid, f"{unique}-g", Decision.COMMIT_MESSAGE)])
            assert len(wait_for(kafka, real, 1, timeout_s=90)) == 1
            wait_until(lambda: txid not in _pending(running, capsys), timeout_s=60)
        finally:
            query.stop()
    finally:
        for key in ROCKSDB_SETTINGS:
            spark.conf.unset(key)
    # RocksDB's changelog checkpoints, not the default store's delta files.
    assert list(checkpoint_dir.rglob("*.changelog"))
    assert not list(checkpoint_dir.rglob("*.delta"))
