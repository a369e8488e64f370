"""Broker trouble: unreachable at start, and restarted under a running coordinator.

The restart test stores the broker's data in S3 (tansu's ``s3://`` storage on a loopback
``moto_server``): the memory storage would lose every topic with the broker, and no
coordinator can recover records that no longer exist.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import (
    headers_of,
    mixed_transactions,
    produce,
    read_topic,
    wait_until,
)
from tests.support.ports import reserve_port
from tests.support.process_helpers import CoordinatorProcess, S3Server
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator
from txstream.topics import Topics


def test_unreachable_broker_at_start_fails_in_one_line_after_retrying(
        tmp_path: Path, coordinator_processes: Callable[..., CoordinatorProcess]) -> None:
    closed = reserve_port()  # nothing listens there
    started = time.monotonic()
    process = coordinator_processes(["--bootstrap-servers", f"127.0.0.1:{closed}",
                                     "--broker-timeout", "3", "--checkpoint-dir",
                                     str(tmp_path / "cp")]).start()
    assert process.proc is not None
    code = process.proc.wait(timeout=120)
    took = time.monotonic() - started
    output = process.output()
    assert code == 2, output
    # The error is one line, the last (stdout's progress lines come before it).
    line = output.strip().splitlines()[-1]
    assert sum(x.startswith("txstream: ") for x in output.splitlines()) == 1, output
    assert line.startswith("txstream: ") and f"127.0.0.1:{closed} unreachable after 3s" in line
    assert "Traceback" not in output
    assert took >= 3, "it kept trying for the whole --broker-timeout"
    assert not (tmp_path / "cp").exists() or not any((tmp_path / "cp").iterdir())


def _produce_through_restart(kafka: KafkaSettings, records: list[Any]) -> None:
    """Produce, retrying while the broker comes back (a producer's usual duty)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            produce(kafka, records)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


@pytest.mark.spark
def test_broker_restart_under_a_running_coordinator_loses_nothing(
    spark: Any, tmp_path: Path, checkpoint_dir: Path, unique: str
) -> None:
    s3 = S3Server(tmp_path / "moto.log").start(bucket=unique.lower())
    broker = EmbeddedBroker(storage=f"s3://{unique.lower()}/", env=s3.broker_env(),
                            log_path=str(tmp_path / "tansu.log"))
    coordinators: list[Coordinator] = []
    try:
        broker.start()
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        topics, real = Topics.with_prefix(f"{unique}_"), f"{unique}-real"
        config = RunConfig(kafka=kafka, topics=topics, checkpoint_dir=checkpoint_dir, buckets=8,
                           policy=Policy(transaction_timeout=2000, check_interval=2000),
                           query_name=f"restart-{uuid.uuid4().hex[:6]}")
        coordinators.append(Coordinator(config).start())
        failures: list[str] = []

        def visible() -> list[str]:
            return [headers_of(r)["UNIQ_KEY"] for r in read_topic(kafka, real, timeout_s=5)]

        def released(wanted: set[str], timeout_s: float) -> None:
            """Until ``wanted`` is visible. Either the query rides a fault out, or it fails
            saying why and a restart from the checkpoint takes over, as its operator would
            restart it (tansu on S3 may also refuse an append that races another to the same
            partition: a failed batch). Both must end with everything released."""
            def done_or_failed() -> str | bool:
                failure = coordinators[-1].failure()
                return failure if failure is not None else wanted <= set(visible())

            deadline = time.monotonic() + timeout_s
            while (outcome := wait_until(done_or_failed, interval_s=1,
                                         timeout_s=max(1.0, deadline - time.monotonic()))
                   ) is not True:
                failures.append(str(outcome))
                assert "\n" not in failures[-1] and len(failures[-1]) <= 500
                assert len(failures) <= 3, failures
                coordinators[-1].stop()
                coordinators.append(Coordinator(config).start())

        before, commits = mixed_transactions(topics, "before", real, 30)
        produce(kafka, before)
        released(commits, timeout_s=180)

        broker.stop()  # while the query runs: its source and sink lose the broker
        time.sleep(2)
        broker.start()
        after, more = mixed_transactions(topics, "after", real, 30)
        _produce_through_restart(kafka, after)
        commits |= more
        released(commits, timeout_s=240)
        time.sleep(3)  # a late duplicate would show now
        raw = visible()
        rolled_back = {f"{tag}-{i}" for tag in ("before", "after") for i in range(30)} - commits
        how = "query failed: " + "; ".join(failures) if failures else "query recovered"
        print(f"\nbroker restart: {how}; {len(commits)} committed, {len(raw)} records, "
              f"{len(raw) - len(set(raw))} raw duplicates")
        assert set(raw) == commits, "nothing lost, no rollback shows"
        assert not set(raw) & rolled_back
    finally:
        for coordinator in coordinators:
            coordinator.stop()
        broker.stop()
        s3.stop()
