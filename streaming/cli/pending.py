"""``txstream pending --checkpoint-dir DIR``: the transactions the coordinator is waiting on,
read from its state (:mod:`streaming.engine.state_reader`) without disturbing it."""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from streaming.cli.options import env, format_ms
from streaming.engine.session import DEFAULT_DRIVER_MEMORY, check_driver_memory
from streaming.engine.state_reader import PendingRow, latest_batch, read_pending
from txstream.errors import ConfigError

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
    p.set_defaults(func=pending_command)


def pending_command(args: argparse.Namespace) -> int:
    from streaming.engine.session import build_session

    memory = args.driver_memory or DEFAULT_DRIVER_MEMORY
    try:
        check_driver_memory(memory)
    except ValueError as exc:
        raise ConfigError(f"--driver-memory: {exc}") from None
    checkpoint = Path(args.checkpoint_dir)
    local = "://" not in str(args.checkpoint_dir)
    if local and not (checkpoint / "offsets").is_dir():
        raise ConfigError(f"{checkpoint} is not a coordinator checkpoint (no offsets/)")
    batch = latest_batch(checkpoint) if local else None
    # With --json, stdout carries the rows only: a script reads "nothing" as no rows.
    note = sys.stderr if args.json else sys.stdout
    if local and batch is None:
        print(f"no committed batch in {checkpoint} yet: nothing is pending", file=note)
        return 0
    if local and not (checkpoint / "state").is_dir():
        print(f"no state in {checkpoint} yet: nothing is pending", file=note)
        return 0
    # Defaults on purpose: getOrCreate applies the builder's settings to a session that already
    # exists in this process (a test's, the demo's), and the reader takes the partitioning from
    # the checkpoint anyway.
    spark = build_session(app_name="txstream-pending", driver_memory=memory)
    # A URI goes to Spark untouched: Path would fold "hdfs://nn/x" into "hdfs:/nn/x".
    where_read = checkpoint if local else args.checkpoint_dir
    try:
        rows = read_pending(spark, where_read, batch_id=batch[0] if batch else None)
    except Exception as exc:  # Spark's errors: a wall of JVM trace; keep the line that says why
        raise ConfigError(f"cannot read the state of {checkpoint}: {_reason(exc)}") from None
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return 0
    where = f"batch {batch[0]} at {format_ms(batch[1])}" if batch else "last committed batch"
    print(f"{len(rows)} pending transaction(s) in {checkpoint} ({where})")
    if rows:
        print(format_table(rows))
    return 0
