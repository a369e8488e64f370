"""``txstream demo --recovery`` at a small size: a coordinator killed mid-batch, and a verdict
that can fail.

The demo runs as a newcomer runs it (a subprocess) on the session's broker: it SIGKILLs its
coordinator in the middle of a micro-batch under traffic, restarts it from the same checkpoint,
and its verdict passes; the picture's data shows the crash and no release while the coordinator
was down; nothing it started is left running. Then the same demo with a coordinator whose sink
does not look for what a crashed run wrote (``replay_check=false``, patched into the
coordinator's own process before ``txstream run`` starts): the replay writes the crashed
batch's releases again, and the verdict fails on the copies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import wait_until
from tests.support.ports import reserve_port
from tests.support.process_helpers import marked_processes
from txstream.kafka import KafkaSettings
from txstream.streaming.cli import build_parser
from txstream.streaming.cli.recovery_chart import DATA_FILE, PAGE_FILE
from txstream.streaming.cli.recovery_command import recovery_command

# Spark in a subprocess, so no fixture marks it; not in the crash group, whose one worker
# would run these after the three-crash test instead of beside it (CI's time).
pytestmark = pytest.mark.spark

MARK = "TXSTREAM_TEST_RECOVERY_MARK"
# Small: a few seconds of traffic before the crash and after the recovery.
# The demo's own limit covers two Spark starts and a catch-up: minutes on a loaded CI machine.
DEMO_LIMIT_S = 660
SMALL = ["--rate", "5", "--kill-after", "4", "--down", "1", "--tail", "2",
         "--timeout", str(DEMO_LIMIT_S)]


def _marked(mark: str) -> list[str]:
    return marked_processes(MARK, mark)


def _own_topics(kafka: KafkaSettings, folder: Path) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    return ["--bootstrap-servers", kafka.bootstrap_servers, "--topic-prefix", f"r{tag}_",
            "--topic", f"orders-{tag}", "--checkpoint-dir", str(folder)]


def _released_while_down(data: dict[str, Any]) -> tuple[int, int]:
    """Releases in the whole seconds between the crash and the first release after it, and
    from that first release on."""
    marks = {m["kind"]: m["t"] for m in data["marks"]}
    crash, first = marks["crash"], marks["first_release"]
    per_second = data["released_per_second"]
    down = per_second[int(crash) + 1:int(first)]
    return sum(down), sum(per_second[int(first):])


@pytest.mark.timeout(DEMO_LIMIT_S + 120)
def test_recovery_demo_crashes_mid_batch_and_loses_nothing(
    kafka: KafkaSettings, tmp_path: Path, record_property: Any
) -> None:
    mark, folder, port = uuid.uuid4().hex, tmp_path / "demo", reserve_port()
    env = {**os.environ, MARK: mark, "PYSPARK_PYTHON": sys.executable}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "txstream.streaming.cli", "demo", "--recovery", *SMALL,
         *_own_topics(kafka, folder), "--ui", "--ui-port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    charts: list[str] = []  # the console's chart page, as the run went on
    threading.Thread(target=_watch_chart, args=(proc, port, charts), daemon=True).start()
    try:
        out, _ = proc.communicate(timeout=DEMO_LIMIT_S + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    print(out)
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"\*\*\* CRASH 1: SIGKILL of the coordinator's \d+ processes; batch \d+ "
                     r"in flight: [1-9]\d* of its releases already on the real topic", out)
    assert "*** RESTART from the same checkpoint" in out
    assert re.search(r"\*\*\* first release after the restart: \+[\d.]+ s", out)
    assert "*** caught up" in out
    live = re.findall(r"sent \d+ \| committed \d+ \| released \d+ \| rolled back \d+ \| "
                      r"pending \d+ \| coordinator (\w[\w ]*)$", out, re.M)
    assert {"running", "DOWN", "recovering", "CAUGHT UP"} <= set(live)
    assert re.search(r"released (\d+) of \1 committed: lost 0, doubled 0", out)
    assert re.search(r"^\S+ +pending 0$", out, re.M)
    assert "PASS: lost 0, doubled 0, pending 0" in out
    assert re.search(r"the replay found the release by its record id|its 'released' note "
                     r"written, before the crash", out)
    # The picture, and the data behind it: the crash marked, nothing released while down.
    data = json.loads((folder / DATA_FILE).read_text())
    assert [m["kind"] for m in data["marks"]][:4] == ["crash", "restart", "first_release",
                                                      "caught_up"]
    assert [b["kind"] for b in data["bands"]] == ["down", "recovering"]
    while_down, after = _released_while_down(data)
    assert while_down == 0 and after > 0
    page = (folder / PAGE_FILE).read_text()
    assert '<line class="mark crash"' in page and '<rect class="band down"' in page
    assert f"the picture: {folder / PAGE_FILE}" in out
    assert (folder / "checkpoint" / "commits").is_dir()  # the checkpoint stays for the user
    # --ui: the console served this run's chart while it ran, the crash marked once it came.
    assert f"this run's chart: http://127.0.0.1:{port}/recovery" in out
    assert any('class="mark crash"' in chart for chart in charts), len(charts)
    wait_until(lambda: not _marked(mark), timeout_s=10)
    times = re.search(r"from the restart to the first release ([\d.]+) s, to caught up "
                      r"([\d.]+) s", out)
    assert times
    record_property("report", f"recovery demo: {took:.0f} s; restart to first release "
                              f"{times.group(1)} s, to caught up {times.group(2)} s")


def _watch_chart(proc: subprocess.Popen[str], port: int, charts: list[str]) -> None:
    """Fetch the console's chart page every 2 s while the demo runs."""
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/recovery", timeout=5) as r:
                charts.append(r.read().decode())
        except OSError:
            pass  # not up yet, or gone
        time.sleep(2)


