"""One coordinator under test: its session, its query and the log of its micro-batches."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from bench.batches import Batch, BatchLog
from bench.procmem import live_heap_mb, spark_jvm_pid, tree_cpu_s, tree_rss_mb
from txstream.errors import TxStreamError
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator, session_for

__all__ = ["Harness", "BenchFailed", "logged_session"]

T = TypeVar("T")

_LOGS: dict[int, BatchLog] = {}


class BenchFailed(TxStreamError):
    """A phase could not finish (the coordinator failed, or a wait timed out)."""


def logged_session(config: RunConfig) -> tuple[Any, BatchLog]:
    """The session (started once per process) with a batch log listening to every query.

    ``config.driver_memory`` only takes effect when this call starts the JVM.
    """
    spark = session_for(config, app_name="txstream-bench")
    # A session outlives one query: the store provider and partitions are read when a query
    # starts with a new checkpoint, so set them for this one.
    spark.conf.set("spark.sql.shuffle.partitions", str(config.shuffle_partitions))
    provider = {
        "default": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    }[config.state_store]
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    log = _LOGS.get(id(spark))
    if log is None:
        log = _LOGS[id(spark)] = BatchLog()
        spark.streams.addListener(log)
    return spark, log


class Harness:
    """Start a coordinator of ``config`` and wait on what its batches report.

    ``make`` builds the coordinator: txstream's own by default, or a subclass that starts
    another query in the same life cycle (:mod:`bench.ceiling`).
    """

    def __init__(self, config: RunConfig,
                 make: Callable[[RunConfig], Coordinator] = Coordinator) -> None:
        self.config = config
        self.make = make
        self.coordinator: Any = None
        self.log: BatchLog | None = None
        self.started_at = 0.0

    def start(self) -> Harness:
        _, self.log = logged_session(self.config)
        self.coordinator = self.make(self.config).start()
        self.started_at = time.monotonic()
        return self

    def stop(self) -> None:
        if self.coordinator is not None:
            self.coordinator.stop()
            self.coordinator = None

    @property
    def batches(self) -> list[Batch]:
        assert self.log is not None
        return self.log.of(self.config.query_name)

    def total(self, field: str) -> int:
        return sum(getattr(b, field) for b in self.batches)

    def rss_mb(self) -> float:
        pid = spark_jvm_pid()
        return tree_rss_mb(pid) if pid else 0.0

    def live_heap_mb(self) -> float | None:
        pid = spark_jvm_pid()
        return live_heap_mb(pid) if pid else None

    def cpu_s(self) -> float:
        """CPU seconds used by the JVM and its Python workers so far."""
        pid = spark_jvm_pid()
        return tree_cpu_s(pid) if pid else 0.0

    def wait(self, predicate: Callable[[], T], timeout_s: float, what: str) -> T:
        """Poll ``predicate`` until truthy; raise BenchFailed on timeout or a failed query."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            failure = self.coordinator.failure() if self.coordinator else "not running"
            if failure:
                raise BenchFailed(f"coordinator failed while waiting for {what}: {failure}")
            if time.monotonic() > deadline:
                raise BenchFailed(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(0.1)
