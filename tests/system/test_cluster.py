"""The coordinator on a real Spark standalone cluster, submitted as a user submits it.

One ``spark-submit --master spark://...`` of ``txstream run`` with a ``file://`` checkpoint URI
serves both tests: RocketMQ's example through it, then an executor SIGKILLed while
transactions are in flight (the submission started again if the kill fails its batch, as a
supervisor would). The figures are printed (``pytest -m cluster -s``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_helpers import (
    StandaloneCluster,
    executor_pids,
    started_coordinator,
    submit_command,
    ui_json,
)
from tests.support.kafka_helpers import end_record, half_record, produce, wait_until
from tests.support.ports import reserve_port
from tests.support.process_helpers import CoordinatorProcess
from tests.support.seed_helpers import SeedRun
from txstream.client.options import new_message_id
from txstream.kafka import KafkaSettings, read_topic
from txstream.message import Decision
from txstream.outputs import decode_history
from txstream.streaming.engine.checkpoint import LAYOUT_FILE
from txstream.topics import Topics
from txstream.wire import H, header_dict

pytestmark = pytest.mark.cluster

POLICY = ["--transaction-timeout", "2s", "--check-interval", "2s", "--check-max", "3",
          "--trigger", "200ms"]


@dataclass
class Submitted:
    process: CoordinatorProcess
    topics: Topics
    checkpoint: Path
    cwd: Path
    ui_port: int
    start_seconds: float
    cluster: StandaloneCluster
    start: Callable[[Path], CoordinatorProcess]  # the same submission again, as a supervisor


@pytest.fixture(scope="module")
def submitted(cluster: StandaloneCluster, kafka: KafkaSettings,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Submitted]:
    root = tmp_path_factory.mktemp("submitted")
    cwd = root / "cwd"
    cwd.mkdir()
    topics = Topics.with_prefix(f"c{uuid.uuid4().hex[:8]}_")
    ui_port = reserve_port()
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", topics.prefix,
            "--checkpoint-dir", (root / "cp").as_uri(), "--log-level", "WARN", *POLICY]
    command = submit_command(cluster, "spark.ui.enabled=true", f"spark.ui.port={ui_port}")
    def start(log: Path) -> CoordinatorProcess:
        return CoordinatorProcess(args, log, command=command, cwd=cwd).start()

    submitted = Submitted(start(root / "driver.log"), topics, root / "cp", cwd, ui_port, 0.0,
                          cluster, start)
    try:
        submitted.start_seconds = started_coordinator(submitted.process)
        yield submitted
    finally:
        submitted.process.terminate()


def _app(ui_port: int) -> str:
    return str(ui_json(ui_port, "applications")[0]["id"])


def test_the_seed_example_on_a_standalone_cluster_gives_1_4_7(
    submitted: Submitted, kafka: KafkaSettings
) -> None:
    began = time.monotonic()
    seed = SeedRun(kafka, submitted.topics)
    seed.run(check_interval_s=2.0, timeout_s=300.0)  # minutes on a loaded CI machine
    assert sorted(seed.received) == [f"Hello RocketMQ {i}" for i in (1, 4, 7)]
    assert seed.discarded() == [f"Hello RocketMQ {i}" for i in (0, 3, 6, 9)]
    app = _app(submitted.ui_port)
    # spark-submit --conf spark.ui.enabled=true is honoured: the UI answers, and its
    # environment shows the user's settings beside txstream's.
    properties = dict(ui_json(submitted.ui_port, f"applications/{app}/environment")
                      ["sparkProperties"])
    assert properties["spark.ui.enabled"] == "true"
    assert properties["spark.executor.memory"] == "1g"
    assert "spark.default.parallelism" not in properties
    assert "log4j" not in properties["spark.executor.extraJavaOptions"]
    # The work ran on the worker's executor, not in the driver.
    executors = ui_json(submitted.ui_port, f"applications/{app}/executors")
    tasks = {e["id"]: e["totalTasks"] for e in executors}
    assert any(n > 0 for eid, n in tasks.items() if eid != "driver"), tasks
    # Everything txstream keeps is in the checkpoint the URI names; nothing is beside it on
    # the driver's disk (its working directory stays empty).
    assert (submitted.checkpoint / LAYOUT_FILE).is_file()
    assert (submitted.checkpoint / "commits").is_dir()
    assert os.listdir(submitted.cwd) == []
    print(f"\ncluster seed example: coordinator started in {submitted.start_seconds:.1f} s, "
          f"the example took {time.monotonic() - began:.1f} s; received "
          f"{sorted(seed.received)}, executors' tasks {tasks}")


def _visible(kafka: KafkaSettings, topic: str) -> Counter[str]:
    return Counter(header_dict(r.headers)[H.TRANSACTION_ID] for r in read_topic(kafka, topic))


def _registered(kafka: KafkaSettings, topics: Topics, txids: set[str]) -> set[str]:
    return {str(n["transaction_id"]) for r in read_topic(kafka, topics.history)
            for n in decode_history(r.value, r.key)
            if n["event"] == "half" and n["transaction_id"] in txids}


def _transactions(topics: Topics, group: str, real: str, n: int) -> tuple[dict[str, Decision],
                                                                           list[Any]]:
    plan = {new_message_id(): Decision.COMMIT_MESSAGE if i % 3 else Decision.ROLLBACK_MESSAGE
            for i in range(n)}
    return plan, [half_record(topics, txid, group, real, f"m{txid}".encode()) for txid in plan]


def _caught_up_supervised(submitted: Submitted, caught_up: Callable[[], bool],
                          timeout_s: float = 180.0) -> int:
    """Wait for ``caught_up``, starting the coordinator again as a supervisor would if it
    failed as designed: an executor killed while a batch reads its shuffle takes that
    shuffle's files with it, and txstream refuses a stage run again (decision 0005), so the
    query fails and its next run replays the batch. Any other exit fails the test. The
    number of restarts."""
    restarts, deadline = 0, time.monotonic() + timeout_s
    while not caught_up():
        assert time.monotonic() < deadline, f"not caught up within {timeout_s:.0f} s"
        if not submitted.process.running:
            said = submitted.process.output()
            assert "has failed the maximum allowable number of times: 1" in said, said[-3000:]
            assert restarts < 2, said[-3000:]
            restarts += 1
            submitted.process = submitted.start(
                submitted.checkpoint.parent / f"driver-{restarts}.log")
            started_coordinator(submitted.process)
        time.sleep(1)
    return restarts


def test_an_executor_killed_mid_stream_loses_no_commit_and_shows_no_rollback(
    submitted: Submitted, kafka: KafkaSettings
) -> None:
    topics, group, real = submitted.topics, "kill-group", f"killed_{uuid.uuid4().hex[:8]}"
    before, halves = _transactions(topics, group, real, 45)
    produce(kafka, halves)
    # Minutes, not seconds: a cold query on a cluster sharing a loaded CI machine's 2 cores.
    wait_until(lambda: _registered(kafka, topics, set(before)) == set(before), timeout_s=240)
    killed = executor_pids(submitted.cluster)
    assert killed, "no executor to kill"
    # The end events go out and the executor dies while they are in flight.
    produce(kafka, [end_record(topics, txid, group, decision) for txid, decision in
                    before.items()])
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    replaced = wait_until(lambda: [p for p in executor_pids(submitted.cluster) if p not in killed],
                          timeout_s=60)
    replaced_s = time.monotonic() - killed_at
    after, halves = _transactions(topics, group, real, 15)
    produce(kafka, halves)
    produce(kafka, [end_record(topics, t, group, d) for t, d in after.items()])
    plan = {**before, **after}
    commits = {t for t, d in plan.items() if d is Decision.COMMIT_MESSAGE}
    restarts = _caught_up_supervised(submitted, lambda: set(_visible(kafka, real)) >= commits)
    time.sleep(3)  # a late duplicate or rollback would show by now
    visible = _visible(kafka, real)
    figures = {"before_kill": len(before), "after_kill": len(after), "commits": len(commits),
               "rollbacks": len(plan) - len(commits), "killed": killed,
               "replacement": replaced, "replaced_in_s": round(replaced_s, 1),
               "coordinator_restarts": restarts,
               "lost": len(commits - set(visible)),
               "visible_rollbacks": len(set(visible) - commits),
               "duplicates": sum(n - 1 for n in visible.values())}
    print(f"\ncluster executor kill: {figures}")
    assert figures["lost"] == 0 and figures["visible_rollbacks"] == 0
    assert figures["duplicates"] == 0
    assert submitted.process.running
