"""The one schema module: the rows that flow through the coordinator's streaming query.

    Kafka (half + end topics)
      -> sources.kafka_source   EventRow: one per record, as read, with its state key
      -> streaming.engine.operator
                                applyInPandasWithState keyed by ``state_key``, state STATE_SCHEMA;
                                decodes each record (sources.events) and runs the core
      -> OutputRow: one per record to write, routed by ``kind`` (and one timer row per key)
      -> sinks.kafka_sink       Kafka (real topics, check topics, discard, dead letter, history)

Each row is a typed named tuple; its fields carry their Spark type (``Annotated``), from which
the DDL schemas Spark is given are generated, so the Python rows and Spark's columns cannot
drift apart. Rows are narrow on purpose: every column costs a conversion per row between the
JVM, Arrow and pandas (docs/decisions/0010-narrow-rows.md). DDL strings, so that importing
this module needs no JVM.
"""

from __future__ import annotations

import typing
from typing import Annotated, NamedTuple

__all__ = [
    "EventRow",
    "OutputRow",
    "EVENT_SCHEMA",
    "EVENT_COLUMNS",
    "OUTPUT_SCHEMA",
    "OUTPUT_COLUMNS",
    "STATE_SCHEMA",
    "Kind",
    "EventKind",
    "columns_of",
]


class EventKind:
    """Values of ``EventRow.kind``: the topic a record was read from, or what the source tells
    the operator."""

    HALF = 0
    END = 1
    # The outcome of a transaction decided before the checkpoint existed, recovered from the
    # history topic by a new checkpoint (key: the transaction id, value: its status).
    OUTCOME = 2
    # One per micro-batch, no record: ``ends_read`` says how far the end topic has been read,
    # on the coordinator's clock; Spark's event-time watermark carries it to every state key.
    PROGRESS = 3
    # A half message read again by a new checkpoint's recovery, below where the half topic
    # ended when it began: a coordinator before it may have released it (sources.journal).
    HALF_AGAIN = 4


class Kind:
    """Values of ``OutputRow.kind``: which sink a row goes to."""

    VISIBLE = "visible"
    CHECK = "check"
    DISCARD = "discard"
    DEAD_LETTER = "dead_letter"
    HISTORY = "history"
    # Not a record: a state key's next timeout (``not_before_ms``; null: none), which the sink
    # folds into the timer schedule (txstream.timer_schedule) instead of writing it. Its
    # ``value`` is the key's metrics of the batch (streaming.engine.key_metrics), which the
    # query observes: no column of its own, so no other row pays for it.
    TIMER = "timer"

    ALL = (VISIBLE, CHECK, DISCARD, DEAD_LETTER, HISTORY, TIMER)


class EventRow(NamedTuple):
    """One Kafka record read from the half or end topic, undecoded: the operator decodes it
    (sources.events.parse_event), once."""

    state_key: Annotated[int, "bigint"]  # state.keys.state_key of the record key (its txid)
    kind: Annotated[int, "tinyint"]  # EventKind
    src_partition: Annotated[int, "int"]
    src_offset: Annotated[int, "bigint"]
    key: Annotated[bytes | None, "binary"]
    value: Annotated[bytes | None, "binary"]
    headers: Annotated[bytes | None, "binary"]  # txstream.wire.pack_headers
    error: Annotated[str | None, "string"]  # the Kafka client could not read the record at all
    # The record's timestamp (ms): when the broker stored it, with LogAppendTime topics.
    timestamp: Annotated[int | None, "bigint"]
    # PROGRESS rows only (microseconds, Spark's timestamp): every end-topic record written
    # before this time has been read, in this micro-batch or before (the query's watermark).
    ends_read: Annotated[int | None, "timestamp"]


class OutputRow(NamedTuple):
    """One record the coordinator writes (or, ``Kind.TIMER``, a key's next timeout)."""

    kind: Annotated[str, "string"]  # Kind
    topic: Annotated[str, "string"]
    key: Annotated[bytes | None, "binary"]
    value: Annotated[bytes | None, "binary"]
    headers: Annotated[bytes | None, "binary"]  # txstream.wire.pack_headers
    # The record's id (also its TXSTREAM_RECORD_ID header) and the micro-batch's time: both the
    # same when a batch is replayed after a crash, so the sink skips what was already written.
    record_id: Annotated[str | None, "string"]
    batch_ms: Annotated[int | None, "bigint"]
    # A timer's record made ahead of its deadline (state.policy.Policy.timer_lead): the sink
    # sends it no earlier than this. Null: at once. A TIMER row: the key's next timeout.
    not_before_ms: Annotated[int | None, "bigint"]
    # Where the record's value lies: a pending transaction's state keeps where its half message
    # lies, not its body, so its release, checks and discard leave ``value`` null and name the
    # half topic's partition and offset; the sink reads the body back, so that big bodies never
    # pass through the JVM (readback.bodies, docs/decisions/0021-bodies-read-back.md). Null:
    # ``value`` is the record's value.
    body_partition: Annotated[int | None, "int"]
    body_offset: Annotated[int | None, "bigint"]


def columns_of(row: type[tuple[object, ...]]) -> tuple[tuple[str, str], ...]:
    """((name, Spark SQL type), ...) of a row type, in field order."""
    hints = typing.get_type_hints(row, include_extras=True)
    return tuple((name, hints[name].__metadata__[0]) for name in row._fields)  # type: ignore[attr-defined]


def _ddl(columns: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


EVENT_COLUMNS = columns_of(EventRow)
EVENT_SCHEMA = _ddl(EVENT_COLUMNS)
OUTPUT_COLUMNS = columns_of(OutputRow)
OUTPUT_SCHEMA = _ddl(OUTPUT_COLUMNS)

# The state of one key: its transactions, encoded by state.bucket.Bucket.encode.
STATE_SCHEMA = "blob binary"
