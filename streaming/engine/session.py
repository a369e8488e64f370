"""The SparkSession txstream runs in, with the settings measured to matter on a small machine."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from streaming.engine.local_fs import NO_FORK_FS_CLASS, no_fork_fs_jar

__all__ = ["build_session", "stop_spark", "with_no_fork_fs", "check_driver_memory", "gc_options",
           "LOG4J_CONFIG", "JIT_OPTIONS", "ROCKSDB_SETTINGS", "DEFAULT_DRIVER_MEMORY",
           "MIN_G1_REGION_MIB"]

LOG4J_CONFIG = Path(__file__).with_name("resources") / "log4j2.properties"

# The JVM's just-in-time compilers. "c1": the quick compiler only. Every micro-batch runs tens of
# thousands of Spark methods (analysis, planning, scheduling, state store), and with the JVM's
# default tiered compilation the optimizing compiler (C2) kept compiling them for minutes after
# the start, 0.2-0.5 of this 2-core machine's cores; with C1 only the JVM settles in seconds and
# the coordinator released 24-34 % more per second (docs/decisions/0007-quick-jit.md). "tiered": the
# JVM's default, for machines with cores to spare and jobs that run for days.
JIT_OPTIONS = {"c1": "-XX:TieredStopAtLevel=1", "tiered": ""}
# `--state-store rocksdb`. With changelog checkpointing a batch writes the changes it made
# instead of uploading a new snapshot of the store's files (Spark's and Databricks' advice);
# here it was a few percent faster per batch (docs/decisions/0013-rocksdb-changelog.md). Spark
# reads back checkpoints written either way.
ROCKSDB_SETTINGS = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
}

# The driver's heap, where a local coordinator's state store lives. Spark's own default is
# 1g: with 1M pending transactions (200-byte bodies) ~600 MB of it stayed live after each GC,
# and the store's timeout scan copies every state key's value each batch, so G1 ran mixed
# collections back to back; 2g held 1M with room to spare
# (docs/decisions/0008-driver-heap-and-g1-regions.md).
DEFAULT_DRIVER_MEMORY = "2g"
# G1 gives an object of more than half a region regions of its own ("humongous"), allocated
# outside the young generation. Spark's timeout scan copies every state key's value on every
# micro-batch, and a key holds one second of half messages: ~1-2 MB at a few thousand a
# second. With a 2g heap's 1 MB regions every copy was humongous (with 1M held, ~1.2 GB of
# humongous garbage between two collections), the held values themselves took about twice
# their size in regions, and a micro-batch took ~1.8x as long as with 10k held. With 4 MB
# regions the copies are ordinary young objects and it took as long
# (docs/decisions/0008-driver-heap-and-g1-regions.md).
MIN_G1_REGION_MIB = 4
_MEMORY = re.compile(r"^(\d+)(k|kb|m|mb|g|gb|t|tb)?$", re.IGNORECASE)
_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}

_PYSPARK_PANDAS_WARNING = "ignore:The behavior of DataFrame concatenation:FutureWarning"


def _env_settings() -> dict[str, str]:
    """``TXSTREAM_SPARK_CONF="k=v k=v"``: any other Spark settings (an event log, memory...)."""
    pairs = os.environ.get("TXSTREAM_SPARK_CONF", "").split()
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise ValueError(f"TXSTREAM_SPARK_CONF wants key=value pairs, got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def with_no_fork_fs(settings: dict[str, Any], jar: Path) -> dict[str, Any]:
    """``settings`` plus the no-fork local file system (streaming/local_fs.py): the jar joins
    any class path given, and a ``fs.file.impl`` given stays."""
    given = str(settings.get("spark.driver.extraClassPath") or "")
    return {
        "spark.hadoop.fs.file.impl": NO_FORK_FS_CLASS,
        **settings,
        "spark.driver.extraClassPath": os.pathsep.join(p for p in (str(jar), given) if p),
    }


def _heap_mib(text: str) -> float:
    match = _MEMORY.match(text.strip())
    if not match:
        raise ValueError(f"driver memory must look like 2g or 1536m, not {text!r}")
    number, unit = match.groups()
    return int(number) * _MIB[(unit or "m")[0].lower()]


def check_driver_memory(text: str) -> str:
    """``text`` if Spark takes it as a driver heap (``2g``, ``1536m``; a bare number is MiB),
    else ValueError. Spark refuses to start with less than ~450 MiB of heap."""
    if _heap_mib(text) < 512:
        raise ValueError(f"driver memory must be at least 512m (Spark needs ~450m), not {text!r}")
    return text.strip()


def gc_options(driver_memory: str) -> str:
    """The JVM's G1 regions at least :data:`MIN_G1_REGION_MIB` large. G1 sizes them itself at
    a 2048th of the heap (1 MB up to a 2g heap), so only smaller heaps get the option."""
    if _heap_mib(driver_memory) / 2048 >= MIN_G1_REGION_MIB:
        return ""
    return f"-XX:G1HeapRegionSize={MIN_G1_REGION_MIB}m"


def _tuned_settings(shuffle_partitions: int, state_store: str, jit: str,
                    driver_memory: str) -> dict[str, str]:
    """The Spark settings txstream runs with (docs/decisions/0012-spark-settings.md)."""
    if jit not in JIT_OPTIONS:
        raise ValueError(f"jit must be one of {sorted(JIT_OPTIONS)}, got {jit!r}")
    if state_store not in ("default", "rocksdb"):
        raise ValueError("state_store must be 'default' or 'rocksdb'")
    check_driver_memory(driver_memory)
    java_opts = " ".join(o for o in (f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}",
                                     JIT_OPTIONS[jit], gc_options(driver_memory)) if o)
    return {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.python.worker.reuse": "true",
        # Spark's default; unix sockets measured no better here.
        "spark.python.unix.domain.socket.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Arrow batches of 2,000 rows, not 10,000: the sink starts on the operator's output
        # sooner, so the two overlap within a task.
        "spark.sql.execution.arrow.maxRecordsPerBatch": "2000",
        "spark.sql.streaming.stateStore.maintenanceInterval": "30s",
        # With processing-time timeouts Spark runs batches back to back to look for due ones,
        # input or not. Off, a batch runs when the source's offset moves, and the coordinator's
        # source moves it when a timer is due (docs/decisions/0003-timer-schedule.md).
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        # How long Spark waits before asking the source again when it had nothing: each ask is
        # a high-watermark fetch (10 ms: 0.26 cores idle; 50 ms: 0.08).
        "spark.sql.streaming.pollingDelay": "50ms",
        # The default (FileContext-based) manager has Hadoop's local file system fork `chmod`
        # and `readlink` for every file it writes; the FileSystem-based one works on any Hadoop
        # file system (docs/decisions/0006-no-fork-local-fs.md).
        "spark.sql.streaming.checkpointFileManagerClass":
            "org.apache.spark.sql.execution.streaming.checkpointing."
            "FileSystemBasedCheckpointFileManager",
        **(ROCKSDB_SETTINGS if state_store == "rocksdb" else {}),
    }


def _prepare_environment(submitted: bool) -> None:
    # Driver-side Python (the data source reader) must start this interpreter, not the system one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # pandas warns from inside pyspark's applyInPandasWithState serializer (its concat of empty
    # frames) in every Python worker, every micro-batch: pyspark's code, not ours, and a long
    # job's log would be mostly that. The workers inherit this filter.
    os.environ.setdefault("PYTHONWARNINGS", _PYSPARK_PANDAS_WARNING)
    if not submitted:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def build_session(
    master: str | None = None,
    shuffle_partitions: int = 2,
    state_store: str = "default",
    app_name: str = "txstream",
    extra: dict[str, Any] | None = None,
    jit: str = "c1",
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
) -> Any:
    """A SparkSession (``getOrCreate``): quiet logs, few shuffle partitions, worker reuse on.

    ``shuffle_partitions`` and ``state_store`` are fixed in a query's checkpoint on its first
    run; Spark's default of 200 partitions made a batch 18x slower than 2 here.

    ``jit``: a key of :data:`JIT_OPTIONS`, and ``driver_memory`` (:data:`DEFAULT_DRIVER_MEMORY`):
    like the two above, they only take effect when this call starts the JVM; under
    ``spark-submit`` its ``--driver-memory`` stands.

    ``master``: None is ``local[2]`` on loopback, unless ``spark-submit`` started this driver
    (it sets ``PYSPARK_GATEWAY_PORT``): then its ``--master`` and network settings stand, since
    a master set here would override them and executors cannot reach a loopback driver.
    """
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ
    _prepare_environment(submitted)
    from pyspark.sql import SparkSession

    settings: dict[str, Any] = _tuned_settings(shuffle_partitions, state_store, jit,
                                               driver_memory)
    if not submitted:
        settings.update({"spark.driver.bindAddress": "127.0.0.1",
                         "spark.driver.memory": driver_memory})
    settings.update({**_env_settings(), **(extra or {})})
    builder = SparkSession.builder.appName(app_name)
    if master is not None or not submitted:
        builder = builder.master(master or "local[2]")
    if not submitted and (master or "local").startswith("local"):
        # Only where this call starts the JVM and every executor is in it: the jar is local.
        jar = no_fork_fs_jar()
        if jar is not None:
            settings = with_no_fork_fs(settings, jar)
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop_spark(spark: Any) -> None:
    """Stop the SparkSession and the JVM behind it, and wait until that process is gone.

    ``spark.stop()`` leaves the JVM running until this Python process exits; a command that
    promises to leave nothing behind ends it here: closing its stdin makes the gateway exit.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    proc = getattr(gateway, "proc", None)
    if gateway is not None:
        try:
            gateway.shutdown()
        except Exception:  # already closed: the JVM is on its way out anyway
            pass
    SparkContext._gateway = None
    SparkContext._jvm = None
    if proc is None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=15)
    except Exception:
        proc.kill()
        proc.wait(timeout=5)
