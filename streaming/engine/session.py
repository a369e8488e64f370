"""The SparkSession txstream runs in: txstream's settings where the user set none.

What the user gives wins: ``spark-submit --conf`` and ``--driver-memory``, ``spark-defaults.conf``
and ``txstream run --conf``. txstream's own values (``txstream.streaming.engine.spark_settings``)
fill the keys left unset; the JVM options, the driver's class path and the Python warning filters
are extended rather than replaced.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from txstream.streaming.engine.class_archive import archive_option
from txstream.streaming.engine.local_fs import no_fork_fs_jar
from txstream.streaming.engine.spark_settings import (
    DEFAULT_DRIVER_MEMORY,
    PANDAS_WARNING_FILTER,
    check_settings,
    defaults_file_settings,
    is_local_master,
    merge_settings,
    tuned_settings,
    with_no_fork_fs,
)
from txstream.streaming.engine.warm_python import cold_python, start_warm_python

__all__ = ["build_session", "stop_spark", "end_spark", "on_jvm_signals", "given_settings",
           "submitted", "local_driver"]


def submitted() -> bool:
    """Whether spark-submit started this driver (it sets ``PYSPARK_GATEWAY_PORT``)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def given_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """Every Spark setting the user gave: spark-submit's (its ``--conf``, ``--master``,
    ``--driver-memory``, ``spark-defaults.conf``), or ``spark-defaults.conf`` when txstream
    starts Spark itself; then ``conf`` (``txstream run --conf``)."""
    if submitted():
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # the JVM spark-submit started, with its settings
        given = dict(SparkConf().getAll())
    else:
        import pyspark

        given = defaults_file_settings(os.environ, Path(pyspark.__file__).parent)
    given.update(conf)
    return given


def _prepare_environment(local: bool) -> None:
    # Driver-side Python (the data source reader) must start this interpreter, not the system one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # The driver's own Python workers inherit the filter (executors get it by their settings).
    os.environ.setdefault("PYTHONWARNINGS", PANDAS_WARNING_FILTER)
    if local and not submitted():
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_driver(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` with what a local driver that this process starts gets: the no-fork file
    system (its jar is local), then Spark's classes mapped from the archive made for the class
    path that gives, if there is one."""
    jar = no_fork_fs_jar()
    local = with_no_fork_fs(settings, jar) if jar is not None else dict(settings)
    return merge_settings({"spark.driver.extraJavaOptions": archive_option(local)}, local)


def build_session(
    master: str | None = None,
    shuffle_partitions: int = 2,
    state_store: str = "default",
    app_name: str = "txstream",
    conf: Mapping[str, str] | None = None,
    jit: str = "c1",
    driver_memory: str = DEFAULT_DRIVER_MEMORY,
    log_level: str | None = None,
) -> Any:
    """A SparkSession (``getOrCreate``) with txstream's settings where the user gave none.

    ``master``: as ``spark-submit --master``; None keeps spark-submit's, or is ``local[2]`` on
    loopback when txstream starts Spark itself. ``shuffle_partitions`` and ``state_store`` are
    fixed in a query's checkpoint on its first run. ``jit`` and ``driver_memory`` reach the
    driver's JVM only when this call starts it. ``log_level``: Spark's (None: log4j's config).
    """
    given = given_settings(conf or {})
    if master is not None:
        given["spark.master"] = master
    master = given.get("spark.master") or (None if submitted() else "local[2]")
    local = is_local_master(master)
    _prepare_environment(local)
    from pyspark.sql import SparkSession

    settings = merge_settings(tuned_settings(
        shuffle_partitions=shuffle_partitions, state_store=state_store, jit=jit,
        driver_memory=driver_memory, executor_memory=given.get("spark.executor.memory", "1g"),
        local=local, submitted=submitted()), given)
    check_settings(settings)
    if local and not submitted():
        # Only where this call starts the JVM and every executor is in it.
        settings = local_driver(settings)
        start_warm_python()  # before the JVM, which inherits its launcher (0035)
    else:
        cold_python()
    builder = SparkSession.builder.appName(settings.pop("spark.app.name", app_name))
    for key, value in settings.items():
        builder = builder.config(key, str(value))
    spark = builder.getOrCreate()
    _quiet_accumulator_server(spark)
    if log_level:
        spark.sparkContext.setLogLevel(log_level.upper())
    return spark


def on_jvm_signals(spark: Any, handler: Callable[[str], None],
                   names: tuple[str, ...] = ("TERM", "INT")) -> None:
    """Let the driver's JVM hand these signals to ``handler`` instead of shutting down.

    Under spark-submit the JVM is the process a user or a scheduler holds, and its default
    SIGTERM runs Spark's shutdown hooks, which stop the context under the running query: the
    query fails with a screen of stack traces. Handled here, the signal reaches Python
    (through py4j's callback server), which stops the query cleanly and exits; spark-submit
    then exits with it.
    """
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = spark.sparkContext._jvm

    class _Handler:
        def handle(self, signal: Any) -> None:
            threading.Thread(target=handler, args=(signal.getName(),), daemon=True).start()

        class Java:
            implements = ["sun.misc.SignalHandler"]

    for name in names:
        jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), _Handler())


def stop_spark(spark: Any) -> None:
    """Stop the SparkSession and the JVM behind it, and wait until that process is gone.

    ``spark.stop()`` leaves the JVM running until this Python process exits; a command that
    promises to leave nothing behind ends it here: closing its stdin makes the gateway exit.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    _quiet_accumulator_server(spark)
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


_HANG_UPS = (EOFError, ConnectionResetError, BrokenPipeError)


def _quiet_accumulator_server(spark: Any) -> None:
    """pyspark's accumulator server prints a traceback when the JVM hangs up on it: at
    ``SparkContext.stop``, which stops the JVM before it flags the server down, and when a
    Ctrl-C reaches the JVM first (the whole process group gets it). A hang-up only says the
    JVM went away, which the query's end reports; any other error is still printed."""
    server = getattr(getattr(spark, "sparkContext", None), "_accumulatorServer", None)
    if server is None or getattr(server, "_txstream_quiet", False):
        return
    printed = server.handle_error

    def handle_error(request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], _HANG_UPS):
            printed(request, client_address)

    server.handle_error = handle_error
    server._txstream_quiet = True


def _spark_python_processes() -> list[int]:
    """Spark's Python workers and runners in this process group (the JVM started them; a JVM
    that died left them to init, where the group still finds them)."""
    group, own = os.getpgrp(), os.getpid()
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit() or int(entry) == own:
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read()
            program = os.path.basename(command.split(b"\0", 1)[0])
            # Python processes only: under spark-submit the JVM is this process's parent.
            if (program.startswith(b"python") and b"pyspark" in command
                    and os.getpgid(pid) == group):
                found.append(pid)
        except (OSError, ProcessLookupError):
            continue
    return found


def end_spark(spark: Any, wait_s: float = 5.0) -> None:
    """Stop Spark after a failure, before its verdict is said: the JVM (:func:`stop_spark`) and
    its Python processes, which a dying JVM leaves to time out on its sockets and print their
    tracebacks after the command has exited."""
    try:
        if spark is not None:
            stop_spark(spark)
    except Exception:  # the JVM is gone already: only its children are left
        pass
    pids = _spark_python_processes()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)  # Python's default: exit at once, nothing printed
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if os.path.exists(f"/proc/{pid}")
                and not _is_zombie(pid)]
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
