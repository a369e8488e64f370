"""Apache Kafka started by txstream (txstream/kafka_broker.py), checked against the real broker
with the project's client, kafka-python: what tansu gets wrong (read_committed), what a
replicated cluster refuses (min.insync.replicas), and ``txstream broker --kafka``."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError, NotEnoughReplicasError

from tests.support.kafka_helpers import read_topic, wait_until
from tests.support.ports import reserve_port
from txstream.errors import BrokerUnavailable, SendFailed
from txstream.kafka import KafkaSettings
from txstream.kafka.partition_health import min_insync_replicas, partition_troubles
from txstream.kafka.provision import admin_client
from txstream.kafka_broker import KafkaBroker, _cluster_id, cluster_properties
from txstream.readback.bodies import BodySource, gone_bodies
from txstream.streaming.cli import main

# One worker runs them all under --dist loadgroup: one session broker, not one per worker.
pytestmark = pytest.mark.xdist_group("apache_kafka")

# Failure noticed in 3 s, not Kafka's 9 (broker.session.timeout.ms): a killed node leaves the
# ISR that soon, and the test waits that long.
FAST_FAILOVER = {"broker.session.timeout.ms": 3000, "broker.heartbeat.interval.ms": 500}


def _topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


def _read(bootstrap: str, topic: str, isolation: str) -> list[bytes]:
    """Every value of partition 0 a consumer of ``isolation`` is given, up to its end."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                             enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        # read_committed: the end is the last stable offset, after the last marker.
        end = consumer.end_offsets([tp])[tp]
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
        return values
    finally:
        consumer.close()


