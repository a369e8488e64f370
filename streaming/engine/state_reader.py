"""The coordinator's pending transactions, read from its own state.

Spark's state data source (``spark.read.format("statestore")``) gives one row per state key
(:mod:`txstream.state.keys`), its value the ``applyInPandasWithState`` state ``blob`` =
:meth:`txstream.state.bucket.Bucket.encode`. The source reads the last *committed* batch, so this
works while the coordinator runs (it never sees a half-written batch) and after it stopped; the
coordinator is not disturbed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from txstream.state.bucket import Bucket
from txstream.state.transaction import Transaction

__all__ = ["PendingRow", "read_pending", "read_key_summaries"]


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


def _state_rows(spark: Any, checkpoint_dir: str, batch_id: int | None) -> list[Any]:
    # The state reader registers with the StateStoreCoordinator, which a session creates with
    # its streaming query manager: a fresh session (``txstream pending`` in a new process) has
    # none until ``streams`` is touched, and every read failed with RpcEndpointNotFound.
    _ = spark.streams.active
    reader = spark.read.format("statestore")
    if batch_id is not None:
        reader = reader.option("batchId", str(batch_id))
    rows: list[Any] = reader.load(checkpoint_dir).select("key", "value").collect()
    return rows


def read_key_summaries(spark: Any, checkpoint_dir: str, batch_id: int | None = None
                       ) -> list[str]:
    """What each state key holds open as of a committed batch, as the operator's summaries
    (:meth:`txstream.streaming.engine.key_metrics.KeyTally.summary`, no counts): the metrics board's
    seed after a restart."""
    from txstream.streaming.engine.key_metrics import KeyTally

    out = []
    for r in _state_rows(spark, checkpoint_dir, batch_id):
        key = int(r["key"]["state_key"])
        summary = KeyTally(0).summary(key, Bucket.decode(_blob(r["value"])))
        out.append(summary.decode("utf-8"))
    return out


def read_pending(spark: Any, checkpoint_dir: str, batch_id: int | None = None,
                 now_ms: int | None = None) -> list[PendingRow]:
    """Every unresolved transaction in the checkpoint's state, oldest first."""
    rows = _state_rows(spark, checkpoint_dir, batch_id)
    now = int(time.time() * 1000) if now_ms is None else now_ms
    out = []
    for r in rows:
        key = int(r["key"]["state_key"])
        for tx in Bucket.decode(_blob(r["value"])).pending():
            out.append(_row(tx, key, now))
    return sorted(out, key=lambda p: (p.born_ms is None, p.born_ms or 0, p.transaction_id))
