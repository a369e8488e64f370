"""The recovery phase: how long commits wait when the coordinator starts, and restarts.

A coordinator of the phase's own runs as a process tree (``txstream run``, started and
SIGKILLed as the recovery demo does it: ``CoordinatorProcess``) on a checkpoint of its own.

* **Cold start:** a transaction committed before the coordinator starts; from the start of
  its process to that message visible on its real topic.
* **Restart,** ``restarts`` times: the tree SIGKILLed once a batch has committed since the
  last start, ``COMMITS_WHILE_DOWN`` transactions committed while it is down, and a restart on
  the same checkpoint; from the restart to the last of them visible on the real topic.

The figures are wall-clock seconds; the spin (PERFORMANCE.md's loop) is timed before and after,
since they scale with the machine's speed.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.workload import RecordWatcher, Workload, create_topics
from txstream.errors import TxStreamError
from txstream.kafka import KafkaSettings, make_producer
from txstream.streaming.cli.coordinator_process import CoordinatorProcess, batch_ids
from txstream.topics import Topics
from txstream.wire import Record

__all__ = ["RecoveryResult", "measure_recovery", "spin_s", "COMMITS_WHILE_DOWN", "WAIT_S"]

COMMITS_WHILE_DOWN = 5
WAIT_S = 600.0  # the longest a start may take before the phase gives up


@dataclass(frozen=True)
class RecoveryResult:
    cold_start_s: float
    restart_to_visible_s: list[float]
    restart_to_visible_median_s: float
    spin_before_s: float
    spin_after_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def spin_s() -> float:
    """PERFORMANCE.md's 20M-step loop: this machine's speed, now."""
    t, n = time.perf_counter(), 0
    for i in range(20_000_000):
        n += i
    return round(time.perf_counter() - t, 2)


class _Visible:
    """The transactions seen on the real topic, by id (the workload keys each by it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, float] = {}

    def take(self, record: Any, at_ms: float) -> None:
        with self._lock:
            self._seen.setdefault(bytes(record.key or b"").decode(), at_ms / 1000)

    def when(self, txids: list[str]) -> float | None:
        """When the last of ``txids`` was seen (epoch seconds); None while one is missing."""
        with self._lock:
            times = [self._seen.get(t) for t in txids]
        return None if None in times else max(t for t in times if t is not None)


def _commit(settings: KafkaSettings, workload: Workload, count: int) -> list[str]:
    """``count`` transactions committed as a producer commits them (acks=all); their ids."""
    records: list[Record] = list(workload.committed("recovery", count))
    producer = make_producer(settings)
    try:
        for r in records:
            producer.send(r.topic, key=r.key, value=r.value, headers=list(r.headers))
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)
    return [bytes(r.key or b"").decode() for r in records[::2]]


def _wait(done: Callable[[], float | None], coordinator: CoordinatorProcess, what: str) -> float:
    deadline = time.monotonic() + WAIT_S
    while (at := done()) is None:
        if not coordinator.running:
            raise TxStreamError(f"the coordinator exited {what}:\n{coordinator.output()[-2000:]}")
        if time.monotonic() > deadline:
            raise TxStreamError(f"nothing visible {what} within {WAIT_S:g} s")
        time.sleep(0.05)
    return at


def measure_recovery(settings: KafkaSettings, restarts: int, partitions: int,
                     say: Callable[[str], None]) -> RecoveryResult:
    """Cold start, then ``restarts`` SIGKILLs and restarts (module docstring)."""
    spin_before = spin_s()
    unique = uuid.uuid4().hex[:8]
    workload = Workload(Topics.with_prefix(f"brec{unique}_"), f"bench-recovery-{unique}",
                        f"bench_recovery_{unique}")
    create_topics(settings, [workload.real_topic], partitions)
    visible = _Visible()
    watcher = RecordWatcher(settings, [workload.real_topic], visible.take).start()
    with tempfile.TemporaryDirectory(prefix="txstream-bench-recovery-") as tmp:
        folder = Path(tmp)
        args = ["--bootstrap-servers", settings.bootstrap_servers, "--checkpoint-dir",
                str(folder / "checkpoint"), "--topic-prefix", workload.topics.prefix]
        first = _commit(settings, workload, 1)
        coordinator = CoordinatorProcess(args, folder / "coordinator.log").start()
        started = time.time()
        try:
            cold = _wait(lambda: visible.when(first), coordinator, "after a cold start") - started
            say(f"recovery: cold start to the first release {cold:.1f} s")
            times: list[float] = []
            for n in range(restarts):
                coordinator = _restart(settings, workload, coordinator, args, folder, visible,
                                       times)
                say(f"recovery: restart {n + 1} to {COMMITS_WHILE_DOWN} commits visible "
                    f"{times[-1]:.1f} s")
        finally:
            coordinator.terminate(timeout_s=30)
            watcher.stop()
    return RecoveryResult(round(cold, 2), [round(t, 2) for t in times],
                          round(statistics.median(times), 2) if times else 0.0,
                          spin_before, spin_s())


def _restart(settings: KafkaSettings, workload: Workload, coordinator: CoordinatorProcess,
             args: list[str], folder: Path, visible: _Visible, times: list[float]
             ) -> CoordinatorProcess:
    """SIGKILL once a batch committed since its start, commit while down, restart: the time
    from the restart to the last commit visible goes to ``times``."""
    checkpoint = folder / "checkpoint"
    committed = batch_ids(checkpoint, "commits")
    _wait(lambda: 1.0 if batch_ids(checkpoint, "commits") - committed or not committed
          else None, coordinator, "before the kill")
    coordinator.kill()
    down = _commit(settings, workload, COMMITS_WHILE_DOWN)
    restarted = CoordinatorProcess(args, folder / "coordinator.log").start()
    restart_at = time.time()
    times.append(_wait(lambda: visible.when(down), restarted, "after a restart") - restart_at)
    return restarted
