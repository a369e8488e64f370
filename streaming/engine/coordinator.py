"""The coordinator's life cycle: its SparkSession, query and listeners, started and stopped
together, and its failure said in one line."""

from __future__ import annotations

import logging
import re
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from txstream.streaming.engine.config import RunConfig

__all__ = ["Coordinator", "session_for", "half_retention_warning", "cause_line",
           "quiet_failure_traces"]

log = logging.getLogger(__name__)

# Spark's exit code for a JVM that ran out of heap (org.apache.spark.util.SparkExitCode.OOM).
_JVM_OUT_OF_MEMORY = 52


# Spark's loggers that print a failing task's or query's whole trace (the Python traceback and
# the JVM's stack, ~50 lines each, several times over). The failure is said in one line
# (Coordinator.failure); its whole text is logged at DEBUG.
_FAILURE_LOGGERS = (
    "org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.util.Utils",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",
)
_TRACEBACK = "Traceback (most recent call last):"
# A Python exception's line: its (qualified) class, then its message.
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*)(:\s.*)?$")


def cause_line(text: str) -> str:
    """The line of a query's failure that says why. Spark wraps a Python error (a source's,
    a sink's) with the Python traceback in its text: the cause is that traceback's exception
    line, as ``Class: message`` (the last traceback's: the one that ended it). Otherwise the
    first line that names an error."""
    lines = text.splitlines()
    tracebacks = [i for i, line in enumerate(lines) if _TRACEBACK in line]
    if tracebacks:
        for line in lines[tracebacks[-1] + 1:]:
            if line.strip() and not line[0].isspace():
                match = _EXCEPTION_LINE.match(line.strip())
                if match:
                    return f"{match[1]}{match[2] or ''}"[:500]
                break
    for line in lines:
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return lines[0][:500] if lines else "query failed"


def quiet_failure_traces(spark: Any) -> None:
    """Turn off Spark's loggers that print a failure's whole trace (see _FAILURE_LOGGERS)."""
    try:
        jvm = spark.sparkContext._jvm
        level = jvm.org.apache.logging.log4j.Level.OFF
        for name in _FAILURE_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)
    except Exception as exc:  # another logging backend: the traces stay, nothing else changes
        log.debug("Spark's failure traces stay on: %s", exc)


def session_for(config: RunConfig, app_name: str = "txstream") -> Any:
    """The SparkSession ``config`` asks for (``getOrCreate``)."""
    from txstream.streaming.engine.session import build_session

    return build_session(
        master=config.master,
        shuffle_partitions=config.shuffle_partitions,
        state_store=config.state_store,
        app_name=app_name,
        conf=dict(config.spark_conf),
        jit=config.jit,
        driver_memory=config.driver_memory,
        log_level=config.log_level,
    )


def half_retention_warning(config: RunConfig) -> str | None:
    """What to tell the user when the half topic may drop a half message before its
    transaction can end: bodies are read back from there until the reserved time
    (docs/decisions/0021-bodies-read-back.md). None: long enough, or the broker does not say."""
    from txstream.kafka.provision import admin_client, topic_states

    half, reserved = config.topics.half, config.policy.reserved_time
    try:
        with admin_client(config.kafka) as admin:
            state = topic_states(admin, [half], with_configs=True)[half]
        retention = int(state.configs.get("retention.ms", "-1"))
        size = int(state.configs.get("retention.bytes", "-1"))
    except Exception:  # not allowed, not told: nothing to say
        return None
    lost = ("a transaction that lives longer loses its body, and its release or discard goes "
            "to the dead-letter topic (HALF_MESSAGE_LOST)")
    if 0 <= retention < reserved:
        return (f"the half topic {half} keeps records {retention} ms, less than the reserved "
                f"time of {reserved} ms: {lost}; raise its retention.ms")
    if size >= 0:
        return (f"the half topic {half} keeps at most {size} bytes per partition "
                f"(retention.bytes): under load it may delete records younger than the "
                f"reserved time of {reserved} ms, and {lost}; set retention.bytes=-1")
    return None


