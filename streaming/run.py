"""``txstream run``: the coordinator as a long-running job, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from streaming.config import (
    DEFAULT_CHECKPOINT_ROOT,
    RunConfig,
    add_run_arguments,
    config_from_args,
)
from txstream.broker import EmbeddedBroker
from txstream.kafka import wait_for_broker

__all__ = ["add_parser", "run_command", "Coordinator"]

# Spark's exit code for a JVM that ran out of heap (org.apache.spark.util.SparkExitCode.OOM).
_JVM_OUT_OF_MEMORY = 52


def _say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class Coordinator:
    """The coordinator query with its SparkSession and listeners, started and stopped together.

    Used by ``txstream run``, the demo and the benchmark.
    """

    def __init__(self, config: RunConfig, emit: Callable[[str], None] | None = None,
                 function: Callable[..., Any] | None = None) -> None:
        self.config = config
        self.emit = emit
        self.function = function  # streaming.query.build_stream's; None: the coordinator's
        self.spark: Any = None
        self.query: Any = None
        self.listener: Any = None

    def start(self) -> Coordinator:
        from streaming.progress import ProgressListener
        from streaming.query import start_coordinator
        from streaming.session import build_session

        self.spark = build_session(
            shuffle_partitions=self.config.shuffle_partitions,
            state_store=self.config.state_store,
            jit=self.config.jit,
            driver_memory=self.config.driver_memory,
        )
        self.listener = ProgressListener(emit=self.emit, query_name=self.config.query_name)
        self.spark.streams.addListener(self.listener)
        self.query = start_coordinator(self.spark, self.config, self.function)
        return self

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
                    f"checkpoint keeps everything. Pending half messages live in that heap, "
                    f"and a burst of big ones born in the same second needs the most "
                    f"(README: sizing the driver's heap).")
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


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops the job as cleanly as Ctrl-C does."""
    raise KeyboardInterrupt


def _stop_on_signals() -> threading.Event:
    """Once the query runs, Ctrl-C and SIGTERM only ask the wait loop to stop (it looks every
    second). Raising in the handler, as Python and pyspark do, breaks into a py4j call: py4j
    logged each such break as a traceback, ~30 lines that made a clean stop look like a crash.
    pyspark starts its JVM with SIGINT ignored, so the JVM waits for the stop."""
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    return stop


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run the transaction coordinator until stopped")
    add_run_arguments(p)
    p.add_argument("--broker-timeout", type=float, default=30.0,
                   help="seconds to wait for the Kafka broker at start")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    failure = None
    with ExitStack() as stack:
        bootstrap = args.bootstrap_servers
        if not bootstrap:
            broker = stack.enter_context(EmbeddedBroker())
            bootstrap = broker.bootstrap_servers
            _say(f"embedded tansu broker listening on {bootstrap} (memory storage)")
        config = config_from_args(args, bootstrap)
        if not args.bootstrap_servers and not args.checkpoint_dir:
            # The embedded broker starts empty every time: a checkpoint from an earlier run
            # would be ahead of it (the source refuses that as data loss). Start a fresh one.
            fresh = DEFAULT_CHECKPOINT_ROOT / f"embedded-{time.strftime('%Y%m%d-%H%M%S')}"
            config = config.with_(checkpoint_dir=fresh)
        _say(f"waiting for Kafka at {bootstrap}")
        wait_for_broker(config.kafka, timeout_s=args.broker_timeout)
        coordinator = Coordinator(config, emit=_say)
        signal.signal(signal.SIGTERM, _interrupt)
        _say(f"starting coordinator (checkpoint {config.checkpoint_dir})")
        coordinator.start()
        stack.callback(coordinator.stop)
        stop = _stop_on_signals()
        if config.metrics_port:
            from streaming.metrics import serve_metrics

            serve_metrics(config.metrics_port, coordinator.listener.stats)
            _say(f"metrics on http://127.0.0.1:{config.metrics_port}/metrics")
        p = config.policy
        _say(
            f"coordinator running: half topic {config.topics.half}, end topic "
            f"{config.topics.end}; transaction timeout {p.transaction_timeout} ms, check "
            f"interval {p.check_interval} ms, check max {p.check_max}. Ctrl-C stops it."
        )
        try:
            while coordinator.query.isActive and not stop.is_set():
                coordinator.query.awaitTermination(1.0)
        except Exception:  # awaitTermination raises the query's failure, said below in one line
            pass
        if stop.is_set():
            _say("stopping coordinator")
            return 0
        failure = coordinator.failure()
    # Said after the stack has stopped everything: stopping a query whose JVM is gone makes
    # py4j log its connection errors, and the verdict must be the last line a user reads.
    if failure:
        print(f"txstream: coordinator failed: {failure}", file=sys.stderr)
        return 1
    return 0
