"""An Apache Kafka cluster (KRaft, 1 or 3 nodes) started by this process, beside tansu.

tansu (:mod:`txstream.broker`) needs no JVM, but it is not Kafka: for one, its transactions are
not Kafka's (a read_committed consumer was handed an aborted record, and committed records went
missing; docs/operations.md). This one runs Kafka's own broker from the jars
``scripts/setup.sh`` copied (``deploy/kafka/pom.xml``), with the same interface as
:class:`txstream.broker.EmbeddedBroker`, plus a node's faults for replication tests.
"""

from __future__ import annotations

import base64
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from txstream.broker import free_port
from txstream.errors import BrokerUnavailable
from txstream.kafka_node import JVM_OPTIONS, KafkaNode, check_installed, kafka_libs

__all__ = ["KafkaBroker", "cluster_properties"]


def cluster_properties(nodes: int, auto_create_topics: bool) -> dict[str, str]:
    """Settings every node shares: with 3 nodes, each partition on all 3, 2 in sync to write."""
    replicas, min_isr = str(nodes), str(min(nodes, 2))
    return {
        "auto.create.topics.enable": str(auto_create_topics).lower(),
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # A consumer group's first member would otherwise wait 3 s for others to join.
        "group.initial.rebalance.delay.ms": "0",
        "num.partitions": "1",
        # The log cleaner's map is allocated whole at start (128 MiB by default, two thirds of
        # an idle node's memory); the compacted topics of a test broker are small.
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    }


