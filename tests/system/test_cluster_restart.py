"""A driver stopped and restarted on a standalone cluster, with the same checkpoint URI, from
another working directory and another temporary directory, as on another host: it resumes its
timers without new input, and refuses a changed layout. The first run is ``txstream run
--master``; the restarts are spark-submits, stopped with SIGTERM to the spark-submit process."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from tests.support.cluster_helpers import StandaloneCluster, started_coordinator, submit_command
from tests.support.kafka_helpers import half_record, produce, wait_until
from tests.support.process_helpers import CoordinatorProcess
from txstream.kafka import KafkaSettings, read_topic
from txstream.topics import Topics
from txstream.wire import H, header_dict

pytestmark = pytest.mark.cluster


def _host(root: Path, name: str) -> tuple[Path, dict[str, str]]:
    """A working directory and a temporary directory of their own: another host, as far as
    the driver's local disk goes."""
    cwd, tmp = root / name / "cwd", root / name / "tmp"
    cwd.mkdir(parents=True)
    tmp.mkdir()
    return cwd, {"TMPDIR": str(tmp)}


def _checks(kafka: KafkaSettings, topics: Topics, group: str) -> list[int]:
    return [int(header_dict(r.headers)[H.CHECK_TIMES])
            for r in read_topic(kafka, topics.check(group))]


def _stop_cleanly(process: CoordinatorProcess) -> str:
    assert process.terminate(timeout_s=60) == 0, process.output()[-3000:]
    out = process.output()
    assert "Traceback" not in out and "stopping coordinator" in out, out[-3000:]
    return out


def test_a_driver_restarted_elsewhere_resumes_its_timers_and_keeps_its_layout(
    cluster: StandaloneCluster, kafka: KafkaSettings, tmp_path: Path
) -> None:
    topics = Topics.with_prefix(f"r{uuid.uuid4().hex[:8]}_")
    group = "nobody-answers"
    args = ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", topics.prefix,
            "--checkpoint-dir", (tmp_path / "cp").as_uri(), "--transaction-timeout", "2s",
            "--check-interval", "3s", "--trigger", "200ms", "--log-level", "WARN"]
    cwd, env = _host(tmp_path, "a")
    first = CoordinatorProcess(["--master", cluster.url, "--conf", "spark.executor.memory=1g",
                                *args], tmp_path / "first.log", cwd=cwd, env=env).start()
    try:
        started_coordinator(first)
        produce(kafka, [half_record(topics, "0190A1B2C3D47E5F8A9B0C1D2E3F4A5B", group, "real")])
        # A cluster's first batch starts its executors' Python workers: 25 s on 2 quiet
        # cores, over a minute beside CI's other workers.
        wait_until(lambda: _checks(kafka, topics, group) == [1], timeout_s=180)
    finally:
        _stop_cleanly(first)

    cwd, env = _host(tmp_path, "b")
    second = CoordinatorProcess(args, tmp_path / "second.log",
                                command=submit_command(cluster), cwd=cwd, env=env).start()
    try:
        start_s = started_coordinator(second)
        restarted = time.monotonic()
        # No new input: the checks come from the timers the state holds.
        wait_until(lambda: _checks(kafka, topics, group)[-2:] == [2, 3], timeout_s=180)
        resumed_s = time.monotonic() - restarted
    finally:
        out = _stop_cleanly(second)
    assert "ERROR" not in out, out[-3000:]

    cwd, env = _host(tmp_path, "c")
    changed = CoordinatorProcess([*args, "--key-shards", "4"], tmp_path / "third.log",
                                 command=submit_command(cluster), cwd=cwd, env=env).start()
    assert changed.proc is not None and changed.proc.wait(timeout=180) != 0
    refusal = changed.output()
    assert "written with another state-key layout" in refusal and "--key-shards 2" in refusal
    assert "Traceback" not in refusal, refusal[-3000:]
    print(f"\ncluster restart: the restarted driver started in {start_s:.1f} s and sent the "
          f"due back-checks {resumed_s:.1f} s after, with no new input; checks "
          f"{_checks(kafka, topics, group)}; a changed layout was refused")
