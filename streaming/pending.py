"""``txstream pending --checkpoint-dir DIR``: the transactions the coordinator is waiting on.

Read from the coordinator's own state with Spark's state data source
(``spark.read.format("statestore")``): one row per state key (:mod:`state.keys`), its value the
``applyInPandasWithState`` state ``blob`` = :meth:`state.bucket.Bucket.encode`. The source reads
the last *committed* batch, so this works while the coordinator runs (it never sees a
half-written batch) and after it stopped; the coordinator is not disturbed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from state.bucket import Bucket
from state.lifecycle import Transaction
from streaming.kafka_args import format_ms
from streaming.session import DEFAULT_DRIVER_MEMORY, check_driver_memory
from txstream.errors import ConfigError

__all__ = ["add_parser", "pending_command", "PendingRow", "read_pending", "latest_batch"]


@dataclass(frozen=True)
class PendingRow:
    transaction_id: str
    status: str
    producer_group: str | None
    topic: str | None
    born_ms: int | None
    age_ms: int | None
    checks_sent: int
    checks_answered: int
    next_check_ms: int | None
    state_key: int


def latest_batch(checkpoint: Path) -> tuple[int, int | None] | None:
    """(last committed batch id, its batch timestamp ms) of a local checkpoint, or None."""
    commits = checkpoint / "commits"
    ids = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
    if not ids:
        return None
    batch = max(ids)
    when = None
    try:
        # offsets/N: "v1", then the batch metadata (batchTimestampMs), then source offsets.
        lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
        when = int(json.loads(lines[1])["batchTimestampMs"])
    except (OSError, IndexError, KeyError, ValueError):
        pass
    return batch, when


def _blob(value: Any) -> bytes | None:
    """The state blob of one statestore row (applyInPandasWithState nests it in groupState)."""
    if value is None:
        return None
    fields = value.asDict() if hasattr(value, "asDict") else dict(value)
    inner = fields.get("groupState", value)
    if inner is None:
        return None
    blob = inner["blob"]
    return bytes(blob) if blob is not None else None


def _row(tx: Transaction, key: int, now: int) -> PendingRow:
    half = tx.half
    born = half.born_timestamp if half is not None else None
    return PendingRow(
        transaction_id=tx.transaction_id,
        status=tx.status.value,
        producer_group=tx.producer_group,
        topic=half.topic if half is not None else None,
        born_ms=born,
        age_ms=now - born if born is not None else None,
        checks_sent=tx.checks_sent,
        checks_answered=tx.checks_answered,
        next_check_ms=tx.next_check,
        state_key=key,
    )


def read_pending(spark: Any, checkpoint_dir: str | Path, batch_id: int | None = None,
                 now_ms: int | None = None) -> list[PendingRow]:
    """Every unresolved transaction in the checkpoint's state, oldest first."""
    # The state reader registers with the StateStoreCoordinator, which a session creates with
    # its streaming query manager: a fresh session (``txstream pending`` in a new process) has
    # none until ``streams`` is touched, and every read failed with RpcEndpointNotFound.
    _ = spark.streams.active
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", str(batch_id))
    rows = reader.load(str(checkpoint_dir)).select("key", "value").collect()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for r in rows:
        key = int(r["key"]["state_key"])
        for tx in Bucket.decode(_blob(r["value"])).pending():
            out.append(_row(tx, key, now))
    return sorted(out, key=lambda p: (p.born_ms is None, p.born_ms or 0, p.transaction_id))


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
    p.add_argument("--checkpoint-dir", default=os.environ.get("TXSTREAM_CHECKPOINT_DIR"),
                   required=not os.environ.get("TXSTREAM_CHECKPOINT_DIR"),
                   help="the coordinator's --checkpoint-dir (env TXSTREAM_CHECKPOINT_DIR)")
    p.add_argument("--json", action="store_true", help="one JSON object per transaction")
    p.add_argument("--driver-memory", default=os.environ.get("TXSTREAM_DRIVER_MEMORY"),
                   help="the Spark driver's heap for reading the state (default "
                        f"{DEFAULT_DRIVER_MEMORY}; env TXSTREAM_DRIVER_MEMORY, as for run)")
    p.set_defaults(func=pending_command)


def pending_command(args: argparse.Namespace) -> int:
    from streaming.session import build_session

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
