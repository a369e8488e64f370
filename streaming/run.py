"""``txstream run``: the coordinator as a long-running job, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys
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
        )
        self.listener = ProgressListener(emit=self.emit, query_name=self.config.query_name)
        self.spark.streams.addListener(self.listener)
        self.query = start_coordinator(self.spark, self.config, self.function)
        return self

    def stop(self) -> None:
        if self.query is not None:
            # Stopping interrupts the running batch on purpose; Spark would log that as an error
            # with a stack trace. The checkpoint makes the interrupted batch run again.
            self.spark.sparkContext.setLogLevel("OFF")
            try:
                self.query.stop()
            except Exception:  # stopping a failed query raises its failure again
                pass
        if self.spark is not None and self.listener is not None:
            self.spark.streams.removeListener(self.listener)
        self.query = None

    def failure(self) -> str | None:
        """The query's failure as one line, or None while it is healthy."""
        if self.query is None:
            return None
        exc = self.query.exception()
        if exc is None:
            return None
        text = str(exc)
        for line in text.splitlines():
            if "Error" in line or "Exception" in line:
                return line.strip()[:500]
        return text.splitlines()[0][:500] if text else "query failed"


def _interrupt(signum: int, frame: Any) -> None:
    """SIGTERM stops the job as cleanly as Ctrl-C does."""
    raise KeyboardInterrupt


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run the transaction coordinator until stopped")
    add_run_arguments(p)
    p.add_argument("--broker-timeout", type=float, default=30.0,
                   help="seconds to wait for the Kafka broker at start")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
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
            while coordinator.query.isActive:
                coordinator.query.awaitTermination(1.0)
        except KeyboardInterrupt:
            _say("stopping coordinator")
            return 0
        failure = coordinator.failure()
        if failure:
            print(f"txstream: coordinator failed: {failure}", file=sys.stderr)
            return 1
    return 0
