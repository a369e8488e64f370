"""``txstream demo`` in a subprocess, as a newcomer runs it: the summary RocketMQ's example
promises, and nothing left running afterwards (tansu, the Spark JVM, Python workers), also
after Ctrl-C.

Every process the demo starts inherits its environment, so a marker variable finds them all,
even the broker, which runs in a session of its own.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.kafka_helpers import wait_until
from tests.support.process_helpers import marked_processes

pytestmark = pytest.mark.spark

MARK = "TXSTREAM_TEST_DEMO_MARK"


def _marked(mark: str) -> list[str]:
    return marked_processes(MARK, mark)


def _demo(*args: str, mark: str) -> subprocess.Popen[str]:
    env = {**os.environ, MARK: mark, "PYSPARK_PYTHON": sys.executable}
    env.pop("TXSTREAM_BOOTSTRAP_SERVERS", None)
    return subprocess.Popen([sys.executable, "-m", "txstream.streaming.cli", "demo", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_demo_runs_the_example_and_leaves_nothing_behind(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    started = time.monotonic()
    proc = _demo("--checkpoint-dir", str(tmp_path / "cp"), "--timeout", "150", mark=mark)
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    took = time.monotonic() - started
    print(out)
    print(f"demo wall time: {took:.1f}s")
    assert proc.returncode == 0
    assert re.search(r"released\s+3\s+Hello RocketMQ 1, 4, 7$", out, re.M)
    assert re.search(r"rolled back\s+3\s+Hello RocketMQ 2, 5, 8$", out, re.M)
    assert re.search(r"discarded\s+4\s+Hello RocketMQ 0, 3, 6, 9$", out, re.M)
    assert re.search(r"still pending\s+0\s+-$", out, re.M)
    assert re.search(r"consumer received\s+3\s+Hello RocketMQ 1, 4, 7$", out, re.M)
    consumed = re.findall(r"consumer\s+Consumer===\s+MessageBody: (.*)$", out, re.M)
    assert sorted(consumed) == ["Hello RocketMQ 1", "Hello RocketMQ 4", "Hello RocketMQ 7"]
    sent = re.findall(r"producer\s+.*localTransactionState=UNKNOW.*\| (Hello RocketMQ \d)$",
                      out, re.M)
    assert sorted(sent) == [f"Hello RocketMQ {i}" for i in range(10)]
    progress = re.findall(r"progress\s+(.*)$", out, re.M)
    assert progress and progress[0].startswith("half messages sent")
    assert "checks asked" in progress[-1] and "pending 0" in progress[-1]
    assert took < 120
    wait_until(lambda: not _marked(mark), timeout_s=5)


def _lines(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_ctrl_c_stops_everything_the_demo_started() -> None:
    mark = uuid.uuid4().hex
    proc = _demo("--timeout", "150", mark=mark)
    seen: list[str] = []
    try:
        lines = _lines(proc)
        deadline = time.monotonic() + 150
        while not any("coordinator running" in s for s in seen):
            assert time.monotonic() < deadline, "".join(seen)
            assert proc.poll() is None, "".join(seen)
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                continue
        assert len(_marked(mark)) >= 3  # the demo, tansu and the JVM at least
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        time.sleep(0.5)  # let the pump thread drain the pipe
        while not lines.empty():
            seen.append(lines.get())
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen)
    assert "interrupted: stopping everything the demo started" in out
    wait_until(lambda: not _marked(mark), timeout_s=5)
    # its own checkpoint (a new checkpoints/demo-*) is removed too
    checkpoint = re.search(r"checkpoint (\S+);", out)
    assert checkpoint and "demo-" in checkpoint.group(1)
    assert not Path(checkpoint.group(1)).exists()
