"""The SparkSession txstream runs in, with the settings measured to matter on a small machine."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["build_session", "LOG4J_CONFIG"]

LOG4J_CONFIG = Path(__file__).with_name("resources") / "log4j2.properties"


def _env_settings() -> dict[str, str]:
    """``TXSTREAM_SPARK_CONF="k=v k=v"``: any other Spark settings (an event log, memory...)."""
    pairs = os.environ.get("TXSTREAM_SPARK_CONF", "").split()
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise ValueError(f"TXSTREAM_SPARK_CONF wants key=value pairs, got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def build_session(
    master: str | None = None,
    shuffle_partitions: int = 2,
    state_store: str = "default",
    app_name: str = "txstream",
    extra: dict[str, Any] | None = None,
) -> Any:
    """A SparkSession (``getOrCreate``): quiet logs, few shuffle partitions, worker reuse on.

    ``shuffle_partitions`` and ``state_store`` are fixed in a query's checkpoint on its first
    run; Spark's default of 200 partitions made a batch 18x slower than 2 here.

    ``master``: None is ``local[2]`` on loopback, unless ``spark-submit`` started this driver
    (it sets ``PYSPARK_GATEWAY_PORT``): then its ``--master`` and network settings stand, since
    a master set here would override them and executors cannot reach a loopback driver.
    """
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    # Driver-side Python (the data source reader) must start this interpreter, not the system one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if not submitted:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}"
    builder = (
        SparkSession.builder.appName(app_name)
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .config("spark.python.worker.reuse", "true")
        # Spark's default; unix sockets measured no better here (BENCHMARKS.md, Defaults).
        .config("spark.python.unix.domain.socket.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Arrow batches of 2,000 rows, not 10,000: the sink starts on the operator's output
        # sooner, so the two overlap within a task (BENCHMARKS.md, Defaults).
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "2000")
        .config("spark.sql.streaming.stateStore.maintenanceInterval", "30s")
        # The default (FileContext-based) manager has Hadoop's local file system fork `chmod`
        # and `readlink` for every checkpoint and state file it writes (pyspark ships no native
        # Hadoop library): ~28 processes a second here, ~70 ms of every micro-batch. The
        # FileSystem-based one forks a few; it works on any Hadoop file system.
        .config("spark.sql.streaming.checkpointFileManagerClass",
                "org.apache.spark.sql.execution.streaming.checkpointing."
                "FileSystemBasedCheckpointFileManager")
    )
    if master is not None or not submitted:
        builder = builder.master(master or "local[2]")
    if not submitted:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1")
    if state_store == "rocksdb":
        builder = builder.config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
    elif state_store != "default":
        raise ValueError("state_store must be 'default' or 'rocksdb'")
    for key, value in {**_env_settings(), **(extra or {})}.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
