"""``txstream run``: the coordinator as a long-running job, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from contextlib import ExitStack
from typing import Any

from txstream.broker import EmbeddedBroker
from txstream.errors import ConfigError
from txstream.extras import require_coordinator
from txstream.kafka import wait_for_broker
from txstream.streaming.cli.logs import say
from txstream.streaming.cli.options import add_run_arguments, config_from_args, set_log_level
from txstream.streaming.cli.signals import interrupt_on_signals, stop_event_on_signals
from txstream.streaming.engine.config import (
    DEFAULT_CHECKPOINT_ROOT,
    HealthThresholds,
    RunConfig,
    parse_duration_ms,
)
from txstream.streaming.engine.coordinator import Coordinator
from txstream.streaming.engine.outage import OutageRide, ride_out
from txstream.streaming.engine.session import end_spark, on_jvm_signals, submitted

__all__ = ["add_parser", "run_command"]


_say = say


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run the transaction coordinator until stopped",
                       description="Run the coordinator until Ctrl-C or SIGTERM. Without "
                                   "--bootstrap-servers it starts an embedded tansu broker.")
    add_run_arguments(p)
    p.add_argument("--broker-timeout", type=float, default=30.0,
                   help="seconds to wait for the Kafka broker at start")
    p.set_defaults(func=run_command)


def _config(args: argparse.Namespace, stack: ExitStack) -> RunConfig:
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
    return config


def _start(config: RunConfig, args: argparse.Namespace, stack: ExitStack) -> Coordinator:
    _say(f"waiting for Kafka at {config.kafka.bootstrap_servers}")
    wait_for_broker(config.kafka, timeout_s=args.broker_timeout)
    coordinator = Coordinator(config, emit=_say)
    _say(f"starting coordinator (checkpoint {config.checkpoint_dir})")
    stack.callback(coordinator.stop)
    coordinator.start()
    return coordinator


def _thresholds(args: argparse.Namespace) -> HealthThresholds:
    try:
        return HealthThresholds(
            lag_growing_s=parse_duration_ms(args.health_lag_growing) / 1000,
            timer_overdue_s=parse_duration_ms(args.health_timer_overdue) / 1000)
    except ValueError as exc:
        raise ConfigError(f"--health-lag-growing/--health-timer-overdue: {exc}") from None


def _watch(coordinator: Coordinator, args: argparse.Namespace, stop: threading.Event,
           stack: ExitStack) -> OutageRide:
    """The broker watched (the input lag with it), and ``/metrics`` and ``/healthz`` served
    on ``--metrics-port``: 503 "stopping" once ``stop`` is set."""
    from txstream.streaming.engine.health import query_problem
    from txstream.streaming.engine.metrics import serve_coordinator, watch_lag

    config, thresholds = coordinator.config, _thresholds(args)
    watch = watch_lag(coordinator, thresholds)
    stack.callback(watch.close)
    ride = OutageRide(watch, config.broker_outage_limit_ms / 1000, emit=_say)
    if config.metrics_port:
        server = serve_coordinator(
            coordinator, thresholds, lag=watch, stopping=stop.is_set,
            problem=lambda: ride.waiting or query_problem(coordinator),
            restarts=lambda: ride.restarts)
        stack.callback(server.close)
        _say(f"metrics on http://{server.host}:{server.port}/metrics, health on /healthz"
             + (" (all interfaces)" if server.host in ("0.0.0.0", "::") else ""))
    p = config.policy
    _say(f"coordinator running: half topic {config.topics.half}, end topic "
         f"{config.topics.end}; transaction timeout {p.transaction_timeout} ms, check "
         f"interval {p.check_interval} ms, check max {p.check_max}. Ctrl-C stops it.")
    return ride


def run_command(args: argparse.Namespace) -> int:
    require_coordinator("txstream run")
    set_log_level(args.log_level, args.log_format)
    _thresholds(args)  # a bad threshold is said before anything starts
    failure = None
    stop = threading.Event()
    with ExitStack() as stack:
        with interrupt_on_signals():  # until the query runs, a signal simply unwinds
            config = _config(args, stack)
            coordinator = _start(config, args, stack)
        stop_event_on_signals(stop)
        if submitted():  # spark-submit's JVM is the process a user or a scheduler holds
            on_jvm_signals(coordinator.spark, lambda name: stop.set())
        ride = _watch(coordinator, args, stop, stack)
        failure = ride_out(coordinator, ride, stop)
        if stop.is_set():
            _say("stopping coordinator")
            # While the query stops, /healthz still answers 503 "stopping": the stack closes
            # its server first, and a prober would otherwise find the port shut at once.
            coordinator.stop()
            # The batch a stop finds running may still complete and print its line: this one
            # tells a reader that nothing follows.
            _say("coordinator stopped")
            return 0
    # Said after the stack has stopped everything: stopping a query whose JVM is gone makes
    # py4j log its connection errors, and the verdict must be the last line a user reads.
    if failure:
        end_spark(coordinator.spark)
        print(f"txstream: coordinator failed: {failure}", file=sys.stderr)
        return 1
    return 0
