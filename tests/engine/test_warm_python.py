"""The warm process: Spark's Python processes on a local driver are forks of one process that
imported everything once (docs/decisions/0035-warm-python.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from txstream.streaming.engine import warm_python
from txstream.streaming.engine.warm_fork import WARM_PYTHON_ENV
from txstream.streaming.engine.warm_python import (
    WARM_PYTHON_OFF_ENV,
    cold_python,
    start_warm_python,
)

_NAMES = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", WARM_PYTHON_ENV, "TXSTREAM_WARM_LAUNCHER",
          WARM_PYTHON_OFF_ENV)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """This process's Spark Python settings, put back afterwards (a session fixture's JVM
    already has its own)."""
    for name in _NAMES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    for name in _NAMES:
        os.environ.pop(name, None)


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("PPid:"))


def test_a_local_sessions_python_workers_are_forks_of_the_warm_process(spark: Any) -> None:
    def pids(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd

        for _ in batches:
            yield pd.DataFrame({"worker": [os.getpid()], "daemon": [os.getppid()]})

    row = spark.range(1).mapInPandas(pids, "worker long, daemon long").collect()[0]
    warm = warm_python._started["proc"]
    assert warm.poll() is None
    assert _parent(row["daemon"]) == warm.pid  # the daemon was forked, not started


def _run(python: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *args], capture_output=True, text=True, timeout=60)


def test_the_launcher_runs_a_pyspark_module_as_python_would(environment: Any) -> None:
    launcher = start_warm_python()
    assert launcher is not None
    assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == launcher
    for args in (["-m", "pyspark.find_spark_home"], ["-m", "pyspark.no_such_module"],
                 ["-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "x"]):
        warm, cold = _run(launcher, *args), _run(sys.executable, *args)
        assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout), args
    assert _run(launcher, "-m", "pyspark.no_such_module").returncode == 1


def test_an_inherited_launcher_runs_python_once_its_warm_process_is_gone(
        environment: Any, tmp_path: Any) -> None:
    """A spark-submit started by a driver keeps that driver's launcher in its JVM's
    environment: the driver and its warm process may end first."""
    launcher = start_warm_python()
    assert launcher is not None
    args = ("-m", "pyspark.find_spark_home")
    cold = _run(sys.executable, *args)
    gone = tmp_path / "forks.sock"
    environment.setenv(WARM_PYTHON_ENV, str(gone))  # no socket there
    assert _run(launcher, *args).stdout == cold.stdout
    import socket

    with socket.socket(socket.AF_UNIX) as stale:  # a socket no process listens on
        stale.bind(str(gone))
        assert _run(launcher, *args).stdout == cold.stdout


def test_a_launcher_that_may_not_run_is_not_given_to_spark(tmp_path: Any) -> None:
    from txstream.streaming.engine.warm_python import _launcher

    made = _launcher(tmp_path)
    assert made is not None and os.access(made, os.X_OK)
    os.chmod(made, 0o644)  # as in a cache mounted noexec
    assert _launcher(tmp_path) is None


def test_turned_off_or_with_the_users_own_python_nothing_is_started(environment: Any) -> None:
    environment.setenv(WARM_PYTHON_OFF_ENV, "1")
    assert start_warm_python() is None
    assert "PYSPARK_PYTHON" not in os.environ and WARM_PYTHON_ENV not in os.environ
    environment.delenv(WARM_PYTHON_OFF_ENV)
    environment.setenv("PYSPARK_PYTHON", "/opt/python3.12/bin/python")
    assert start_warm_python() is None
    assert os.environ["PYSPARK_PYTHON"] == "/opt/python3.12/bin/python"


def test_a_launcher_inherited_from_a_parent_process_is_not_used(environment: Any) -> None:
    """A coordinator started by a process that runs Spark inherits its launcher, whose warm
    process ends with that parent."""
    for name in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "TXSTREAM_WARM_LAUNCHER"):
        environment.setenv(name, "/tmp/txstream-warm-gone/python")
    environment.setenv(WARM_PYTHON_ENV, "/tmp/txstream-warm-gone/forks.sock")
    cold_python()
    assert os.environ["PYSPARK_PYTHON"] == os.environ["PYSPARK_DRIVER_PYTHON"] == sys.executable
    assert WARM_PYTHON_ENV not in os.environ and "TXSTREAM_WARM_LAUNCHER" not in os.environ
