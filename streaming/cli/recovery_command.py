"""The flags of ``txstream demo --recovery`` and the command itself: the run in
:mod:`~txstream.streaming.cli.demo_recovery`, stopped cleanly also on Ctrl-C and SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from txstream.errors import ConfigError
from txstream.extras import require_coordinator
from txstream.streaming.cli.demo_recovery import (
    DemoFailed,
    Launch,
    RecoveryDemo,
    RecoveryOptions,
    local_launch,
)
from txstream.streaming.cli.options import settings_of
from txstream.streaming.cli.recovery_live import say
from txstream.streaming.cli.signals import interrupt_on_signals
from txstream.streaming.engine.config import DEFAULT_CHECKPOINT_ROOT
from txstream.topics import Topics

__all__ = ["add_recovery_arguments", "recovery_command", "recovery_options", "FAULTS"]

FAULTS = ("kill", "pause", "executor")


def add_recovery_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("--recovery: the coordinator crashed under traffic")
    g.add_argument("--recovery", action="store_true",
                   help="SIGKILL the coordinator in the middle of a micro-batch under steady "
                        "traffic, restart it from its checkpoint, and show nothing was lost")
    g.add_argument("--rate", type=float, default=5.0, help="transactions a second (5)")
    g.add_argument("--kill-after", type=float, default=10.0, metavar="SECONDS",
                   help="traffic before each fault (10; Enter on a terminal: now)")
    g.add_argument("--faults", default=None, metavar="LIST",
                   help="the faults, in order: kill (the coordinator), pause (the demo's "
                        "broker), executor (with --cluster); e.g. kill,kill,pause (default "
                        "kill; --cluster: executor,kill)")
    g.add_argument("--down", type=float, default=3.0, metavar="SECONDS",
                   help="how long the coordinator stays down before its restart (3)")
    g.add_argument("--pause", type=float, default=5.0, metavar="SECONDS",
                   help="how long a broker pause lasts (5)")
    g.add_argument("--tail", type=float, default=8.0, metavar="SECONDS",
                   help="traffic after the last recovery (8)")
    g.add_argument("--producers", type=int, default=2, help="producers of the group (2)")
    g.add_argument("--seed", type=int, default=43, help="the traffic's mix (43)")
    g.add_argument("--ui", action="store_true",
                   help="also serve the console, with this run's chart at /recovery")
    g.add_argument("--ui-port", type=int, default=8080, metavar="PORT",
                   help="the console's loopback port with --ui (8080; 0: a free one)")
    g.add_argument("--kafka", action="store_true",
                   help="run on Apache Kafka (1 KRaft node, jars from the set-up) instead of "
                        "the embedded tansu")
    g.add_argument("--cluster", action="store_true",
                   help="spark-submit the coordinator to a Spark standalone cluster of "
                        "pyspark's own distribution (a master and a worker on loopback)")


def _faults(text: str) -> tuple[str, ...]:
    faults = tuple(f.strip() for f in text.split(",") if f.strip())
    wrong = [f for f in faults if f not in FAULTS]
    if wrong or not faults:
        raise ConfigError(f"--faults takes a list of {', '.join(FAULTS)}; got {text!r}")
    return faults


def _folder(args: argparse.Namespace, stamp: str) -> Path:
    if args.checkpoint_dir:
        return Path(args.checkpoint_dir).resolve()  # the coordinator may run elsewhere (cwd)
    root = DEFAULT_CHECKPOINT_ROOT
    if root.is_dir() and os.access(root, os.W_OK):
        return root / f"recovery-{stamp}"
    return Path(tempfile.mkdtemp(prefix=f"txstream-recovery-{stamp}-"))


def recovery_options(args: argparse.Namespace) -> RecoveryOptions:
    """The options of the parsed flags (checked before anything starts)."""
    faults = _faults(args.faults or ("executor,kill" if args.cluster else "kill"))
    if "executor" in faults and not args.cluster:
        raise ConfigError("--faults executor kills a standalone cluster's executor: with "
                          "--cluster")
    if args.rate <= 0 or args.producers < 1:
        raise ConfigError("--rate must be above 0 and --producers at least 1")
    if "pause" in faults and args.bootstrap_servers:
        raise ConfigError("--faults pause stops the demo's own broker: not with "
                          "--bootstrap-servers")
    if args.kafka and args.bootstrap_servers:
        raise ConfigError("--kafka starts a broker of the demo's: not with --bootstrap-servers")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    prefix, topic = args.topic_prefix or "", args.topic or "Orders"
    if args.bootstrap_servers and not prefix:
        # Another coordinator may serve that Kafka's default topics: keep apart from it.
        prefix = f"recovery{time.strftime('%H%M%S')}_"
        topic = args.topic or f"Orders_{time.strftime('%H%M%S')}"
    return RecoveryOptions(
        folder=_folder(args, stamp), rate=args.rate, kill_after=args.kill_after, faults=faults,
        down_s=args.down, pause_s=args.pause, tail_s=args.tail, producers=args.producers,
        seed=args.seed, topic=topic, group=args.group or "orders",
        kafka=settings_of(args) if args.bootstrap_servers else None, apache_kafka=args.kafka,
        topics=Topics.with_prefix(prefix),
        policy=("--transaction-timeout", args.transaction_timeout, "--check-interval",
                args.check_interval, "--trigger", args.trigger),
        timeout_s=args.timeout if args.timeout is not None else 600.0,
        key_press=sys.stdin is not None and sys.stdin.isatty(),
        ui_port=args.ui_port if args.ui else None, cluster=args.cluster)


def recovery_command(args: argparse.Namespace, launch: Launch = local_launch) -> int:
    require_coordinator("txstream demo --recovery")
    options = recovery_options(args)
    stack = ExitStack()
    with interrupt_on_signals():
        try:
            return RecoveryDemo(options, launch).run(stack)
        except KeyboardInterrupt:
            say("interrupted: stopping everything the demo started")
            return 130
        except DemoFailed as exc:
            say(f"the demo failed: {exc}")
            return 1
        finally:
            # A second Ctrl-C must not cut the clean-up short and leave a JVM behind.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            stack.close()
            say(f"everything the demo started is stopped; its folder stays: {options.folder}")
