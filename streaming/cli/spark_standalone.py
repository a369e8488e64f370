"""A Spark standalone cluster from pyspark's own distribution: a master and a worker on loopback,
and ``txstream run`` submitted to it with spark-submit, as a user deploys it.

``txstream demo --recovery --cluster`` runs its coordinator this way and kills an executor as
well as the driver; the cluster tests start theirs with the same class.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from txstream.broker import free_port
from txstream.errors import TxStreamError
from txstream.streaming.cli.coordinator_process import descendants

__all__ = ["spark_home", "StandaloneCluster", "ClusterFailed", "submit_command",
           "executor_pids"]


class ClusterFailed(TxStreamError):
    """The standalone cluster did not come up."""


def spark_home() -> Path:
    """pyspark's own distribution: its ``bin/spark-submit`` and ``bin/spark-class``."""
    import pyspark  # here, not above: the CLI also runs where only the client is installed

    return Path(pyspark.__file__).parent


def _application() -> str:
    """The file spark-submit runs: the txstream command's entry module."""
    spec = importlib.util.find_spec("txstream.streaming.cli.__main__")
    assert spec is not None and spec.origin is not None
    return spec.origin


def _json(url: str, timeout_s: float = 3.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return json.loads(answer.read())


class StandaloneCluster:
    """``spark-class ...Master`` and ``...Worker`` (``cores``, ``memory``), each in its own
    process group, their logs and the worker's directory under ``root``; ``port`` picks the
    ports (the tests' come from ranges of their own)."""

    def __init__(self, root: Path, port: Callable[[], int] = free_port, cores: int = 2,
                 memory: str = "3g") -> None:
        self.root = root
        self.port, self.ui_port, self.worker_ui_port = (port() for _ in range(3))
        self.cores, self.memory = cores, memory
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, args: Sequence[str]) -> None:
        home = spark_home()
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_NO_DAEMONIZE": "1"}
        with open(self.root / f"{name}.log", "ab") as log:
            self.procs.append(subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args], env=env, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True))

    def start(self, timeout_s: float = 90.0) -> StandaloneCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        self._spawn("worker", ["org.apache.spark.deploy.worker.Worker", self.url, "--cores",
                               str(self.cores), "--memory", self.memory, "--host", "127.0.0.1",
                               "--webui-port", str(self.worker_ui_port), "--work-dir",
                               str(self.root / "work")])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if _json(f"http://127.0.0.1:{self.ui_port}/json/").get("aliveworkers") == 1:
                    return self
            except (OSError, ValueError):  # not listening yet, or an empty answer while it starts
                pass
            time.sleep(0.5)
        self.stop()
        raise ClusterFailed(f"no live worker within {timeout_s:.0f} s; see {self.root}")

    def applications(self) -> list[dict[str, Any]]:
        """The master's view of the running applications."""
        return list(_json(f"http://127.0.0.1:{self.ui_port}/json/").get("activeapps", []))

    def stop(self) -> None:
        for proc in self.procs:
            for pid in [proc.pid, *descendants(proc.pid)]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=30)
        self.procs = []


def submit_command(cluster: StandaloneCluster, *conf: str) -> list[str]:
    """``spark-submit --master <cluster> [--conf ...] <txstream> run``, the executors on this
    interpreter (the venv txstream is installed in)."""
    confs = [c for pair in (("spark.pyspark.python", sys.executable),
                            ("spark.executor.memory", "1g"), *(x.split("=", 1) for x in conf))
             for c in ("--conf", f"{pair[0]}={pair[1]}")]
    return [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url, *confs,
            _application(), "run"]


def executor_pids(cluster: StandaloneCluster) -> list[int]:
    """The executor JVMs ``cluster``'s worker runs (``CoarseGrainedExecutorBackend``, working
    in its work directory): never another cluster's on the same machine."""
    out = []
    work = str(cluster.root / "work")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if any(b"CoarseGrainedExecutorBackend" in a for a in argv) and cwd.startswith(work):
            out.append(int(entry))
    return out
