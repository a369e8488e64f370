"""The coordinator's life cycle: its SparkSession, query and listeners, started and stopped
together, and its failure said in one line."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable
from typing import Any

from txstream.streaming.engine.config import RunConfig

__all__ = ["Coordinator", "session_for", "half_retention_warning"]

log = logging.getLogger(__name__)

# Spark's exit code for a JVM that ran out of heap (org.apache.spark.util.SparkExitCode.OOM).
_JVM_OUT_OF_MEMORY = 52


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
        self.listener = ProgressListener(emit=self.emit, query_name=self.config.query_name)
        if self.config.metrics_port is not None or self.emit is not None:
            from txstream.streaming.engine.metric_totals import seed_from_state

            # Before the query: the pending gauges (and the progress line's pending) start
            # from what the checkpoint holds.
            seed_from_state(self.listener.board, self.spark, self.config.checkpoint_dir)
        self.spark.streams.addListener(self.listener)
        self.query = self.start_query(self.spark)
        return self

    def start_query(self, spark: Any) -> Any:
        """Start the streaming query on ``spark``; returns the StreamingQuery."""
        from txstream.streaming.engine.query import start_coordinator

        return start_coordinator(spark, self.config)

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
        if self.query is None:
            return None
        try:
            exc = self.query.exception()
            text = "" if exc is None else str(exc) or "query failed"
        except Exception as gone:  # py4j: the JVM that ran the query has exited
            text = f"the Spark JVM is gone ({type(gone).__name__})"
        if not text:
            return None
        code = self._jvm_exit_code()
        if code == _JVM_OUT_OF_MEMORY or "OutOfMemoryError" in text:
            return (f"the Spark driver ran out of memory (java.lang.OutOfMemoryError with "
                    f"--driver-memory {self.config.driver_memory}): restart with more, the "
                    f"checkpoint keeps everything. A micro-batch that reads many big "
                    f"messages at once needs the most; --max-offsets-per-trigger bounds it "
                    f"(docs/configuration.md: sizing the driver's heap).")
        for line in text.splitlines():
            if "Error" in line or "Exception" in line:
                return line.strip()[:500]
        line = text.splitlines()[0][:500]
        return f"{line} (the Spark JVM exited with code {code})" if code is not None else line

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