class KafkaBroker:
    """Apache Kafka on loopback: ``nodes`` KRaft nodes (broker and controller in each JVM),
    their data in a temporary directory removed on stop.

    >>> with KafkaBroker() as broker:
    ...     broker.bootstrap_servers  # '127.0.0.1:PORT'

    ``configs`` are broker settings that override the defaults (``cluster_properties``);
    node ``i`` (0-based) has ``node.id`` ``i``, so a leader's id is its node's index.
    """

    def __init__(
        self,
        nodes: int = 1,
        port: int | None = None,
        auto_create_topics: bool = True,
        configs: Mapping[str, Any] | None = None,
        libs: Path | str | None = None,
        java: str = "java",
        jvm_options: tuple[str, ...] = JVM_OPTIONS,
        reserve: Callable[[], int] = free_port,
        archive_to: Path | None = None,
    ) -> None:
        """``reserve`` picks each free loopback port (the tests give their own ranges);
        ``archive_to``: the first node writes the classes it loaded there as it stops
        (``scripts/kafka_class_archive.py``, run by the set-up)."""
        if nodes not in (1, 3):
            raise ValueError(f"nodes must be 1 or 3, not {nodes}")
        self.nodes = nodes
        self.reserve = reserve
        self.port = port or reserve()
        self.auto_create_topics = auto_create_topics
        self.configs = {k: _text(v) for k, v in (configs or {}).items()}
        self.libs = Path(libs) if libs is not None else kafka_libs()
        self.java = java
        self.jvm_options = jvm_options
        self.archive_to = archive_to
        self.directory: Path | None = None
        self._nodes: list[KafkaNode] = []
        self._down: set[int] = set()  # nodes killed on purpose (kill_node)

    @property
    def bootstrap_servers(self) -> str:
        ports = [n.port for n in self._nodes] or [self.port]
        return ",".join(f"127.0.0.1:{p}" for p in ports)

    def start(self, timeout_s: float = 90.0) -> KafkaBroker:
        """Formats each node's storage, starts the nodes and waits until every broker answers
        and is registered. Raises BrokerUnavailable (the node's log tail included) otherwise."""
        java = self.check_installed()
        deadline = time.monotonic() + timeout_s
        self.directory = Path(tempfile.mkdtemp(prefix="txstream-kafka-"))
        try:
            self._nodes = self._make_nodes(java)
            self._format(deadline)
            for node in self._nodes:
                node.start(self.archive_to if node.node_id == 0 else None)
            self._wait_ready(deadline, self.nodes)
        except BaseException:
            self.stop()
            raise
        return self

    def check_installed(self) -> str:
        """The java executable's path; BrokerUnavailable, saying to run the set-up, when it or
        Kafka's jars are missing."""
        return check_installed(self.libs, self.java)

    def _make_nodes(self, java: str) -> list[KafkaNode]:
        assert self.directory is not None
        ports = [self.port] + [self.reserve() for _ in range(self.nodes - 1)]
        controllers = [self.reserve() for _ in range(self.nodes)]
        voters = ",".join(f"{i}@127.0.0.1:{p}" for i, p in enumerate(controllers))
        shared = {**cluster_properties(self.nodes, self.auto_create_topics), **self.configs}
        made = []
        for i, (port, controller) in enumerate(zip(ports, controllers)):
            node = KafkaNode(i, port, controller, self.directory / f"node-{i}", java, self.libs,
                             self.jvm_options)
            node.write_config({
                "process.roles": "broker,controller",
                "node.id": str(i),
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": str(node.directory / "data"),
                **shared,
            })
            made.append(node)
        return made

    def _format(self, deadline: float) -> None:
        cluster_id = _cluster_id()
        formats = [(node, node.format_storage(cluster_id)) for node in self._nodes]
        for node, proc in formats:
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except BaseException:
                for _, other in formats:
                    other.kill()
                    other.wait()
                raise
            if code != 0:
                raise BrokerUnavailable(f"formatting Kafka node {node.node_id}'s storage failed "
                                        f"(exit {code}):\n{node.log_tail()}")

    def _wait_ready(self, deadline: float, brokers: int) -> None:
        """Until the cluster answers a metadata request with ``brokers`` unfenced brokers."""
        # The Kafka client: only when a broker is started
        from txstream.kafka import KafkaSettings, make_admin
        from txstream.kafka.errors import KafkaError

        seen: object = "no answer"
        while time.monotonic() < deadline:
            for node in self._nodes:
                code = node.exit_code()
                if code is not None and node.node_id not in self._down:
                    raise BrokerUnavailable(f"Kafka node {node.node_id} exited with code {code} "
                                            f"on port {node.port}:\n{node.log_tail()}")
            if not self._listening():
                time.sleep(0.1)
                continue
            try:
                admin = make_admin(KafkaSettings(bootstrap_servers=self._live_servers()),
                                   request_timeout_ms=3000, bootstrap_timeout_ms=3000)
                try:
                    answer = admin.describe_cluster()
                finally:
                    admin.close()
                registered = [b for b in answer["brokers"] if not b.get("is_fenced")]
                if len(registered) >= brokers:
                    return
                seen = f"{len(registered)} of {brokers} brokers registered"
            # Not yet a broker: ask again (BrokerUnavailable: make_admin could not connect).
            except (KafkaError, OSError, BrokerUnavailable) as exc:
                seen = exc
            time.sleep(0.2)
        tails = "\n".join(n.log_tail(10) for n in self._nodes)
        raise BrokerUnavailable(f"Kafka on {self.bootstrap_servers} was not ready in time "
                                f"({seen}):\n{tails}")

    def _listening(self) -> bool:
        """Whether a live node's port takes connections: kafka-python would log each refusal."""
        for node in self._nodes:
            if node.node_id in self._down:
                continue
            try:
                with socket.create_connection(("127.0.0.1", node.port), timeout=0.5):
                    return True
            except OSError:
                pass
        return False

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stops every node (SIGTERM, then SIGKILL past ``timeout_s``: the data is thrown away)
        and removes the data."""
        nodes, self._nodes = self._nodes, []
        for node in nodes:
            node.terminate()  # all at once: they stop side by side
        for node in nodes:
            # A controlled shutdown only hands leadership over; with the data deleted, waiting
            # for the last nodes to find no quorum only slows every stop.
            node.stop(timeout_s=timeout_s)
        self._down.clear()
        directory, self.directory = self.directory, None
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    @property
    def running(self) -> bool:
        """Whether every node that was not killed on purpose runs."""
        live = [n for n in self._nodes if n.node_id not in self._down]
        return bool(live) and all(n.running for n in live)

    @property
    def pid(self) -> int | None:
        """The first node's process id while it runs (``pids`` has every node's)."""
        return self._nodes[0].pid if self._nodes else None

    @property
    def pids(self) -> list[int | None]:
        return [n.pid for n in self._nodes]

    def pause(self) -> None:
        for i in range(len(self._nodes)):
            self.pause_node(i)

    def resume(self) -> None:
        for i in range(len(self._nodes)):
            self.resume_node(i)

    def pause_node(self, i: int) -> None:
        """SIGSTOP: the node holds its connections and answers nothing, as a hung JVM."""
        self._node(i).pause()

    def resume_node(self, i: int) -> None:
        self._node(i).resume()

    def kill_node(self, i: int) -> None:
        """SIGKILL, as a crash: its data stays for :meth:`restart_node`."""
        self._down.add(i)
        self._node(i).kill()

    def restart_node(self, i: int, timeout_s: float = 60.0) -> None:
        """Starts a node again on its data, and waits until the cluster has it back."""
        node = self._node(i)
        node.kill()
        node.start()
        self._down.discard(i)
        self._wait_ready(time.monotonic() + timeout_s, self.nodes - len(self._down))

    def node_address(self, i: int) -> str:
        """Node ``i``'s own bootstrap address (to ask it alone, while others are paused)."""
        return f"127.0.0.1:{self._node(i).port}"

    def leader(self, topic: str, partition: int = 0) -> int:
        """The index of the node that leads ``topic``'s partition (-1 when none does)."""
        return int(self.describe_partition(topic, partition)["leader_id"])

    def describe_partition(self, topic: str, partition: int = 0,
                           timeout_s: float = 15.0) -> dict[str, Any]:
        """The partition as the cluster's metadata says: ``leader_id``, ``replica_nodes``,
        ``isr_nodes``, ... Asks the live nodes, again while the one it picked does not answer
        (a node just killed is in the metadata until the controller fences it) or does not
        know the partition yet (a new topic reaches each node's metadata a moment later)."""
        from txstream.kafka import KafkaSettings, make_admin
        from txstream.kafka.errors import KafkaConnectionError

        deadline = time.monotonic() + timeout_s
        while True:
            described: Any = None
            try:
                admin = make_admin(KafkaSettings(bootstrap_servers=self._live_servers()))
                try:
                    (described,) = admin.describe_topics([topic])
                finally:
                    admin.close()
                for found in described["partitions"]:
                    if found["partition_index"] == partition:
                        return dict(found)
            except (KafkaConnectionError, BrokerUnavailable):  # the node picked is down
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise KeyError(f"{topic} has no partition {partition}: {described}")
            time.sleep(0.2)

    def _live_servers(self) -> str:
        live = [n for n in self._nodes if n.node_id not in self._down] or self._nodes
        return ",".join(f"127.0.0.1:{n.port}" for n in live)

    def _node(self, i: int) -> KafkaNode:
        if not 0 <= i < len(self._nodes):
            raise IndexError(f"no node {i}: the cluster has {len(self._nodes)} running")
        return self._nodes[i]

    def __enter__(self) -> KafkaBroker:
        return self.start() if not self.running else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _cluster_id() -> str:
    """16 random bytes in URL-safe base64, as ``kafka-storage random-uuid``; like Kafka's, never
    one that starts with "-": the storage tool would read it as an option."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
