"""``txstream demo``: RocketMQ's transaction example end to end, in one command.

``--role all`` (the default) starts an embedded tansu broker (unless ``--bootstrap-servers``),
the coordinator in local Spark with short timeouts, the example consumer and the example
producer, shows progress, prints a summary and stops everything it started, also on Ctrl-C.
``--role producer`` / ``--role consumer`` run one side against a coordinator running elsewhere
(the services of ``docker-compose.yml``).

The example: ten messages whose local transactions all answer UNKNOW; the back-checks then
answer i % 3 = 1 commit, 2 rollback, 0 unknown. With check max 3 the coordinator releases
1, 4, 7, rolls back 2, 5, 8 and discards 0, 3, 6, 9.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from txstream.broker import EmbeddedBroker
from txstream.extras import require_coordinator
from txstream.kafka import KafkaSettings, wait_for_broker
from txstream.message import Message
from txstream.state.effects import NoteKind
from txstream.state.policy import Policy
from txstream.streaming.cli.demo_clients import SeedListener, run_consumer, run_producer
from txstream.streaming.cli.demo_report import HistoryWatch, format_progress, format_summary
from txstream.streaming.cli.options import add_kafka_arguments, settings_of
from txstream.streaming.cli.recovery_command import add_recovery_arguments, recovery_command
from txstream.streaming.cli.signals import interrupt_on_signals, reclaim_sigint
from txstream.streaming.engine.config import DEFAULT_CHECKPOINT_ROOT, RunConfig, parse_duration_ms
from txstream.streaming.engine.coordinator import Coordinator
from txstream.streaming.engine.session import stop_spark
from txstream.topics import Topics

__all__ = ["add_parser", "demo_command", "EXPECTED"]

EXPECTED = {NoteKind.RELEASED: 3, NoteKind.ROLLED_BACK: 3, NoteKind.DISCARDED: 4}
_MSG_ID = re.compile(r"msgId=([0-9A-Fa-f]+)")


# The producer, the consumer and the progress reporter say things from their own threads;
# print() writes the text and its newline separately, so two lines could run into one.
_SAY_LOCK = threading.Lock()


def say(text: str) -> None:
    with _SAY_LOCK:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="RocketMQ's transaction example end to end, in one command")
    p.add_argument("--role", choices=("all", "producer", "consumer"), default="all",
                   help="all: broker, coordinator, producer and consumer here (default); "
                        "producer / consumer: one side, against a coordinator elsewhere")
    # --bootstrap-servers: a Kafka instead of an embedded broker (needed by the roles);
    # --topic-prefix: with role all and a Kafka of its own, the demo takes a new prefix.
    add_kafka_arguments(p)
    p.add_argument("--topic", default=None,
                   help="the example's topic (TranTest; --recovery: Orders)")
    p.add_argument("--group", default=None,
                   help="the example's producer group (please_rename_unique_group_name; "
                        "--recovery: orders)")
    p.add_argument("--consumer-group", default=None,
                   help="consumer group (default: the example's, with role all a new one)")
    p.add_argument("--checkpoint-dir", default=None,
                   help="role all: coordinator checkpoint (default: a new checkpoints/demo-*, "
                        "deleted at the end); --recovery: the demo's folder, its checkpoint "
                        "in it (default: a new checkpoints/recovery-*, kept)")
    p.add_argument("--keep-checkpoint", action="store_true",
                   help="do not delete the demo's own checkpoint")
    p.add_argument("--transaction-timeout", default="2s")
    p.add_argument("--check-interval", default="2s")
    p.add_argument("--check-max", type=int, default=3)
    p.add_argument("--trigger", default="200ms", help="coordinator micro-batch interval")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="give up after this long (default 180 s, --recovery 600 s; role "
                        "consumer: run until stopped)")
    p.add_argument("--verbose", action="store_true",
                   help="also print the coordinator's line per micro-batch")
    add_recovery_arguments(p)
    p.set_defaults(func=demo_command)


def _checkpoint(args: argparse.Namespace, stack: ExitStack) -> str:
    if args.checkpoint_dir:
        return str(args.checkpoint_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{uuid.uuid4().hex[:4]}"
    root = DEFAULT_CHECKPOINT_ROOT
    if root.is_dir() and os.access(root, os.W_OK):
        path = root / f"demo-{stamp}"
        path.mkdir(parents=True)
    else:  # an installed package: no checkpoints/ folder of a source tree
        path = Path(tempfile.mkdtemp(prefix=f"txstream-demo-{stamp}-"))
    if not args.keep_checkpoint:
        stack.callback(shutil.rmtree, path, True)
    return str(path)


def _quietly(fn: Callable[[], object], what: str) -> Callable[[], None]:
    """A clean-up step that reports its failure and lets the next steps run."""

    def step() -> None:
        try:
            fn()
        except Exception as exc:
            say(f"stopping {what} failed: {type(exc).__name__}: {exc}")

    return step


class _Worker(threading.Thread):
    """Runs one example side; remembers its failure for the main loop."""

    def __init__(self, name: str, target: Callable[[], object]) -> None:
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._target_fn()
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"


def _producer_line(listener: SeedListener) -> Callable[[str], None]:
    """The example's own line (RocketMQ's SendResult), with the body it sent."""

    def out(text: str) -> None:
        m = _MSG_ID.search(text)
        body = listener.bodies.get(m.group(1)) if m else None
        say(f"producer  {text}" + (f"  | {body}" if body else ""))

    return out


def demo_command(args: argparse.Namespace) -> int:
    if args.recovery:
        return recovery_command(args)
    args.topic = args.topic or "TranTest"
    args.group = args.group or "please_rename_unique_group_name"
    if args.role == "all":  # the producer and consumer roles are clients only
        require_coordinator("txstream demo")
    # SIGTERM (docker stop) ends the demo as Ctrl-C does.
    stack = ExitStack()
    with interrupt_on_signals():
        try:
            return _demo(args, stack)
        except KeyboardInterrupt:
            say("interrupted: stopping everything the demo started")
            # A consumer runs until it is stopped: its normal end (docker compose stop).
            return 0 if args.role == "consumer" else 130
        finally:
            # A second Ctrl-C must not cut the clean-up short and leave a broker or JVM behind.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            stack.close()


def _connect(args: argparse.Namespace, stack: ExitStack) -> tuple[KafkaSettings, Topics]:
    """The Kafka the demo runs on (an embedded broker unless given) and its topics."""
    bootstrap = args.bootstrap_servers
    prefix = args.topic_prefix or ""
    if args.role != "all" and not bootstrap:
        raise SystemExit(f"txstream demo --role {args.role} needs --bootstrap-servers "
                         "(the Kafka its coordinator uses)")
    if args.role == "all" and bootstrap and not prefix:
        # Another coordinator may serve the default topics of that Kafka: keep apart from it.
        prefix = f"demo{time.strftime('%H%M%S')}_"
        say(f"system topics prefixed {prefix} (txstream history ... --topic-prefix {prefix})")
    if not bootstrap:
        broker = EmbeddedBroker()
        say("starting the embedded tansu broker")
        broker.start()
        stack.callback(_quietly(broker.stop, "the broker"))
        bootstrap = broker.bootstrap_servers
        say(f"broker listening on {bootstrap} (memory storage)")
    settings = settings_of(args, bootstrap)
    wait_for_broker(settings, timeout_s=60)
    return settings, Topics.with_prefix(prefix)


def _start_consumer(args: argparse.Namespace, settings: KafkaSettings, topics: Topics,
                    listener: SeedListener, received: list[str],
                    stop: threading.Event) -> _Worker:
    group = args.consumer_group or (
        f"demo_consumer_{uuid.uuid4().hex[:6]}" if args.role == "all"
        else "consumer_test_clustering")
    ready = threading.Event()

    def on_message(msg: Message) -> None:
        if args.role == "consumer" or msg.transaction_id in listener.bodies:
            received.append(msg.body_text)

    worker = _Worker("demo-consumer", lambda: run_consumer(
        settings, topic=args.topic, topic_prefix=topics.prefix, group=group, stop=stop,
        out=lambda s: say(f"consumer  {s}"), on_message=on_message, started=ready))
    worker.start()
    ready.wait(30)
    return worker


def _demo(args: argparse.Namespace, stack: ExitStack) -> int:
    started = time.monotonic()
    timeout = args.timeout if args.timeout is not None else (
        None if args.role == "consumer" else 180.0)
    deadline = None if timeout is None else started + timeout
    settings, topics = _connect(args, stack)
    coordinator = None
    if args.role == "all":
        coordinator = _start_coordinator(args, settings, topics, stack)
        if coordinator is None:
            return 1
    listener = SeedListener()
    received: list[str] = []
    workers: list[_Worker] = []
    stop = threading.Event()
    stack.callback(_quietly(lambda: _stop_workers(stop, workers), "the example clients"))
    if args.role in ("all", "consumer"):
        workers.append(_start_consumer(args, settings, topics, listener, received, stop))
    if args.role == "consumer":
        return _consume_only(workers[0], deadline)
    workers.append(_Worker("demo-producer", lambda: run_producer(
        settings, topic=args.topic, topic_prefix=topics.prefix, group=args.group, stop=stop,
        out=_producer_line(listener), listener=listener)))
    workers[-1].start()
    watch = HistoryWatch(settings, topics)
    stack.callback(_quietly(watch.close, "the history reader"))
    ok = _follow(args, listener, watch, received, workers, coordinator, deadline)
    return _verdict(args, listener, watch, received, ok, time.monotonic() - started)


def _verdict(args: argparse.Namespace, listener: SeedListener, watch: HistoryWatch,
             received: list[str], ok: bool, seconds: float) -> int:
    outcomes = watch.poll()
    shown = received if args.role == "all" else None  # the consumer runs elsewhere
    say(format_summary(listener, outcomes, shown, seconds))
    txids = list(listener.bodies)
    counts = {e: outcomes.count(e, txids) for e in EXPECTED}
    expected = counts == EXPECTED and (args.role != "all" or len(received) == 3)
    if ok and expected:
        say("as RocketMQ's example: 3 released (1, 4, 7), 3 rolled back, 4 discarded")
        return 0
    say(f"not the expected outcome {EXPECTED}: {counts}")
    return 1


def _start_coordinator(args: argparse.Namespace, settings: KafkaSettings, topics: Topics,
                       stack: ExitStack) -> Any:
    policy = Policy(transaction_timeout=parse_duration_ms(args.transaction_timeout),
                    check_interval=parse_duration_ms(args.check_interval),
                    check_max=args.check_max)
    config = RunConfig(kafka=settings, topics=topics, policy=policy,
                       checkpoint_dir=_checkpoint(args, stack),
                       trigger_ms=parse_duration_ms(args.trigger), buckets=8,
                       query_name="txstream-demo",
                       # A one-minute demo has no use for Spark's web UI.
                       spark_conf=(("spark.ui.enabled", "false"),))
    say(f"starting the coordinator in local Spark (checkpoint {config.checkpoint_dir}; "
        f"transaction timeout {args.transaction_timeout}, check interval "
        f"{args.check_interval}, check max {args.check_max})")
    emit = (lambda s: say(f"coordinator  {s}")) if args.verbose else None
    coordinator = Coordinator(config, emit=emit)
    stack.callback(logging.disable, logging.NOTSET)
    try:
        coordinator.start()
        reclaim_sigint()
    finally:
        if coordinator.spark is not None:
            spark = coordinator.spark
            stack.callback(_quietly(lambda: stop_spark(spark), "Spark"))
        stack.callback(_quietly(coordinator.stop, "the coordinator"))
        # Stopping a query interrupts its running batch, which Spark and the sink report as
        # errors; after the summary they would only alarm.
        stack.callback(_quietly(lambda: _hush(coordinator.spark), "logging"))
    while coordinator.listener.board.view().batches < 1:
        failure = coordinator.failure()
        if failure or not coordinator.query.isActive:
            say(f"the coordinator failed: {failure}")
            return None
        time.sleep(0.2)
    say("coordinator running (first micro-batch done)")
    return coordinator


def _hush(spark: Any) -> None:
    logging.disable(logging.WARNING)
    if spark is not None:
        spark.sparkContext.setLogLevel("OFF")


def _consume_only(worker: _Worker, deadline: float | None) -> int:
    while worker.is_alive() and (deadline is None or time.monotonic() < deadline):
        worker.join(0.5)
    if worker.error:
        say(f"consumer failed: {worker.error}")
        return 1
    return 0


def _follow(args: argparse.Namespace, listener: SeedListener, watch: HistoryWatch,
            received: list[str], workers: list[_Worker], coordinator: Any,
            deadline: float | None) -> bool:
    """Print progress until every transaction ended and the consumer got the released ones."""
    last = ""
    while True:
        outcomes = watch.poll()
        line = format_progress(listener, outcomes, len(received))
        if line != last:
            say(f"progress  {line}")
            last = line
        txids = list(listener.bodies)
        released = outcomes.count(NoteKind.RELEASED, txids)
        if len(txids) >= 10 and all(t in outcomes.final for t in txids) and (
            args.role != "all" or len(received) >= released
        ):
            return True
        for w in workers:
            if w.error:
                say(f"{w.name} failed: {w.error}")
                return False
        failure = coordinator.failure() if coordinator is not None else None
        if failure:
            say(f"the coordinator failed: {failure}")
            return False
        if deadline is not None and time.monotonic() > deadline:
            say("timed out before every transaction ended")
            return False
        time.sleep(0.5)


def _stop_workers(stop: threading.Event, workers: list[_Worker]) -> None:
    stop.set()
    for w in workers:
        w.join(30)
