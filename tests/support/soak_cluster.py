"""The soak's faults that only a replicated broker has, on three Apache Kafka nodes
(``TXSTREAM_SOAK_NODES=3``; ``make soak``):

* ``leader_kill``: SIGKILL of the node leading a real topic's partition while a micro-batch is
  in flight, and a restart of that node on its data 5-15 s later;
* ``history_leader_kill``: the same for a partition of the history topic;
* ``below_isr``: of a real topic's partition, one follower paused, then the second, for 10 s.
  Every node is a KRaft controller too (combined mode): with two of three paused the quorum
  is gone, so the leader cannot shrink the ISR to itself: the partition takes no write at all
  until the followers are back, which a write with ``acks=all`` meets as a timeout, not as
  NOT_ENOUGH_REPLICAS (tests/sinks/test_notes_after_releases.py shows that refusal on its own);
* ``node_stop``: SIGSTOP of one node for 20 s.

While a fault lasts, ``/healthz`` is read every second and the reasons it gives are kept; once
it is over, the time until the coordinator commits its next micro-batch is taken (it must come
back on its own).
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from txstream.kafka_broker import KafkaBroker

__all__ = ["CLUSTER_CONFIGS", "CLUSTER_KINDS", "CLUSTER_WEIGHTS", "ClusterFaults", "healthz",
           "cluster_summary", "commits_metric"]

CLUSTER_KINDS = ("leader_kill", "history_leader_kill", "below_isr", "node_stop")
CLUSTER_WEIGHTS = (0.3, 0.2, 0.25, 0.25)
# A node lost is fenced within 3 s; a follower 5 s behind leaves the ISR.
CLUSTER_CONFIGS = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500",
                   "replica.lag.time.max.ms": "5000"}
BACK_WAIT_S = 300.0


def healthz(port: int, timeout_s: float = 3.0) -> tuple[int, dict[str, Any]] | None:
    """``/healthz``'s status and body (None: the server does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout_s) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except (OSError, ValueError):
        return None


