"""A Spark standalone cluster from pyspark's own distribution, as the product starts one
(:mod:`txstream.streaming.cli.spark_standalone`, which ``txstream demo --recovery --cluster``
uses), its ports from the test worker's range; the coordinator submitted to it."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.support.ports import reserve_port
from tests.support.process_helpers import CoordinatorProcess
from txstream.streaming.cli import spark_standalone
from txstream.streaming.cli.spark_standalone import executor_pids, spark_home, submit_command

__all__ = ["SPARK_HOME", "StandaloneCluster", "submit_command", "executor_pids", "ui_json"]

SPARK_HOME = spark_home()


def _json(url: str, timeout_s: float = 3.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout_s) as answer:
        return json.loads(answer.read())


def ui_json(port: int, path: str) -> Any:
    """An answer of the driver's Spark UI REST API (``/api/v1/...``): a driver whose cores
    the whole suite shares answers in seconds, not milliseconds."""
    return _json(f"http://127.0.0.1:{port}/api/v1/{path}", timeout_s=30.0)


class StandaloneCluster(spark_standalone.StandaloneCluster):
    """The product's standalone cluster (2 cores, 3 GB), its ports from this worker's range."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, port=reserve_port)


def started_coordinator(process: CoordinatorProcess, timeout_s: float = 180.0) -> float:
    """Wait for the coordinator's "coordinator running" line; the seconds it took."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if "coordinator running" in process.output():
            return time.monotonic() - process.started_at
        if not process.running:
            raise AssertionError(f"the coordinator exited:\n{process.output()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no coordinator within {timeout_s:.0f} s:\n{process.output()[-3000:]}")
