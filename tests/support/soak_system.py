"""The soak's system (tests/system/test_soak.py) and the faults injected into it.

Everything runs as it would in use: its own tansu broker, the coordinator as a process of its
own (``txstream run``), the producer processes of one producer group
(tests/support/soak_producer.py) and a ``client.PushConsumer`` in the test's process. Faults
come on a schedule drawn from the seed (kinds, order, parameters; only their moments follow the
system's pace):

* ``coordinator_kill``: SIGKILL of the coordinator's whole process tree, at any moment or
  while a batch is in flight, then a restart on the same checkpoint;
* ``producer_kill``: SIGKILL of a producer inside its local transaction, between the half
  message and the end event (with or without its decision recorded), then a restart;
* ``broker_pause``: SIGSTOP of the broker for 2-8 s, then SIGCONT. The query gives up on a
  partition after 30 s without progress (its source's ``read_timeout_ms``, the body read-back
  and the replay check) and on a flush after 120 s, and ``txstream run`` then restarts it
  (docs/decisions/0027-broker-outage.md): a pause stays well under either.

On three Apache Kafka nodes (``nodes=3``) the broker's faults are a replicated cluster's
instead of ``broker_pause`` (tests/support/soak_cluster.py).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.support.ports import reserve_port
from tests.support.process_helpers import (
    REPO,
    CoordinatorProcess,
    batch_ids,
    in_flight_batch,
    pause,
    script_process,
)
from tests.support.soak_cluster import (
    CLUSTER_CONFIGS,
    CLUSTER_KINDS,
    CLUSTER_WEIGHTS,
    ClusterFaults,
)
from tests.support.soak_ledger import HUNG, IDLE, STARTED, Ledger
from tests.support.soak_producer import STOP_SENDING
from txstream.broker import EmbeddedBroker
from txstream.client import ConsumeFromWhere, ConsumeStatus, PushConsumer
from txstream.kafka import KafkaSettings
from txstream.kafka.provision import (
    DEFAULT_PARTITIONS,
    admin_client,
    create_topics,
    deployment,
)
from txstream.kafka_broker import KafkaBroker
from txstream.topics import Topics

__all__ = ["SoakSystem", "Faults", "KINDS"]

KINDS = ("coordinator_kill", "producer_kill", "broker_pause")
WEIGHTS = (0.25, 0.40, 0.35)
# The partitions of each deployed topic (the real topics and the history among them).
PARTITIONS = DEFAULT_PARTITIONS
PRODUCER_SCRIPT = REPO / "tests" / "support" / "soak_producer.py"


def _last_commit(checkpoint: Path) -> int:
    return max(batch_ids(checkpoint, "commits"), default=-1)


class SoakSystem:
    """The processes of one soak run, their logs and ledgers under ``root``."""

    def __init__(self, root: Path, seed: int, producers: int = 2, rate: float = 6.0,
                 nodes: int = 1) -> None:
        self.root, self.seed, self.rate, self.nodes = root, seed, rate, nodes
        tag = f"soak{seed % 10**8}_{os.getpid()}"
        self.topics = Topics.with_prefix(f"{tag}_")
        self.group, self.consumer_group = f"{tag}-pg", f"{tag}-cg"
        self.real_topics = [f"{tag}-orders", f"{tag}-payments"]
        self.checkpoint = root / "checkpoint"
        self.ledger_dir = root / "ledgers"
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(self.ledger_dir)
        # The broker tier's broker (tests/conftest.py): Apache Kafka unless
        # TXSTREAM_TEST_BROKER=tansu.
        configs = {"num.partitions": "4", **(CLUSTER_CONFIGS if nodes > 1 else {})}
        self.broker: EmbeddedBroker | KafkaBroker = (
            EmbeddedBroker(log_path=str(root / "tansu.log"))
            if os.environ.get("TXSTREAM_TEST_BROKER", "kafka") == "tansu" and nodes == 1
            else KafkaBroker(nodes=nodes, configs=configs))
        self.health_port = reserve_port()
        self.kafka = KafkaSettings(bootstrap_servers=self.broker.bootstrap_servers)
        self.coordinator: CoordinatorProcess | None = None
        self.coordinator_runs = 0
        self._commits_before = -1
        self.producers: list[CoordinatorProcess | None] = [None] * producers
        self._producer_runs = [0] * producers
        self.delivered: Counter[str] = Counter()
        self._delivered_lock = threading.Lock()
        self.consumer: PushConsumer | None = None

    # --- start and stop -----------------------------------------------------------------------

    def start(self) -> SoakSystem:
        self.broker.start()
        # Every node's address, known once they run: a client must find the cluster while
        # any one node is down.
        self.kafka = KafkaSettings(bootstrap_servers=self.broker.bootstrap_servers)
        specs = deployment(self.topics, producer_groups=[self.group],
                           real_topics=self.real_topics,
                           consumer_groups=[self.consumer_group]).topics
        with admin_client(self.kafka) as admin:
            created = create_topics(admin, specs)
        assert all(v is None for v in created.values()), created
        self.start_coordinator()
        self._start_consumer()
        for slot in range(len(self.producers)):
            self.start_producer(slot)
        return self

    def close(self) -> None:
        """Stop everything this run started (the broker last), whatever state it is in."""
        for pid in getattr(self.broker, "pids", [self.broker.pid]):
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
        if self.consumer is not None:
            self.consumer.shutdown()
        for proc in self.producers:
            if proc is not None and proc.running:
                proc.terminate(timeout_s=20)
        if self.coordinator is not None and self.coordinator.running:
            self.coordinator.terminate(timeout_s=60)
        self.broker.stop()

    # --- the coordinator ----------------------------------------------------------------------

    def coordinator_args(self) -> list[str]:
        return ["--bootstrap-servers", self.kafka.bootstrap_servers,
                "--checkpoint-dir", str(self.checkpoint), "--topic-prefix", self.topics.prefix,
                "--transaction-timeout", "2s", "--check-interval", "2s", "--check-max", "5",
                "--broker-timeout", "60", "--metrics-port", str(self.health_port)]

    def start_coordinator(self) -> None:
        self._commits_before = _last_commit(self.checkpoint)
        log = self.root / f"coordinator-{self.coordinator_runs}.log"
        self.coordinator_runs += 1
        self.coordinator = CoordinatorProcess(self.coordinator_args(), log).start()

    def last_commit(self) -> int:
        return _last_commit(self.checkpoint)

    def coordinator_up(self) -> bool:
        """The running coordinator has committed a micro-batch of its own."""
        return (self.coordinator is not None and self.coordinator.running
                and _last_commit(self.checkpoint) > self._commits_before)

    def kill_coordinator(self, mid_batch: bool) -> dict[str, Any]:
        assert self.coordinator is not None
        batch = None
        if mid_batch:
            deadline = time.monotonic() + 20
            while batch is None and time.monotonic() < deadline:
                batch = in_flight_batch(self.checkpoint)
                if batch is None:
                    time.sleep(0.01)
        processes = self.coordinator.kill()
        in_flight = batch is not None and batch not in batch_ids(self.checkpoint, "commits")
        self.start_coordinator()
        return {"mid_batch": in_flight, "batch": batch, "processes": processes}

    # --- producers ----------------------------------------------------------------------------

    def start_producer(self, slot: int) -> None:
        run = self._producer_runs[slot]
        self._producer_runs[slot] += 1
        args = ["--bootstrap-servers", self.kafka.bootstrap_servers,
                "--topic-prefix", self.topics.prefix, "--group", self.group,
                "--topics", ",".join(self.real_topics), "--ledger", str(self.ledger_dir),
                "--name", f"p{slot}", "--seed", str(self.seed * 1000 + slot * 100 + run),
                "--rate", str(self.rate)]
        self.producers[slot] = script_process(
            PRODUCER_SCRIPT, args, self.root / f"producer-{slot}-{run}.log").start()

    def _entry_of(self, pid: int, ev: str) -> dict[str, Any] | None:
        self.ledger.refresh()
        return self.ledger.first.get((pid, ev))

    def producer_ready(self, slot: int) -> bool:
        proc = self.producers[slot]
        return (proc is not None and proc.running and proc.proc is not None
                and self._entry_of(proc.proc.pid, STARTED) is not None)

    def kill_producer_in_transaction(self, slot: int, mode: str) -> dict[str, Any]:
        """Make producer ``slot`` hang in its next local transaction (``before`` or ``after``
        recording its decision), SIGKILL it there, start it again."""
        proc = self.producers[slot]
        assert proc is not None and proc.proc is not None
        pid = proc.proc.pid
        proc.proc.send_signal(signal.SIGUSR1 if mode == "after" else signal.SIGUSR2)
        deadline, hung = time.monotonic() + 60, None
        while hung is None and time.monotonic() < deadline and proc.running:
            time.sleep(0.05)
            hung = self._entry_of(pid, HUNG)
        proc.kill()
        self.start_producer(slot)
        return {"slot": slot, "mode": mode, "txid": hung["txid"] if hung else None}

    def stop_sending(self, timeout_s: float = 120.0) -> None:
        """Producers stop sending (and keep answering checks); returns once each said so."""
        (self.ledger_dir / STOP_SENDING).touch()
        deadline = time.monotonic() + timeout_s
        for proc in self.producers:
            assert proc is not None and proc.proc is not None
            while self._entry_of(proc.proc.pid, IDLE) is None:
                assert proc.running, proc.output()[-2000:]
                assert time.monotonic() < deadline, "a producer did not stop sending"
                time.sleep(0.2)

    # --- the consumer -------------------------------------------------------------------------

    def _start_consumer(self) -> None:
        consumer = PushConsumer(self.consumer_group, kafka=self.kafka,
                                topic_prefix=self.topics.prefix,
                                consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        for topic in self.real_topics:
            consumer.subscribe(topic)
        consumer.register_message_listener(self._on_messages)
        self.consumer = consumer.start()

    def _on_messages(self, msgs: Sequence[Any]) -> ConsumeStatus:
        with self._delivered_lock:
            for m in msgs:
                self.delivered[m.msg_id] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    def delivered_now(self) -> Counter[str]:
        with self._delivered_lock:
            return Counter(self.delivered)


class Faults:
    """Faults on the seed's schedule until ``seconds`` have passed; restarts what died on its
    own meanwhile (noted as ``unplanned``)."""

    def __init__(self, system: SoakSystem, seed: int, seconds: float) -> None:
        self.system, self.seconds = system, seconds
        self.rng = random.Random(seed)
        self.cluster: ClusterFaults | None = None
        self.kinds, self.weights = KINDS, WEIGHTS
        if isinstance(system.broker, KafkaBroker) and system.nodes > 1:
            self.cluster = ClusterFaults(
                system.broker, system.health_port, system.last_commit,
                lambda: in_flight_batch(system.checkpoint),
                lambda s: self._sleep_until(time.monotonic() + s))
            # The processes' faults less often; the cluster's in broker_pause's place.
            self.kinds = (*KINDS[:2], *CLUSTER_KINDS)
            self.weights = (0.15, 0.25, *(0.6 * w for w in CLUSTER_WEIGHTS))
        self.gap = (min(10.0, seconds / 12), min(30.0, seconds / 5))
        self.injected: list[dict[str, Any]] = []
        self.unplanned: list[dict[str, Any]] = []
        self.started = 0.0

    def run(self) -> None:
        self.started = time.monotonic()
        end = self.started + self.seconds
        first = self.rng.sample(self.kinds, len(self.kinds))  # each kind at least once
        while True:
            at = time.monotonic() + self.rng.uniform(*self.gap)
            if at > end:
                break
            kind = first.pop(0) if first else self.rng.choices(self.kinds, self.weights)[0]
            params = self._params(kind)
            self._sleep_until(at)
            self._wait_ready(kind, params)
            began = time.monotonic() - self.started
            detail = getattr(self, f"_{kind}")(**params)
            self.injected.append({"at_s": round(began, 1), "kind": kind, **params, **detail})
        self._sleep_until(end)

    def _params(self, kind: str) -> dict[str, Any]:
        # Drawn before waiting, in a fixed order: the same seed gives the same schedule.
        if kind == "coordinator_kill":
            return {"mid_batch": self.rng.random() < 0.5}
        if kind == "producer_kill":
            return {"slot": self.rng.randrange(len(self.system.producers)),
                    "mode": self.rng.choice(("before", "after"))}
        if kind in CLUSTER_KINDS:
            return ClusterFaults.params(kind, self.rng, self.system.real_topics, PARTITIONS)
        return {"pause_s": round(self.rng.uniform(2.0, 8.0), 1)}

    def _wait_ready(self, kind: str, params: dict[str, Any]) -> None:
        """A coordinator is killed only once up, a producer only once started (a producer
        signalled before it set its handlers would just die)."""
        def ready() -> bool:
            if kind == "coordinator_kill":
                return self.system.coordinator_up()
            if kind == "producer_kill":
                return self.system.producer_ready(params["slot"])
            return True

        deadline = time.monotonic() + 300
        while not ready():
            assert time.monotonic() < deadline, f"{kind}: the system did not come up"
            self._sleep_until(time.monotonic() + 0.5)

    def _coordinator_kill(self, mid_batch: bool) -> dict[str, Any]:
        return self.system.kill_coordinator(mid_batch)

    def _producer_kill(self, slot: int, mode: str) -> dict[str, Any]:
        return self.system.kill_producer_in_transaction(slot, mode)

    def _broker_pause(self, pause_s: float) -> dict[str, Any]:
        pid = self.system.broker.pid
        assert pid is not None
        pause(pid, pause_s)
        return {}

    def _leader_kill(self, topic: str, partition: int, down_s: float) -> dict[str, Any]:
        assert self.cluster is not None
        return self.cluster.leader_kill(topic, partition, down_s)

    def _history_leader_kill(self, partition: int, down_s: float) -> dict[str, Any]:
        assert self.cluster is not None
        return self.cluster.leader_kill(self.system.topics.history, partition, down_s)

    def _below_isr(self, topic: str, partition: int, hold_s: float) -> dict[str, Any]:
        assert self.cluster is not None
        return self.cluster.below_isr(topic, partition, hold_s)

    def _node_stop(self, node: int, stop_s: float) -> dict[str, Any]:
        assert self.cluster is not None
        return self.cluster.node_stop(node, stop_s)

    def _sleep_until(self, at: float) -> None:
        while (left := at - time.monotonic()) > 0:
            time.sleep(min(left, 0.5))
            self.restart_dead()

    def restart_dead(self) -> None:
        """A process that exited by itself is noted and started again (as a supervisor
        would)."""
        s, now = self.system, round(time.monotonic() - self.started, 1)
        if s.coordinator is not None and not s.coordinator.running:
            tail = s.coordinator.output().strip().splitlines()[-1:] or [""]
            self.unplanned.append({"at_s": now, "what": "coordinator exited", "last": tail[0]})
            s.start_coordinator()
        for slot, proc in enumerate(s.producers):
            if proc is not None and not proc.running:
                tail = proc.output().strip().splitlines()[-1:] or [""]
                self.unplanned.append({"at_s": now, "what": f"producer p{slot} exited",
                                       "last": tail[0]})
                s.start_producer(slot)
