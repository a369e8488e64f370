"""A class-data archive of the driver's JVM: Spark's classes loaded once, mapped at each start.

A local coordinator's JVM loads thousands of Spark's classes before its session exists, and
parses and verifies each one again at every start, restart and crash recovery. The JDK's
application class-data sharing (AppCDS, JDK 13+) keeps them in an archive that a later JVM
maps instead, and every start is seconds shorter (figures: docs/decisions/0033-class-archive.md).

The archive is made by a training run (``python -m txstream.streaming.engine.class_archive``,
which ``scripts/setup.sh`` runs once): a local session with ``-XX:ArchiveClassesAtExit`` that
runs a small stateful stream and exits, the archive written when its JVM ends. It is only good
for the class path it was made with, so it is named by a digest of that path's jars (where
they are, their sizes and times, as the JVM checks them) and of the JVM. A start finds it by
that name (:func:`archive_option`); without one, or with one the JVM refuses
(``-Xshare:auto``: another JVM build), it starts as before, silently.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txstream.class_data import sharing_options
from txstream.streaming.engine.local_fs import txstream_cache

__all__ = ["archive_path", "archive_option", "train", "CDS_FLAGS"]

# A user's own class-data sharing options win: txstream then adds none.
CDS_FLAGS = ("-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-Xshare")


def _java() -> str:
    """The java spark-submit starts: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(found) if found else ""


def _stamp(jar: Path) -> str:
    """What the JVM checks of a class-path entry before it maps an archive: its path, size
    and time. An archive of a checkout elsewhere, or of a venv installed again, is another
    archive: a cache copied to a new checkout never hands it one the JVM refuses."""
    try:
        found = jar.stat()
    except OSError:
        return str(jar)
    return f"{os.path.realpath(jar)} {found.st_size} {found.st_mtime_ns}"


def archive_path(settings: Mapping[str, str], cache_dir: Path | None = None) -> Path:
    """Where the archive for a driver started with ``settings`` is (made or not)."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    extra = [Path(p) for p in settings.get("spark.driver.extraClassPath", "").split(":") if p]
    key = "\n".join([pyspark.__version__, _java(), os.environ.get("SPARK_CONF_DIR", ""),
                     *map(_stamp, extra),
                     *map(_stamp, sorted(jars.glob("*.jar")) if jars.is_dir() else [])])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return (cache_dir or txstream_cache()) / f"spark-driver-{digest}.jsa"


def archive_option(settings: Mapping[str, str], cache_dir: Path | None = None) -> str:
    """The driver's JVM options that map its archive ("" without one, or when the user's own
    options speak of class-data sharing)."""
    given = settings.get("spark.driver.extraJavaOptions", "")
    if any(flag in given for flag in CDS_FLAGS):
        return ""
    return " ".join(sharing_options(archive_path(settings, cache_dir)))


def _training_stream(spark: Any) -> None:
    """A few micro-batches of a stateful stream of the coordinator's shape (a rate source,
    ``applyInPandasWithState`` with a processing-time timeout): the classes of a query's
    start and first batches join the archive."""
    import pandas as pd  # type: ignore[import-untyped]  # pandas ships no types
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count(key: Any, frames: Any, state: Any) -> Any:
        total = sum(len(f) for f in frames) + (state.get[0] if state.exists else 0)
        state.update((total,))
        state.setTimeoutDuration(60_000)
        yield pd.DataFrame({"key": [key[0]], "n": [total]})

    rows = (spark.readStream.format("rate").option("rowsPerSecond", 20).load()
            .selectExpr("value % 4 AS key", "value"))
    query = (rows.groupBy("key")
             .applyInPandasWithState(count, "key long, n long", "n long", "append",
                                     GroupStateTimeout.ProcessingTimeTimeout)
             .writeStream.format("noop").trigger(processingTime="200 milliseconds").start())
    deadline = time.monotonic() + 120
    while (query.lastProgress is None or query.lastProgress["batchId"] < 2) and (
            time.monotonic() < deadline):
        time.sleep(0.2)
    query.stop()


def _run_training(target: Path) -> None:
    from txstream.streaming.engine.session import build_session

    staged = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    spark = build_session(conf={
        "spark.driver.extraJavaOptions": " ".join(sharing_options(target, staged)),
        "spark.ui.enabled": "false"}, app_name="txstream-class-archive")
    _training_stream(spark)
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    spark.stop()
    if proc is None or proc.stdin is None:
        raise RuntimeError("the JVM was not started by this process: nothing to archive")
    proc.stdin.close()  # the gateway exits, and the JVM writes the archive as it ends
    if proc.wait(timeout=600) != 0 or not staged.is_file():
        staged.unlink(missing_ok=True)
        raise RuntimeError(f"the JVM wrote no class-data archive (exit {proc.returncode})")
    os.replace(staged, target)


def _target(cache_dir: Path | None) -> Path:
    from txstream.streaming.engine.session import given_settings, local_driver

    # The class path build_session gives a local driver with no --conf of the user's.
    return archive_path(local_driver(given_settings({})), cache_dir)


def _train_here(cache_dir: Path | None) -> Path:
    """The training run, in this process (which must have no Spark session yet)."""
    target = _target(cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second trainer waits, then finds it made
        if not target.is_file():
            _run_training(target)
    return target


def train(cache_dir: Path | None = None) -> Path | None:
    """Make the archive for a local coordinator's driver, unless it is there; its path, or
    None where it cannot be made (spark-submit started this driver, or the JVM failed).
    The training runs in a process of its own: a session of this one would be reused."""
    from txstream.streaming.engine.session import submitted

    if submitted():
        return None
    target = _target(cache_dir)
    if not target.is_file():
        subprocess.run([sys.executable, "-m", "txstream.streaming.engine.class_archive",
                        *([str(cache_dir)] if cache_dir else [])], check=False, timeout=900)
    return target if target.is_file() else None


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    started = time.monotonic()
    made = _train_here(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"class-data archive: {made} ({time.monotonic() - started:.0f} s)")
    sys.exit(0)