# ``txstream run`` with the sink's replay check off: the coordinator's process builds its sink
# options through this, so every task's writer gets replay_check=false.
BLIND_RUN = (sys.executable, "-c", """
import dataclasses, sys
from txstream.streaming.engine import query
seen = query.SinkOptions
query.SinkOptions = lambda **kw: dataclasses.replace(seen(**kw), replay_check=False)
from txstream.streaming.cli import main
sys.exit(main(sys.argv[1:]))
""", "run", "--conf", "spark.ui.enabled=false")


@pytest.mark.timeout(DEMO_LIMIT_S + 120)
def test_the_verdict_fails_on_releases_a_replay_wrote_twice(
    kafka: KafkaSettings, coordinator_processes: Any, tmp_path: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "blind"
    args = build_parser().parse_args(["demo", "--recovery", *SMALL, *_own_topics(kafka, folder)])

    def blind(run_args: list[str], log: Path) -> Any:
        return coordinator_processes(run_args, log, command=BLIND_RUN)

    code = recovery_command(args, blind)
    out = capsys.readouterr().out
    print(out)
    crashed = re.search(r"CRASH 1: .* batch \d+ in flight: (\d+) of its releases", out)
    assert crashed and int(crashed.group(1)) > 0, out[-4000:]
    doubled = re.search(r"lost 0, doubled (\d+)", out)
    assert doubled and int(doubled.group(1)) >= int(crashed.group(1)), out[-4000:]
    assert re.search(r"^\S+ FAIL: .*released twice", out, re.M)
    assert code == 1


def test_ctrl_c_stops_everything_the_recovery_demo_started(tmp_path: Path) -> None:
    mark, folder = uuid.uuid4().hex, tmp_path / "interrupted"
    env = {**os.environ, MARK: mark, "PYSPARK_PYTHON": sys.executable}
    env.pop("TXSTREAM_BOOTSTRAP_SERVERS", None)  # its own broker, stopped with the rest
    proc = subprocess.Popen(
        [sys.executable, "-m", "txstream.streaming.cli", "demo", "--recovery",
         "--checkpoint-dir", str(folder), "--kill-after", "60"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "coordinator running:" in line:
                break
        # the demo, tansu, the coordinator's tree (its JVM, pyspark's daemon and workers)
        assert len(_marked(mark)) >= 4, "".join(seen)
        time.sleep(2)  # the traffic runs
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen) + rest
    assert "interrupted: stopping everything the demo started" in out
    assert f"its folder stays: {folder}" in out
    wait_until(lambda: not _marked(mark), timeout_s=10)
    assert (folder / "checkpoint" / "commits").is_dir()


@pytest.mark.cluster  # its own standalone cluster: in the cluster tests' group, not beside them
@pytest.mark.timeout(DEMO_LIMIT_S + 180)
def test_the_recovery_demo_on_a_standalone_cluster_kills_an_executor(
    kafka: KafkaSettings, tmp_path: Path, record_property: Any
) -> None:
    """``--cluster``: a master and a worker of pyspark's distribution, the coordinator
    spark-submitted to them; the executor SIGKILLed; lost 0, doubled 0, and the cluster
    stopped with the rest. Only the executor: each coordinator start costs minutes on a loaded
    machine, and the driver's SIGKILL is the local demo's test above (on a cluster:
    tests/system/test_cluster_restart.py). The default faults on a cluster, executor then driver,
    took 151 s on an idle machine (``txstream demo --recovery --cluster``)."""
    mark, folder = uuid.uuid4().hex, tmp_path / "cluster-demo"
    env = {**os.environ, MARK: mark, "PYSPARK_PYTHON": sys.executable}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "txstream.streaming.cli", "demo", "--recovery", "--cluster",
         "--faults", "executor", *SMALL, *_own_topics(kafka, folder)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=DEMO_LIMIT_S + 120)
    out, took = proc.stdout, time.monotonic() - started
    print(out)
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"cluster up at spark://127\.0\.0\.1:\d+; the coordinator is "
                     r"spark-submitted to it", out)
    assert "*** EXECUTOR KILLED" in out
    killed = re.search(r"executor killed at \S+ \(SIGKILL, pids [\d, ]+\): a new one after "
                       r"[\d.]+ s(; the coordinator failed its batch and was restarted \d+ "
                       r"times?)?; caught up [\d.]+ s after", out)
    assert killed, out[-4000:]
    assert re.search(r"released (\d+) of \1 committed: lost 0, doubled 0", out)
    assert "PASS: lost 0, doubled 0, pending 0" in out
    assert re.search(r"the coordinator is spark-submitted", out)
    assert (folder / "cluster" / "master.log").is_file()  # the cluster's logs stay with it
    wait_until(lambda: not _marked(mark), timeout_s=20)  # master, worker, executors: stopped
    record_property("report", f"recovery demo on a standalone cluster: {took:.0f} s; "
                              f"{killed.group(0)}")
