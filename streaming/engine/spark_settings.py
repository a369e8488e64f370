"""The Spark settings txstream runs with, and how they meet the user's own.

txstream's values are defaults: a key the user set (``spark-submit --conf``,
``spark-defaults.conf``, ``txstream run --conf``) keeps the user's value. A few options are
lists that txstream extends rather than replaces: the JVM options (txstream adds the ones the
user's value does not name), the driver's class path and the Python warning filters. Nothing
here starts a JVM. Why each value: docs/decisions/0012-spark-settings.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from txstream.streaming.engine.local_fs import NO_FORK_FS_CLASS

__all__ = ["tuned_settings", "merge_settings", "check_settings", "defaults_file_settings",
           "parse_properties", "with_no_fork_fs", "check_driver_memory", "gc_options",
           "java_options", "is_local_master", "LOG4J_CONFIG", "JIT_OPTIONS", "ROCKSDB_SETTINGS",
           "DEFAULT_DRIVER_MEMORY", "MIN_G1_REGION_MIB", "PANDAS_WARNING_FILTER"]

LOG4J_CONFIG = Path(__file__).with_name("resources") / "log4j2.properties"

# The JVM's just-in-time compilers. "c1": the quick compiler only. Every micro-batch runs tens of
# thousands of Spark methods (analysis, planning, scheduling, state store), and with the JVM's
# default tiered compilation the optimizing compiler (C2) kept compiling them for minutes after
# the start, taking cores the coordinator needed; with C1 only the JVM settles in seconds
# (figures: docs/decisions/0007-quick-jit.md). "tiered": the JVM's default, for machines with
# cores to spare and jobs that run for days.
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
# micro-batch, and a key holds one second of transactions. With a 2g heap's 1 MB regions every
# copy was humongous, and a micro-batch slowed as more transactions were held; with 4 MB regions
# the copies are ordinary young objects
# (figures: docs/decisions/0008-driver-heap-and-g1-regions.md).
MIN_G1_REGION_MIB = 4
_MEMORY = re.compile(r"^(\d+)(k|kb|m|mb|g|gb|t|tb)?$", re.IGNORECASE)
_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}

# pandas warns from inside pyspark's applyInPandasWithState serializer (its concat of empty
# frames) in every Python worker, every micro-batch: pyspark's code, not ours, and a long job's
# log would be mostly that (588 lines in 10 minutes on one executor). The driver's and the
# executors' Python workers get this filter.
PANDAS_WARNING_FILTER = "ignore:The behavior of DataFrame concatenation:FutureWarning"


# Options that hold lists: the user's value is extended with txstream's, by this separator.
_LISTS = {
    "spark.driver.extraJavaOptions": " ",
    "spark.executor.extraJavaOptions": " ",
    "spark.driver.extraClassPath": os.pathsep,
    "spark.executorEnv.PYTHONWARNINGS": ",",
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


def java_options(jit: str, heap: str, log4j: bool) -> str:
    """The JVM options txstream gives a driver or executor JVM with ``heap``."""
    if jit not in JIT_OPTIONS:
        raise ValueError(f"jit must be one of {sorted(JIT_OPTIONS)}, got {jit!r}")
    parts = [f"-Dlog4j2.configurationFile=file:{LOG4J_CONFIG}" if log4j else "",
             JIT_OPTIONS[jit], gc_options(heap)]
    return " ".join(p for p in parts if p)


def is_local_master(master: str | None) -> bool:
    return master is None or master.startswith("local")


def tuned_settings(*, shuffle_partitions: int, state_store: str, jit: str, driver_memory: str,
                   executor_memory: str, local: bool, submitted: bool) -> dict[str, str]:
    """txstream's values. ``local``: every executor is in the driver's JVM; ``submitted``:
    spark-submit started the driver's JVM, so its options are set already."""
    if state_store not in ("default", "rocksdb"):
        raise ValueError("state_store must be 'default' or 'rocksdb'")
    check_driver_memory(driver_memory)
    settings = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_options(jit, driver_memory, log4j=not submitted),
        "spark.executor.extraJavaOptions": java_options(jit, executor_memory, log4j=False),
        "spark.executorEnv.PYTHONWARNINGS": PANDAS_WARNING_FILTER,
        "spark.python.worker.reuse": "true",
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
        # A stage run again (its shuffle input lost with an executor) numbers its tasks'
        # attempts from 0, so a sink task could not tell it may be writing what a task of the
        # failed attempt wrote: the batch fails instead, and runs again from the checkpoint,
        # where every task checks (docs/decisions/0005-replay-check.md; check_settings).
        "spark.stage.maxConsecutiveAttempts": "1",
        **(ROCKSDB_SETTINGS if state_store == "rocksdb" else {}),
    }
    if not submitted:
        settings["spark.driver.memory"] = driver_memory
    if local and not submitted:
        settings["spark.driver.bindAddress"] = "127.0.0.1"
    return settings