class Coordinator:
    """The coordinator query with its SparkSession and listeners, started and stopped together.

    Used by ``txstream run`` and the demo. :meth:`start_query` starts the query itself; a
    subclass may start another one in the same life cycle (the benchmark's stand-in core).
    """

    def __init__(self, config: RunConfig, emit: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.emit = emit
        self.spark: Any = None
        self.query: Any = None
        self.listener: Any = None

    def start(self) -> Coordinator:
        from txstream.kafka.provision import coordinator_topics, create_command, ensure_topics
        from txstream.streaming.engine.progress import ProgressListener

        # Before Spark starts: a missing topic the broker may not auto-create is said in one
        # line, and those it may are created here, with their partitions and retention.
        specs = coordinator_topics(self.config.topics, self.config.topic_partitions)
        command = create_command(self.config.kafka, self.config.topics)
        created = ensure_topics(self.config.kafka, specs, command)
        if created and self.emit:
            self.emit(f"created topics {', '.join(created)}")
        if (warning := half_retention_warning(self.config)) is not None:
            log.warning("%s", warning)
            if self.emit:
                self.emit(f"warning: {warning}")
        self.spark = session_for(self.config)
        if (self.config.log_level or "").upper() not in ("DEBUG", "TRACE", "ALL"):
            quiet_failure_traces(self.spark)
        from txstream.sinks.refusal_log import RefusalReader, refusal_log
        from txstream.streaming.engine.timers import schedule_file

        refused = refusal_log(schedule_file(str(self.config.checkpoint_dir)))
        self.listener = ProgressListener(emit=self.emit, query_name=self.config.query_name,
                                         refusals=RefusalReader(refused))
        self.spark.streams.addListener(self.listener)
        self._choose_transactions()
        self.query = self.start_query(self.spark)
        if self.config.metrics_port is not None or self.emit is not None:
            self._seed_gauges()
        return self

    def _seed_gauges(self) -> None:
        """The pending gauges (and the progress line's pending) start from what the checkpoint
        holds. Read beside the query's first batch, not before it: a restart's commits wait
        a second less, and the board keeps what a later batch said over the seed."""
        from txstream.streaming.engine.metric_totals import seed_from_state

        board, spark, location = self.listener.board, self.spark, self.config.checkpoint_dir

        def seed() -> None:
            try:
                seed_from_state(board, spark, location)
            except Exception as exc:  # stopped meanwhile: the gauges stay unknown, as designed
                log.debug("the pending gauges were not seeded: %s", exc)

        threading.Thread(target=seed, name="txstream-seed-gauges", daemon=True).start()

    def _choose_transactions(self) -> None:
        """Which path the sink takes, said in one line (streaming.engine.transactions)."""
        from txstream.streaming.engine.query import resolve_transactions

        self.config, line = resolve_transactions(self.spark, self.config)
        if line is not None:
            log.info("%s", line)
            if self.emit:
                self.emit(line)

    def start_query(self, spark: Any) -> Any:
        """Start the streaming query on ``spark``; returns the StreamingQuery."""
        from txstream.streaming.engine.query import start_coordinator

        return start_coordinator(spark, self.config)

    def restart_query(self) -> None:
        """Start the query again from its checkpoint, after it failed (a broker outage,
        streaming.engine.outage): the restart a new process would make, in this one."""
        failed, self.query = self.query, None
        try:
            failed.stop()
        except Exception:  # stopping a failed query raises its failure again
            pass
        self.query = self.start_query(self.spark)

    def stop(self) -> None:
        # Every call may find the JVM gone (it died of its heap): there is nothing left to stop.
        if self.query is not None:
            try:
                # Stopping interrupts the running batch on purpose; Spark would log that as an
                # error with a stack trace. The checkpoint makes the interrupted batch run again.
                self.spark.sparkContext.setLogLevel("OFF")
                self.query.stop()
            except Exception:  # stopping a failed query raises its failure again
                pass
        if self.spark is not None and self.listener is not None:
            try:
                self.spark.streams.removeListener(self.listener)
            except Exception:
                pass
        self.query = None

    def failure(self) -> str | None:
        """The query's failure as one line, or None while it is healthy. A driver that ran
        out of heap says so, with the flag that fixes it: Spark's own last words then blame
        whatever its shutdown broke."""
        text = self.failure_detail()
        if not text:
            return None
        code = self._jvm_exit_code()
        if code == _JVM_OUT_OF_MEMORY or "OutOfMemoryError" in text:
            return (f"the Spark driver ran out of memory (java.lang.OutOfMemoryError with "
                    f"--driver-memory {self.config.driver_memory}): restart with more, the "
                    f"checkpoint keeps everything. A micro-batch that reads many big "
                    f"messages at once needs the most; --max-offsets-per-trigger bounds it "
                    f"(docs/configuration.md: sizing the driver's heap).")
        line = cause_line(text)
        return f"{line} (the Spark JVM exited with code {code})" if code is not None else line

    def failure_detail(self) -> str | None:
        """The query's failure, its whole text (traces and all); None while it is healthy."""
        if self.query is None:
            return None
        try:
            exc = self.query.exception()
            return None if exc is None else str(exc) or "query failed"
        except Exception as gone:  # py4j: the JVM that ran the query has exited
            return f"the Spark JVM is gone ({type(gone).__name__})"

    def _jvm_exit_code(self, wait_s: float = 5.0) -> int | None:
        """The exit code of the JVM this process started for Spark, if it has exited or is
        exiting (its context stopped: it gets up to ``wait_s`` to finish); None while it runs
        on, or under spark-submit."""
        gateway = getattr(self.spark.sparkContext, "_gateway", None) if self.spark else None
        proc = getattr(gateway, "proc", None)  # pyspark keeps the JVM's Popen there
        if proc is None:
            return None
        try:
            exiting = bool(self.spark.sparkContext._jsc.sc().isStopped())
        except Exception:  # py4j: nobody answers, the JVM is gone or going
            exiting = True
        if not exiting:
            return None
        try:
            code: int = proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None
        return code
