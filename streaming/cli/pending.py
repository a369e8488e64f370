"""``txstream pending --checkpoint-dir DIR``: the transactions the coordinator is waiting on,
read from its state (:mod:`txstream.streaming.engine.state_reader`) without disturbing it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from txstream.console.timeline_text import format_ms
from txstream.errors import ConfigError
from txstream.extras import require_coordinator
from txstream.streaming.cli.options import (
    add_spark_arguments,
    env,
    set_log_level,
    spark_conf_of,
)
from txstream.streaming.engine.spark_settings import DEFAULT_DRIVER_MEMORY, check_driver_memory

if TYPE_CHECKING:
    from txstream.streaming.engine.state_reader import PendingRow

__all__ = ["add_parser", "pending_command", "format_table"]


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = max(0, ms) / 1000
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    return f"{s / 3600:.1f}h"


def format_table(rows: list[PendingRow]) -> str:
    head = ("TRANSACTION", "STATUS", "GROUP", "TOPIC", "AGE", "CHECKS SENT/ANSWERED",
            "NEXT CHECK")
    body = [
        (r.transaction_id, r.status, r.producer_group or "-", r.topic or "-", _age(r.age_ms),
         f"{r.checks_sent}/{r.checks_answered}", format_ms(r.next_check_ms))
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip()
                     for line in (head, *body))


def _reason(exc: Exception) -> str:
    text = str(exc)
    match = re.search(r"\[[A-Z_.]+\][^\n]*", text)
    line = match.group(0) if match else (text.strip().splitlines() or [type(exc).__name__])[0]
    return line.strip()[:300]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pending", help="list the transactions the coordinator waits on")
    p.add_argument("--checkpoint-dir", default=env("checkpoint-dir"),
                   required=not env("checkpoint-dir"),
                   help="the coordinator's --checkpoint-dir (env TXSTREAM_CHECKPOINT_DIR)")
    p.add_argument("--json", action="store_true", help="one JSON object per transaction")
    p.add_argument("--driver-memory", default=env("driver-memory"),
                   help="the Spark driver's heap for reading the state (default "
                        f"{DEFAULT_DRIVER_MEMORY}; env TXSTREAM_DRIVER_MEMORY, as for run)")
    add_spark_arguments(p)
    p.set_defaults(func=pending_command)


def pending_command(args: argparse.Namespace) -> int:
    require_coordinator("txstream pending")
    from txstream.streaming.engine.checkpoint import Checkpoint
    from txstream.streaming.engine.session import build_session

    set_log_level(args.log_level, args.log_format)
    memory = args.driver_memory or DEFAULT_DRIVER_MEMORY
    try:
        check_driver_memory(memory)
    except ValueError as exc:
        raise ConfigError(f"--driver-memory: {exc}") from None
    location = args.checkpoint_dir  # a URI goes to Spark as given
    # Defaults on purpose: getOrCreate applies the builder's settings to a session that already
    # exists in this process (a test's, the demo's), and the reader takes the partitioning from
    # the checkpoint anyway.
    spark = build_session(master=args.master, app_name="txstream-pending",
                          conf=dict(spark_conf_of(args)), driver_memory=memory,
                          log_level=args.log_level)
    checkpoint = Checkpoint(spark, location)
    if checkpoint.read_text("metadata") is None:
        raise ConfigError(f"{location} is not a coordinator checkpoint (no metadata)")
    batch = checkpoint.last_committed_batch()
    # With --json, stdout carries the rows only: a script reads "nothing" as no rows.
    note = sys.stderr if args.json else sys.stdout
    if batch is None:
        print(f"no committed batch in {location} yet: nothing is pending", file=note)
        return 0
    from txstream.streaming.engine.state_reader import (
        read_pending,  # the state's code: numpy and all
    )

    try:
        rows = read_pending(spark, location, batch_id=batch)
    except Exception as exc:  # Spark's errors: a wall of JVM trace; keep the line that says why
        raise ConfigError(f"cannot read the state of {location}: {_reason(exc)}") from None
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return 0
    print(f"{len(rows)} pending transaction(s) in {location} "
          f"(batch {batch} at {format_ms(checkpoint.batch_time(batch))})")
    if rows:
        print(format_table(rows))
    return 0
