"""``txstream broker``, ``produce`` and ``consume`` against the real tansu broker."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from tests.support.kafka_helpers import headers_of, produce, read_topic, wait_until
from tests.support.ports import reserve_port
from tests.support.process_helpers import CoordinatorProcess, application_directory
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings
from txstream.message import Message
from txstream.outputs import encode_visible
from txstream.streaming.cli import main
from txstream.topics import Topics
from txstream.wire import H, decode_end, decode_half

pytestmark = pytest.mark.kafka

TXSTREAM = [sys.executable, "-m", "txstream.streaming.cli"]


def _kafka_args(kafka: KafkaSettings, topics: Topics) -> list[str]:
    return ["--bootstrap-servers", kafka.bootstrap_servers,
            "--topic-prefix", topics.half.removesuffix("RMQ_SYS_TRANS_HALF_TOPIC")]


@pytest.mark.parametrize(("flag", "decision"), [
    ([], "COMMIT_MESSAGE"), (["--rollback"], "ROLLBACK_MESSAGE"), (["--unknown"], "UNKNOW"),
])
def test_produce_writes_half_and_end(kafka: KafkaSettings, topics: Topics, unique: str,
                                     capsys: pytest.CaptureFixture[str], flag: list[str],
                                     decision: str) -> None:
    rc = main(["produce", *_kafka_args(kafka, topics), "--topic", f"{unique}-real",
               "--group", f"{unique}-g", "--tags", "TagA", "--keys", "K1",
               "--property", "color=blue", *flag, "first", "second"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert [line.split()[1] for line in out] == [decision, decision]
    txids = [line.split()[0] for line in out]
    records = read_topic(kafka, topics.half)
    # Each line says where the half message was stored.
    assert sorted(line.split()[3] for line in out) == sorted(
        f"{topics.half}[{r.partition}]@{r.offset}" for r in records)
    halves = [decode_half(r.key, r.value, r.headers) for r in records]
    by_id = {m.transaction_id: m for m in halves}
    assert set(by_id) == set(txids)
    first = by_id[txids[0]]
    assert (first.topic, first.body, first.tags, first.keys, first.producer_group) == (
        f"{unique}-real", b"first", "TagA", "K1", f"{unique}-g")
    assert first.properties == {"color": "blue"}
    ends = [decode_end(r.key, r.value, r.headers) for r in read_topic(kafka, topics.end)]
    assert sorted(e.transaction_id for e in ends) == sorted(txids)
    assert {e.decision.value for e in ends} == {decision}


def test_produce_refuses_a_system_topic(kafka: KafkaSettings, topics: Topics,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["produce", *_kafka_args(kafka, topics), "--topic", topics.half,
               "--group", "g", "body"])
    assert rc == 2
    assert "system topic" in capsys.readouterr().err
    assert read_topic(kafka, topics.half) == []


def test_consume_prints_released_messages_filtered_by_tag(
    kafka: KafkaSettings, topics: Topics, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    real = f"{unique}-real"
    msgs = [Message(real, f"body {i}".encode(), tags=tag, keys=f"K{i}", transaction_id=f"T{i}",
                    msg_id=f"T{i}", producer_group="g", born_timestamp=1)
            for i, tag in enumerate(["TagA", "TagC", "TagB", "TagA"])]
    produce(kafka, [encode_visible(m) for m in msgs])
    started = time.monotonic()
    rc = main(["consume", *_kafka_args(kafka, topics), "--topic", real,
               "--tags", "TagA || TagB", "--count", "3", "--timeout", "30"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    lines = captured.out.splitlines()
    # The topic has several partitions: order holds per key, not across them.
    assert sorted(line.rsplit("| ", 1)[1] for line in lines) == ["body 0", "body 2", "body 3"]
    [first] = [line for line in lines if line.endswith("| body 0")]
    assert "tags=TagA" in first and "keys=K0" in first and "msgId=T0" in first
    assert "received 3 message(s)" in captured.err
    assert time.monotonic() - started < 30  # stopped at --count, not at the timeout


def test_consume_from_last_shows_only_what_is_released_after_it_started(
    kafka: KafkaSettings, topics: Topics, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    real, group = f"{unique}-real", f"{unique}-shell"
    produce(kafka, [encode_visible(Message(real, b"released before", transaction_id="T0",
                                           msg_id="T0", producer_group="g"))])
    (before,) = read_topic(kafka, real)
    rc = main(["consume", *_kafka_args(kafka, topics), "--topic", real, "--group", group,
               # Long enough for the group join under a loaded CI (tansu: half the session
               # timeout), which must come before its start is committed.
               "--from", "last", "--count", "1", "--timeout", "15"])
    captured = capsys.readouterr()
    assert rc == 1 and captured.out == ""
    assert "received 0 message(s)" in captured.err
    # It had joined and started at the end, where it committed its start.
    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group,
                      enable_auto_commit=False)
    try:
        assert c.committed(TopicPartition(real, before.partition)) == before.offset + 1
    finally:
        c.close()


def test_consume_fails_when_fewer_than_count_arrive(
    kafka: KafkaSettings, unique: str, topics: Topics, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["consume", *_kafka_args(kafka, topics), "--topic", f"{unique}-empty",
               "--count", "1", "--timeout", "3"])
    assert rc == 1
    assert "received 0 message(s)" in capsys.readouterr().err


def test_broker_command_serves_until_interrupted() -> None:
    port = reserve_port()
    proc = subprocess.Popen([*TXSTREAM, "broker", "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline() if proc.stdout else ""
        assert f"listening on 127.0.0.1:{port}" in first
        settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}")
        produce(settings, [encode_visible(Message("probe", b"hello", transaction_id="T"))])
        records = read_topic(settings, "probe")
        assert [r.value for r in records] == [b"hello"]
        assert headers_of(records[0])[H.TRANSACTION_ID] == "T"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # tansu ran in its own session: it must have been stopped, not orphaned.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    assert not any(f"127.0.0.1:{port}" in _cmdline(pid) for pid in _pids())


@pytest.mark.spark
def test_run_command_releases_from_an_application_directory_and_stops_on_ctrl_c(
        broker: EmbeddedBroker, tmp_path: Path) -> None:
    """Started where an application keeps its own ``client``, ``state``, ``console``, ...
    modules (decision 0025), the coordinator still runs, and Ctrl-C stops it cleanly."""
    prefix = f"{tmp_path.name}_"
    args = ["--bootstrap-servers", broker.bootstrap_servers, "--checkpoint-dir",
            str(tmp_path / "cp"), "--topic-prefix", prefix]
    app = application_directory(tmp_path / "application")
    process = CoordinatorProcess(args, tmp_path / "run.log", cwd=app).start()
    assert process.proc is not None
    try:
        wait_until(lambda: "coordinator running" in process.output(), timeout_s=120)
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        real = f"{prefix}real"
        assert main(["produce", "--bootstrap-servers", broker.bootstrap_servers,
                     "--topic-prefix", prefix, "--topic", real, "--group", "app", "hi"]) == 0
        released = wait_until(lambda: read_topic(kafka, real), timeout_s=60)
        assert [r.value for r in released] == [b"hi"]
        # What a terminal's Ctrl-C does: SIGINT to the whole foreground process group.
        os.killpg(process.proc.pid, signal.SIGINT)
        assert process.proc.wait(timeout=60) == 0
    finally:
        process.terminate()
    output = process.output()
    assert "Traceback" not in output, output[-3000:]
    # Ctrl-C may come while a batch runs: that batch's line may follow the stop's first line
    # (it completed, or says it did not), and the last line says the stop is over.
    lines = output.strip().splitlines()
    assert any(line.endswith("stopping coordinator") for line in lines), output[-3000:]
    assert lines[-1].endswith("coordinator stopped"), output[-3000:]


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