def _create(servers: str, topic: str) -> None:
    """``topic`` with one partition (the session's broker makes four on first use)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        admin.create_topics({topic: {"num_partitions": 1}}, wait_for_metadata=True)
    finally:
        admin.close()


def test_a_record_goes_round_trip_through_an_auto_created_topic(
        apache_kafka: KafkaBroker, apache_kafka_settings: KafkaSettings, unique: str) -> None:
    assert unique not in _topics(apache_kafka.bootstrap_servers)
    producer = KafkaProducer(bootstrap_servers=apache_kafka.bootstrap_servers, acks="all")
    try:
        for i in range(3):
            producer.send(unique, key=b"k", value=f"v{i}".encode(),
                          headers=[("h", b"1")]).get(timeout=30)
    finally:
        producer.close()
    records = read_topic(apache_kafka_settings, unique)
    assert [r.value for r in records] == [b"v0", b"v1", b"v2"]
    assert records[0].key == b"k" and list(records[0].headers) == [("h", b"1")]


def test_read_committed_sees_a_committed_transaction_and_never_an_aborted_one(
        apache_kafka: KafkaBroker, unique: str) -> None:
    """KIP-98 as Kafka does it: tansu hands aborted records to read_committed consumers."""
    servers = apache_kafka.bootstrap_servers
    _create(servers, unique)
    producer = KafkaProducer(bootstrap_servers=servers, transactional_id=f"{unique}-tx")
    try:
        producer.init_transactions()
        for value, commit in ((b"committed 1", True), (b"aborted", False),
                              (b"committed 2", True)):
            producer.begin_transaction()
            producer.send(unique, value=value).get(timeout=30)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()
    assert _read(servers, unique, "read_committed") == [b"committed 1", b"committed 2"]
    assert _read(servers, unique, "read_uncommitted") == [b"committed 1", b"aborted",
                                                          b"committed 2"]


def test_without_auto_creation_a_produce_to_a_missing_topic_is_refused(
        own_kafka_cluster: Callable[..., KafkaBroker], unique: str) -> None:
    with own_kafka_cluster(auto_create_topics=False) as kafka:
        producer = KafkaProducer(bootstrap_servers=kafka.bootstrap_servers, max_block_ms=3000)
        try:
            with pytest.raises(KafkaTimeoutError):  # no metadata for it: never created
                producer.send(unique, value=b"lost").get(timeout=10)
            assert unique not in _topics(kafka.bootstrap_servers)
            # Paused, it answers nothing; resumed, it answers as before.
            pid = kafka.pid
            assert pid is not None
            kafka.pause()
            assert _process_state(pid) == "T"
            assert not _answers(kafka.bootstrap_servers)
            kafka.resume()
            assert _process_state(pid) != "T"
            assert _answers(kafka.bootstrap_servers)
            admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
            try:
                admin.create_topics({unique: {"num_partitions": 1}})
            finally:
                admin.close()
            producer.send(unique, value=b"kept").get(timeout=30)
        finally:
            producer.close()


def test_a_body_past_a_stalled_high_watermark_is_waited_for_never_taken_for_gone(
        own_kafka_cluster: Callable[..., KafkaBroker], unique: str) -> None:
    """A half partition on nodes 1 and 2, min.insync.replicas 2. Node 1, its leader, is killed
    just after acknowledging a half message: node 2 leads with itself alone in sync and keeps
    the high watermark it had learnt, short of that record (Kafka 4, KIP-966). The read-back
    fails the batch, naming why, instead of discarding a committed message as lost; with node 1
    back, every body is read."""
    with own_kafka_cluster(nodes=3, configs=FAST_FAILOVER) as kafka:
        servers, half = kafka.bootstrap_servers, f"{unique}-half"
        admin = KafkaAdminClient(bootstrap_servers=servers)
        try:
            admin.create_topics({half: {"assignments": {0: [1, 2]}}}, wait_for_metadata=True)
        finally:
            admin.close()
        wait_until(lambda: kafka.leader(half) == 1
                   and sorted(kafka.describe_partition(half)["isr_nodes"]) == [1, 2])
        settings = KafkaSettings(bootstrap_servers=servers)
        producer = KafkaProducer(bootstrap_servers=servers, acks="all")
        wanted: dict[str, tuple[int, int]] = {}
        for i in range(6):
            txid = f"tx-{i}"
            meta = producer.send(half, key=txid.encode(), value=b"body", partition=0).get(30)
            wanted[txid] = (0, meta.offset)
            if i == 4:  # the coordinator read the first five: all there
                assert gone_bodies(BodySource(settings, half), wanted) == {}
        kafka.kill_node(1)
        producer.close(timeout=1)
        wait_until(lambda: kafka.leader(half) == 2, timeout_s=30)
        with pytest.raises(SendFailed, match=r"ends short of offset 5, a half message read "
                                             r"before: .*below min.insync.replicas 2"):
            gone_bodies(BodySource(settings, half), wanted)
        kafka.restart_node(1)
        wait_until(lambda: sorted(kafka.describe_partition(half)["isr_nodes"]) == [1, 2],
                   timeout_s=60)
        assert gone_bodies(BodySource(settings, half), wanted) == {}


def test_three_nodes_refuse_acks_all_below_min_insync_replicas_until_the_node_is_back(
        own_kafka_cluster: Callable[..., KafkaBroker], unique: str) -> None:
    """3 KRaft nodes (a quorum of 3: one node may go), min.insync.replicas 2. A partition on 2
    nodes whose follower is killed refuses acks=all writes; one on all 3 goes on writing."""
    with own_kafka_cluster(nodes=3, configs=FAST_FAILOVER) as kafka:
        servers = kafka.bootstrap_servers
        pair, trio, on1 = f"{unique}-rf2", f"{unique}-rf3", f"{unique}-on1"
        admin = KafkaAdminClient(bootstrap_servers=servers)
        try:
            admin.create_topics({pair: {"assignments": {0: [0, 1]}}, trio: {},
                                 on1: {"assignments": {0: [1, 2, 0]}}},
                                wait_for_metadata=True)
        finally:
            admin.close()
        assert sorted(wait_until(lambda: kafka.describe_partition(trio)["isr_nodes"])) == [0, 1, 2]
        assert wait_until(lambda: kafka.leader(pair) == 0)
        settings = KafkaSettings(bootstrap_servers=servers)
        with KafkaProducer(bootstrap_servers=servers) as writer:
            for i in range(3):
                writer.send(on1, value=b"body %d" % i).get(timeout=30)
        bodies = BodySource(settings, on1)
        assert len(bodies.read({0: {0, 1, 2}})) == 3  # read from node 1, on1's leader
        kafka.kill_node(1)  # the pair's follower
        # Read again while on1's leadership moves to node 2: txstream's consumers ask a live
        # node when the one a metadata request went to is down (kafka-python alone raises
        # KafkaConnectionError, and the batch failed). on1 keeps two replicas in sync: below
        # min.insync.replicas a Kafka 4 leader's high watermark stays where it was (the next
        # test).
        wait_until(lambda: len(bodies.read({0: {0, 1, 2}})) == 3, timeout_s=30)
        wait_until(lambda: kafka.describe_partition(pair)["isr_nodes"] == [0], timeout_s=30)
        # What /healthz reads (txstream.kafka.partition_health): the pair refuses writes.
        with admin_client(KafkaSettings(bootstrap_servers=servers)) as admin:
            limits = min_insync_replicas(admin, [pair, trio])
            assert limits == {pair: 2, trio: 2}
            assert [str(t) for t in partition_troubles(admin, [pair, trio], limits)] == [
                f"{pair}-0 has 1 in-sync replica(s) of 2, below min.insync.replicas 2: "
                f"writes to it are refused"]
        strict = KafkaProducer(bootstrap_servers=servers, acks="all", retries=0,
                               enable_idempotence=False)
        patient = KafkaProducer(bootstrap_servers=servers, acks="all")
        try:
            with pytest.raises(NotEnoughReplicasError):
                strict.send(pair, value=b"refused").get(timeout=30)
            patient.send(trio, value=b"two of three in sync").get(timeout=60)
            kafka.restart_node(1)
            wait_until(lambda: sorted(kafka.describe_partition(pair)["isr_nodes"]) == [0, 1],
                       timeout_s=60)
            strict.send(pair, value=b"accepted").get(timeout=30)
            with admin_client(KafkaSettings(bootstrap_servers=servers)) as admin:
                assert partition_troubles(admin, [pair, trio], limits) == []
        finally:
            strict.close()
            patient.close()
        assert _read(servers, pair, "read_committed") == [b"accepted"]


def test_a_node_that_exits_at_start_fails_at_once_with_its_log(
        own_kafka_cluster: Callable[..., KafkaBroker]) -> None:
    with socket.socket() as taken:  # another server holds the port the broker asks for
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        kafka = own_kafka_cluster(port=taken.getsockname()[1])
        started = time.monotonic()
        with pytest.raises(BrokerUnavailable, match="exited with code") as raised:
            kafka.start()
    assert "Address already in use" in str(raised.value)  # the node's log tail
    assert time.monotonic() - started < 60
    assert not kafka.running and kafka.directory is None


def test_a_missing_install_says_to_run_the_setup(tmp_path: Path) -> None:
    # Never starts a JVM: the fast tier's wall lets the install check through.
    for broker in (KafkaBroker(libs=tmp_path / "nothing"),
                   KafkaBroker(java=str(tmp_path / "no-java"))):
        with pytest.raises(BrokerUnavailable, match=r"scripts/setup\.sh"):
            broker.start()
        assert not broker.running


@pytest.mark.parametrize(("nodes", "replicas", "min_isr"), [(1, "1", "1"), (3, "3", "2")])
def test_every_internal_topic_is_replicated_as_the_cluster_allows(
        nodes: int, replicas: str, min_isr: str) -> None:
    shared = cluster_properties(nodes, auto_create_topics=True)
    assert {shared[k] for k in shared if k.endswith("replication.factor")} == {replicas}
    assert {shared[k] for k in shared if k.endswith("min.isr") or k == "min.insync.replicas"
            } == {min_isr}
    assert shared["auto.create.topics.enable"] == "true"
    assert cluster_properties(nodes, auto_create_topics=False)["auto.create.topics.enable"] == (
        "false")


def test_a_cluster_id_never_reads_as_an_option(monkeypatch: pytest.MonkeyPatch) -> None:
    # Base64 of a first byte 0xf8 starts with "-": the storage tool took it for a flag.
    ids = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(16))])
    monkeypatch.setattr(uuid, "uuid4", lambda: next(ids))
    assert _cluster_id() == "AAAAAAAAAAAAAAAAAAAAAA"


@pytest.mark.parametrize("args", [["--nodes", "3"], ["--kafka", "--log", "x.log"]])
def test_the_broker_command_refuses_flags_of_the_other_broker(
        args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["broker", *args]) == 2
    assert capsys.readouterr().err.startswith("txstream: --")


def test_the_broker_command_serves_kafka_until_interrupted(
        broker_processes: Callable[[list[str]], subprocess.Popen[str]]) -> None:
    port = reserve_port()
    proc = broker_processes(["--kafka", "--port", str(port)])
    lines = _lines_until(proc, "logs: ", timeout_s=90)
    assert f"Apache Kafka (1 KRaft node) listening on 127.0.0.1:{port}" in lines[0]
    assert f"export TXSTREAM_BOOTSTRAP_SERVERS=127.0.0.1:{port}" in lines[1]
    folder = Path(lines[2].split("logs: ", 1)[1]).parent.parent
    assert folder.is_dir()
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}")
    try:
        producer.send("probe", value=b"hello").get(timeout=30)
    finally:
        producer.close()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
    # Its JVM stopped with it, and took its data along.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass
    assert not folder.exists()


def _lines_until(proc: subprocess.Popen[str], marker: str, timeout_s: float) -> list[str]:
    """The process's lines up to the first holding ``marker``; fails past ``timeout_s``."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout or ()],
                     daemon=True).start()  # ends with the process's output
    seen: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=0.5))
        except queue.Empty:
            continue
        if marker in seen[-1]:
            return seen
    raise AssertionError(f"no {marker!r} line within {timeout_s}s: {seen}")


