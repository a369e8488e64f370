"""Kafka records -> ``EventRow`` rows of ``EVENT_SCHEMA`` (typed tuples, or Arrow).

A row is the record as read (key, value, packed headers, where it lay) plus the state key its
transaction lives under, so Spark can group it without looking inside. Decoding is the
operator's (:mod:`txstream.sources.events`), once per record: decoded fields would cross the JVM
twice more as columns, each converted per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from txstream.schema import EVENT_COLUMNS, EventKind, EventRow
from txstream.state.keys import PROGRESS_KEY, UNROUTABLE, KeyLayout, state_key
from txstream.wire import pack_headers

__all__ = ["route", "record_row", "unreadable_row", "outcome_row", "progress_row",
           "rows_to_batch", "arrow_schema", "event_struct", "NUM_COLUMNS"]

NUM_COLUMNS = len(EVENT_COLUMNS)


def route(key: bytes | None, layout: KeyLayout) -> int:
    """The state key of a record, from its key (the transaction id); UNROUTABLE without one."""
    if not key:
        return UNROUTABLE
    try:
        txid = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        return UNROUTABLE
    return state_key(txid, layout) if txid.strip() else UNROUTABLE


def record_row(
    is_half: bool,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
    partition: int,
    offset: int,
    layout: KeyLayout,
    timestamp: int | None = None,
    read_again: bool = False,
) -> EventRow:
    """One record of the half (``is_half``) or end topic as a row; never raises.
    ``read_again``: a half message a coordinator before this checkpoint may have read."""
    kind = (EventKind.HALF_AGAIN if read_again else EventKind.HALF) if is_half else EventKind.END
    return EventRow(route(key, layout), kind,
                    partition, offset, key, value, pack_headers(headers or ()), None,
                    timestamp if timestamp is not None and timestamp >= 0 else None, None)


def unreadable_row(is_half: bool, partition: int, offset: int, error: str) -> EventRow:
    """A record the Kafka client could not parse: only where it lay and why is known."""
    return EventRow(UNROUTABLE, EventKind.HALF if is_half else EventKind.END, partition, offset,
                    None, None, None, error, None, None)


def outcome_row(transaction_id: str, status: str, partition: int, offset: int,
                layout: KeyLayout) -> EventRow:
    """A transaction's outcome recovered from the history topic (``partition``/``offset``:
    the history record it came from), routed to the transaction's state key."""
    key = transaction_id.encode("utf-8")
    return EventRow(route(key, layout), EventKind.OUTCOME, partition, offset, key,
                    status.encode("ascii"), None, None, None, None)


def progress_row(ends_read_ms: int) -> EventRow:
    """The batch's progress time (:mod:`txstream.sources.progress`), as the watermark column wants
    it (microseconds)."""
    return EventRow(PROGRESS_KEY, EventKind.PROGRESS, -1, -1, None, None, None, None, None,
                    ends_read_ms * 1000)


def event_struct() -> Any:
    """``EVENT_SCHEMA`` as the StructType Spark hands the reader, built without a JVM (parsing
    the DDL would need one): for tests and the simulation, which run no Spark."""
    from pyspark.sql.types import (
        BinaryType,
        ByteType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {"tinyint": ByteType(), "int": IntegerType(), "bigint": LongType(),
             "binary": BinaryType(), "string": StringType(), "timestamp": TimestampType()}
    return StructType([StructField(name, types[kind]) for name, kind in EVENT_COLUMNS])


def arrow_schema(spark_schema: Any) -> Any:
    """The Arrow schema Spark expects for ``spark_schema`` (it checks equality exactly)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def rows_to_batch(rows: Iterable[tuple[Any, ...]], schema: Any) -> Any:
    """Rows -> one ``pyarrow.RecordBatch`` of ``schema``.

    Building the columns here is cheaper than letting Spark convert tuple by tuple, which
    verifies every value's type on the way.
    """
    import pyarrow as pa  # type: ignore[import-untyped]  # pyarrow ships no types

    columns = list(zip(*rows)) or [()] * len(schema)
    arrays = [
        pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
