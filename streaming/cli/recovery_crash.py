"""The recovery demo's faults: the coordinator SIGKILLed in the middle of a micro-batch, the
broker paused, and (on a standalone cluster) the executors SIGKILLed.

In the middle of a micro-batch means: the checkpoint has planned batch N (``offsets/N``) and not
committed it (no ``commits/N``), and the real topic already holds some of N's releases. The
demo watches for a batch in flight, notes where the real and history topics end, and waits for
the real topic to grow. Then it stops the whole process tree (SIGSTOP), so nothing can commit
the batch meanwhile, and looks again: still not committed, it kills the tree (SIGKILL); the
batch committed in between, it lets the tree go on and waits for the next one. What batch N
wrote before the kill is then read from the topics, from where they ended when it began.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txstream.broker import EmbeddedBroker
from txstream.kafka import EndProbe, KafkaSettings, TopicReader
from txstream.kafka_broker import KafkaBroker
from txstream.outputs import decode_history, decode_visible
from txstream.streaming.cli.coordinator_process import (
    CoordinatorProcess,
    batch_ids,
    in_flight_batch,
)
from txstream.streaming.cli.recovery_watch import Release
from txstream.streaming.cli.spark_standalone import StandaloneCluster, executor_pids

__all__ = ["Crash", "Pause", "crash_mid_batch", "pause_broker", "kill_executors"]

Ends = dict[tuple[str, int], int]


@dataclass
class Crash:
    """One SIGKILL of the coordinator, and its recovery as the demo measured it."""

    number: int
    at: float  # epoch seconds
    batch: int | None  # the batch in flight, if one was
    mid_batch: bool  # the batch was not committed when the tree was killed
    processes: int
    releases: list[Release] = field(default_factory=list)  # what the batch wrote to the topic
    notes: int = 0  # history notes it wrote
    restart_at: float | None = None
    first_release_at: float | None = None
    caught_up_at: float | None = None
    backlog: int = 0  # commits made between the crash and the first release after it

    @property
    def down_s(self) -> float | None:
        return None if self.restart_at is None else self.restart_at - self.at

    def describe(self) -> str:
        if self.batch is None:
            return "no batch was in flight"
        if not self.mid_batch:
            return f"batch {self.batch} had just committed"
        return (f"batch {self.batch} in flight: {len(self.releases)} of its releases already "
                f"on the real topic, {self.notes} of its history notes written")


@dataclass
class Pause:
    """A fault the coordinator rode out without a restart, and when it caught up: the broker
    stopped (SIGSTOP) until it continued (``kind`` "broker"), or the executors killed until
    the worker ran a new one ("executor")."""

    at: float
    until: float
    caught_up_at: float | None = None
    kind: str = "broker"
    killed: tuple[int, ...] = ()  # the executors' pids
    restarts: int = 0  # the coordinator failed its batch and was restarted

    @property
    def label(self) -> str:
        return "broker paused" if self.kind == "broker" else "executor killed"

    @property
    def back_label(self) -> str:
        return "broker back" if self.kind == "broker" else "new executor"


def _sum(ends: Ends, topic: str) -> int:
    return sum(end for (t, _), end in ends.items() if t == topic)


def _wait_for_writes(coordinator: CoordinatorProcess, checkpoint: Path, probe: EndProbe,
                     real: str, history: str, deadline: float) -> tuple[int | None, Ends]:
    """Freeze the coordinator once a batch in flight has written releases; returns the batch
    and where the topics ended when it was first seen, with the tree frozen (or None at the
    deadline, not frozen)."""
    while time.monotonic() < deadline and coordinator.running:
        batch = in_flight_batch(checkpoint)
        if batch is None:
            time.sleep(0.005)
            continue
        before = probe.topic_ends([real, history])
        start = _sum(before, real)
        while batch not in batch_ids(checkpoint, "commits") and time.monotonic() < deadline:
            if _sum(probe.topic_ends([real]), real) > start:
                coordinator.freeze()
                if batch not in batch_ids(checkpoint, "commits"):
                    return batch, before
                coordinator.thaw()  # committed before the stop landed: the next one
                break
            time.sleep(0.002)  # the coordinator shares the cores: leave it most of them
    return None, {}


def _written_since(settings: KafkaSettings, before: Ends, real: str,
                   history: str) -> tuple[list[Release], int]:
    """The releases and history notes the topics gained since ``before``."""
    time.sleep(0.5)  # a request on the wire when the tree died lands now or never
    with TopicReader(settings, [real, history], before, fetch_max_wait_ms=5) as reader:
        records = reader.read_new(timeout_s=10)
    releases, notes = [], 0
    for r in records:
        if r.topic == real:
            msg = decode_visible(r.topic, r.key, r.value, r.headers)
            releases.append(Release(msg.transaction_id or "", r.timestamp / 1000, r.partition,
                                    r.offset))
        else:
            notes += len(decode_history(r.value, r.key))
    return releases, notes


def crash_mid_batch(number: int, coordinator: CoordinatorProcess, checkpoint: Path,
                    settings: KafkaSettings, real: str, history: str,
                    timeout_s: float = 60.0) -> Crash:
    """SIGKILL the coordinator's whole tree in the middle of a micro-batch that has written
    releases; after ``timeout_s`` without one, whenever it is (the report says which)."""
    with EndProbe(settings) as probe:
        batch, before = _wait_for_writes(coordinator, checkpoint, probe, real, history,
                                         time.monotonic() + timeout_s)
        if batch is None:  # no luck: kill it as it is, and say so
            before = probe.topic_ends([real, history])
            coordinator.freeze()
            batch = in_flight_batch(checkpoint)
    mid = batch is not None and batch not in batch_ids(checkpoint, "commits")
    at = time.time()
    processes = coordinator.kill()
    releases, notes = _written_since(settings, before, real, history)
    return Crash(number, at, batch, mid, processes, releases, notes)


def pause_broker(broker: EmbeddedBroker | KafkaBroker, seconds: float) -> Pause:
    """Stop the broker's processes for ``seconds``, then let them go on as they were."""
    at = time.time()
    if isinstance(broker, KafkaBroker):
        broker.pause()
        try:
            time.sleep(seconds)
        finally:
            broker.resume()
    else:
        pid: Any = broker.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
    return Pause(at, time.time())


def kill_executors(cluster: StandaloneCluster, timeout_s: float = 120.0) -> Pause | None:
    """SIGKILL the cluster's executor JVMs, whatever tasks they run; returns once the worker
    runs a new one (``until``), None if there was none to kill. Their Python workers end with
    their JVM's connection."""
    killed = executor_pids(cluster)
    if not killed:
        return None
    at = time.time()
    for pid in killed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while not [p for p in executor_pids(cluster) if p not in killed]:
        if time.monotonic() > deadline:
            break  # the demo goes on: the verdict and the catch-up say the rest
        time.sleep(0.2)
    return Pause(at, time.time(), kind="executor", killed=tuple(killed))