def _answers(servers: str) -> bool:
    """Whether the cluster answers a metadata request within 2 s."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=2000,
                                 bootstrap_timeout_ms=2000)
    except KafkaError:
        return False
    try:
        admin.describe_cluster()
        return True
    except KafkaError:
        return False
    finally:
        admin.close()


def _process_state(pid: int) -> Any:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_fast_test_cannot_start_kafka(tmp_path: Path) -> None:
    """The wall around the fast tier (tests/conftest.py) refuses an installed Kafka too."""
    with pytest.raises(RuntimeError, match="apache_kafka"):
        KafkaBroker().start()
    with pytest.raises(RuntimeError, match="without the"):
        subprocess.Popen(["java", "-cp", str(tmp_path), "kafka.Kafka", "server.properties"])


def test_an_end_probe_asked_again_at_the_end_gets_every_answer(
        apache_kafka_settings: KafkaSettings, unique: str) -> None:
    # Apache Kafka's incremental fetch sessions (KIP-227) answer only for partitions that
    # changed: a kept probe asked at the ends it was told before got no high watermark every
    # second time, and the coordinator's source stopped on "no high watermark".
    from txstream.kafka import EndProbe, make_producer

    producer = make_producer(apache_kafka_settings)
    for topic in (f"{unique}-a", f"{unique}-b"):
        _create(apache_kafka_settings.bootstrap_servers, topic)
        producer.send(topic, b"x").get(timeout=30)
    producer.close()
    with EndProbe(apache_kafka_settings, kept_as=None) as probe:
        ends: dict[tuple[str, int], int] = {}
        for _ in range(4):
            ends = probe.topic_ends([f"{unique}-a", f"{unique}-b"], ends, timeout_s=5)
            assert ends == {(f"{unique}-a", 0): 1, (f"{unique}-b", 0): 1}
