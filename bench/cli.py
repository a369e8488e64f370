"""``txstream bench``: how fast, how late, how big, against the Spark-free limit.

Starts its own broker (unless ``--bootstrap-servers``) and its own coordinators, and prints a
table, or with ``--json`` one JSON object. Every coordinator setting of ``txstream run`` can be
given (``--trigger``, ``--buckets``, ``--shuffle-partitions``, ``--state-store``,
``--max-offsets-per-trigger``, ...) to measure it. PERFORMANCE.md says what each figure means.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Any

from bench.report import ALL_PHASES, PHASES
from txstream.streaming.cli.options import add_run_arguments, config_from_args
from txstream.streaming.cli.signals import interrupt_on_signals

__all__ = ["add_parser", "bench_command"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(float(x)) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("counts must not be negative")
    return values


def _stores(text: str) -> tuple[str, ...]:
    stores = tuple(x.strip() for x in text.split(",") if x.strip())
    if not set(stores) <= {"default", "rocksdb"}:
        raise argparse.ArgumentTypeError("stores are default and/or rocksdb")
    return stores


def _phases(text: str) -> tuple[str, ...]:
    phases = tuple(x.strip() for x in text.split(",") if x.strip())
    if not phases or not set(phases) <= set(ALL_PHASES):
        raise argparse.ArgumentTypeError(f"phases are {', '.join(ALL_PHASES)} (any of them)")
    return phases


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="measure throughput, latency, timer lateness and state size")
    p.add_argument("--transactions", type=int, default=20_000, metavar="N",
                   help="committed transactions for the raw pipe and the throughput phase")
    p.add_argument("--rate", type=float, default=None, metavar="R",
                   help="tx/s offered in the latency phase (default: half the throughput)")
    p.add_argument("--pending", type=_ints, default=(10_000, 100_000), metavar="P",
                   help="pending transactions held in state, comma-separated (default "
                        "10000,100000; the full curve: 10000,100000,1000000; 0: skip)")
    p.add_argument("--stores", type=_stores, default=("default",),
                   help="state stores of the pending curve (default: default; both: "
                        "default,rocksdb)")
    p.add_argument("--latency-seconds", type=float, default=30.0)
    p.add_argument("--pending-rate", type=float, default=200.0,
                   help="tx/s offered while P transactions are pending")
    p.add_argument("--pending-seconds", type=float, default=20.0)
    p.add_argument("--unknown-every", type=int, default=10,
                   help="one transaction in this many answers UNKNOW and is back-checked")
    p.add_argument("--in-process", action="store_true",
                   help="run the pending points in this process (faster; memory figures "
                        "then include the earlier points)")
    p.add_argument("--point-timeout", type=float, default=3600.0, metavar="SECONDS",
                   help="give up on a pending point after this long (default 3600)")
    p.add_argument("--phases", type=_phases, default=PHASES,
                   help=f"which phases to run (default {','.join(PHASES)}; also: recovery, "
                        "a coordinator's cold start and restarts); the fields of a skipped "
                        "phase are null")
    p.add_argument("--recovery-restarts", type=int, default=3, metavar="N",
                   help="SIGKILLs and restarts of the recovery phase (3; the median is given)")
    p.add_argument("--sink-transactions", dest="sink_transactions", default=None,
                   choices=("auto", "on", "off"),
                   help="txstream run's --transactions (here a count): the sink's Kafka "
                        "transactions, auto by default")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_run_arguments(p, sink_transactions=False)  # its --transactions is a count
    p.set_defaults(func=bench_command)


def bench_command(args: argparse.Namespace) -> int:
    from bench.report import format_table
    from bench.runner import BenchOptions, run_bench

    logging.getLogger("py4j").setLevel(logging.ERROR)
    config = config_from_args(args, args.bootstrap_servers or "embedded:0")
    options = BenchOptions(
        transactions=args.transactions,
        rate=args.rate,
        pending=tuple(p for p in args.pending if p > 0),
        stores=args.stores,
        latency_seconds=args.latency_seconds,
        pending_rate=args.pending_rate,
        pending_seconds=args.pending_seconds,
        unknown_every=args.unknown_every,
        isolate=not args.in_process,
        phases=args.phases,
        point_timeout_s=args.point_timeout,
        recovery_restarts=args.recovery_restarts,
    )
    # SIGTERM unwinds like Ctrl-C: the broker, the queries and the point processes are stopped.
    with interrupt_on_signals():
        result = run_bench(config, options)
    print(json.dumps(result) if args.json else format_table(result), flush=True)
    return 0