def commits_metric(port: int) -> int | None:
    """The coordinator's ``txstream_commits_total``, summed over its labels (None: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("txstream_commits_total{")))


def cluster_summary(injected: list[dict[str, Any]]) -> str:
    """One line per cluster fault: when, what, how long until the next batch, what /healthz
    said meanwhile."""
    lines = []
    for fault in injected:
        if fault["kind"] not in CLUSTER_KINDS:
            continue
        what = {k: v for k, v in fault.items() if k not in ("at_s", "kind", "health", "back_s")}
        health = "; ".join(fault.get("health", [])) or "nothing"
        lines.append(f"  {fault['at_s']:>6} s {fault['kind']} {what}: next batch "
                     f"{fault.get('back_s')} s after; /healthz said: {health}")
    backs = [f["back_s"] for f in injected if f["kind"] in CLUSTER_KINDS]
    worst = None if None in backs else max(backs, default=0)
    return "\n".join([f"cluster faults: {len(backs)}, the coordinator back within "
                      f"{worst} s of each (None: not within {BACK_WAIT_S:g} s)", *lines])


class HealthLog:
    """The distinct reasons ``/healthz`` gives while a fault lasts (read every second)."""

    def __init__(self, port: int) -> None:
        self.port, self.reasons, self.unanswered = port, [], 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HealthLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            answer = healthz(self.port)
            if answer is None:
                self.unanswered += 1
            else:
                for reason in answer[1].get("reasons", []):
                    # Once per kind: "unreachable for 9s" and "for 10s" are one reason.
                    shape = re.sub(r"\d+(?:\.\d+)?s\b", "Ns", reason)
                    if shape not in self.reasons:
                        self.reasons.append(shape)
            self._stop.wait(1.0)


class ClusterFaults:
    """The faults above, on ``broker``; ``last_commit`` gives the checkpoint's last committed
    batch, ``in_flight`` a batch being run (None: none now), ``idle`` lets the caller restart
    what died meanwhile while this waits."""

    def __init__(self, broker: KafkaBroker, health_port: int, last_commit: Callable[[], int],
                 in_flight: Callable[[], int | None], idle: Callable[[float], None]) -> None:
        self.broker, self.port = broker, health_port
        self.last_commit, self.in_flight, self.idle = last_commit, in_flight, idle

    @staticmethod
    def params(kind: str, rng: random.Random, real_topics: list[str],
               partitions: int) -> dict[str, Any]:
        if kind == "leader_kill":
            return {"topic": rng.choice(real_topics), "partition": rng.randrange(partitions),
                    "down_s": round(rng.uniform(5.0, 15.0), 1)}
        if kind == "history_leader_kill":
            return {"partition": rng.randrange(partitions),
                    "down_s": round(rng.uniform(5.0, 15.0), 1)}
        if kind == "below_isr":
            return {"topic": rng.choice(real_topics), "partition": rng.randrange(partitions),
                    "hold_s": 10.0}
        return {"node": rng.randrange(3), "stop_s": 20.0}

    def leader_kill(self, topic: str, partition: int, down_s: float) -> dict[str, Any]:
        """SIGKILL the partition's leader mid-batch; restart it ``down_s`` later."""
        leader = self.broker.leader(topic, partition)
        deadline, batch = time.monotonic() + 20, None
        while batch is None and time.monotonic() < deadline:
            batch = self.in_flight()
            time.sleep(0.01)
        with HealthLog(self.port) as health:
            self.broker.kill_node(leader)
            self.idle(down_s)
            self.broker.restart_node(leader, timeout_s=120)
            back = self._back()
        return {"leader": leader, "batch": batch, "back_s": back, "health": health.reasons}

    def below_isr(self, topic: str, partition: int, hold_s: float) -> dict[str, Any]:
        """Pause one follower, wait for the ISR to drop it, then pause the second."""
        found = self.broker.describe_partition(topic, partition)
        leader = int(found["leader_id"])
        followers = [n for n in found["replica_nodes"] if n != leader][:2]
        seen: list[list[int]] = []
        with HealthLog(self.port) as health:
            self.broker.pause_node(followers[0])
            try:
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    isr = self._isr_from(leader, topic, partition)
                    if isr is not None and (not seen or seen[-1] != isr):
                        seen.append(isr)
                    if isr is not None and followers[0] not in isr:
                        break
                    self.idle(0.5)
                self.broker.pause_node(followers[1])
                try:
                    self.idle(hold_s)
                finally:
                    self.broker.resume_node(followers[1])
            finally:
                self.broker.resume_node(followers[0])
            back = self._back()
        return {"leader": leader, "paused": followers, "isr_seen": seen, "back_s": back,
                "health": health.reasons}

    def node_stop(self, node: int, stop_s: float) -> dict[str, Any]:
        with HealthLog(self.port) as health:
            self.broker.pause_node(node)
            try:
                self.idle(stop_s)
            finally:
                self.broker.resume_node(node)
            back = self._back()
        return {"back_s": back, "health": health.reasons}

    def _isr_from(self, node: int, topic: str, partition: int) -> list[int] | None:
        """The partition's ISR as the cluster tells it, asked of ``node`` first (None: no
        answer in time; the client may pick a paused node for the request)."""
        from kafka import KafkaAdminClient

        try:
            admin = KafkaAdminClient(bootstrap_servers=self.broker.node_address(node),
                                     request_timeout_ms=3000)
            try:
                (described,) = admin.describe_topics([topic])
            finally:
                admin.close()
        except Exception:  # a paused node asked: no answer
            return None
        for part in described["partitions"]:
            if part["partition_index"] == partition:
                return sorted(part["isr_nodes"])
        return None

    def _back(self) -> float | None:
        """Seconds from the fault's end to the coordinator's next committed batch (None: not
        within BACK_WAIT_S)."""
        start, before = time.monotonic(), self.last_commit()
        while time.monotonic() - start < BACK_WAIT_S:
            if self.last_commit() > before:
                return round(time.monotonic() - start, 1)
            self.idle(0.5)
        return None