def check_settings(settings: Mapping[str, str]) -> None:
    """Refuse what would have the sink write records twice: speculative tasks (two attempts
    of one task writing at once, neither waiting for the other's records) and stages run
    again within a batch (their tasks cannot tell they may be writing a batch again)."""
    from txstream.errors import ConfigError

    if settings.get("spark.speculation", "false").strip().lower() == "true":
        raise ConfigError("spark.speculation=true would have two attempts of one sink task "
                          "write the same records at once: txstream needs it false")
    attempts = settings.get("spark.stage.maxConsecutiveAttempts", "1").strip()
    if attempts != "1":
        raise ConfigError(f"spark.stage.maxConsecutiveAttempts={attempts}: a stage run again "
                          "within a micro-batch would have its sink tasks write records its "
                          "failed attempt wrote; txstream needs 1 (the batch then runs again "
                          "from the checkpoint, where nothing is written twice)")


def _option_name(option: str) -> str:
    """``-XX:+UseG1GC`` -> ``-XX:UseG1GC``, ``-Dk=v`` -> ``-Dk``, ``-Xmx1g`` -> ``-Xmx``."""
    if option.startswith("-XX:"):
        return "-XX:" + option[4:].lstrip("+-").split("=", 1)[0]
    if option.startswith("-D"):
        return option.split("=", 1)[0]
    match = re.match(r"-X[a-z]+", option)
    return match.group(0) if match else option


def _extend(given: str, ours: str, separator: str) -> str:
    if separator == " ":
        named = {_option_name(o) for o in given.split()}
        extra = [o for o in ours.split() if _option_name(o) not in named]
    else:
        extra = [p for p in ours.split(separator) if p and p not in given.split(separator)]
    return separator.join(p for p in (given, *extra) if p)


def merge_settings(ours: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """Every setting ``given`` by the user as given, and txstream's where the user gave none;
    list options are extended: the user's entries first, then the ones of txstream's the
    user's do not name."""
    merged = dict(given)
    for key, value in ours.items():
        if key not in given:
            merged[key] = value
        elif key in _LISTS:
            merged[key] = _extend(given[key], value, _LISTS[key])
    return merged


def parse_properties(text: str) -> dict[str, str]:
    """``key=value``, ``key: value`` or ``key value`` lines, as Java properties files (and so
    ``spark-defaults.conf``) hold them; ``#`` and ``!`` start comments."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*(?:[=:]\s*|\s+)(.*)$", line)
        if match:
            out[match.group(1)] = match.group(2).strip()
        else:
            out[line] = ""
    return out


def defaults_file_settings(environ: Mapping[str, str], spark_home: Path) -> dict[str, str]:
    """``spark-defaults.conf``, from where spark-submit reads it: ``$SPARK_CONF_DIR``, else
    ``$SPARK_HOME/conf`` (the installed pyspark when SPARK_HOME is not set)."""
    conf_dir = Path(environ.get("SPARK_CONF_DIR") or Path(environ.get("SPARK_HOME") or spark_home)
                    / "conf")
    try:
        return parse_properties((conf_dir / "spark-defaults.conf").read_text())
    except OSError:
        return {}


def with_no_fork_fs(settings: Mapping[str, str], jar: Path) -> dict[str, str]:
    """``settings`` plus the no-fork local file system (streaming/engine/local_fs.py): the jar
    joins any class path given, and a ``fs.file.impl`` given stays."""
    return merge_settings({"spark.hadoop.fs.file.impl": NO_FORK_FS_CLASS,
                           "spark.driver.extraClassPath": str(jar)}, settings)
