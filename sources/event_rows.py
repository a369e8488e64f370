"""Kafka records -> rows of ``EVENT_SCHEMA`` (tuples in ``EVENT_COLUMNS`` order, or Arrow).

Kept apart from the data source so the parsing rules can be read, and tested, without Spark.
A record that cannot be decoded never raises here: it becomes a ``malformed`` row that carries
the record as read (key, value, headers, where it lay) so the coordinator can dead-letter it
intact.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from txstream.errors import ConfigError, MalformedRecord
from txstream.schema import EVENT_COLUMNS, EventKind
from txstream.topics import validate_group, validate_topic
from txstream.wire import decode_end, decode_half

__all__ = ["record_row", "malformed_row", "rows_to_batch", "arrow_schema", "NUM_COLUMNS"]

NUM_COLUMNS = len(EVENT_COLUMNS)
_INDEX = {name: i for i, (name, _) in enumerate(EVENT_COLUMNS)}
_SRC_TOPIC, _SRC_PARTITION, _SRC_OFFSET = (
    _INDEX["src_topic"], _INDEX["src_partition"], _INDEX["src_offset"]
)


def _half_row(msg: Any, topic: str, partition: int, offset: int) -> tuple[Any, ...]:
    return (
        EventKind.HALF,
        msg.transaction_id,
        msg.producer_group,
        None,  # decision
        None,  # from_check
        None,  # check_times
        None,  # operator
        None,  # remark
        msg.topic,
        msg.body,
        msg.tags,
        msg.keys,
        msg.properties,
        msg.msg_id,
        msg.born_timestamp,
        msg.check_immunity_time_s,
        None,  # error
        None,  # raw_key
        None,  # raw_value
        None,  # raw_headers
        topic,
        partition,
        offset,
    )


def _end_row(event: Any, topic: str, partition: int, offset: int) -> tuple[Any, ...]:
    return (
        EventKind.END,
        event.transaction_id,
        event.producer_group,
        event.decision.value,
        event.from_check,
        event.check_times,
        event.operator,
        event.remark,
        None,  # topic
        None,  # body
        None,  # tags
        None,  # keys
        None,  # properties
        None,  # msg_id
        event.born_timestamp,
        None,  # immunity_s
        None,  # error
        None,  # raw_key
        None,  # raw_value
        None,  # raw_headers
        topic,
        partition,
        offset,
    )


def malformed_row(
    reason: str,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[Any, Any]] | None,
    topic: str,
    partition: int,
    offset: int,
) -> tuple[Any, ...]:
    """A ``malformed`` row: why, and the record exactly as read, to dead-letter it intact."""
    raw_headers = [(_header_name(k), v) for k, v in headers or ()]
    row: list[Any] = [None] * NUM_COLUMNS
    row[0] = EventKind.MALFORMED
    row[_INDEX["error"]] = reason
    row[_INDEX["raw_key"]] = key
    row[_INDEX["raw_value"]] = value
    row[_INDEX["raw_headers"]] = raw_headers
    row[_SRC_TOPIC], row[_SRC_PARTITION], row[_SRC_OFFSET] = topic, partition, offset
    return tuple(row)


def _header_name(name: Any) -> str:
    # kafka-python always gives str; anything else is kept readable rather than dropped.
    return name if isinstance(name, str) else repr(name)


def _check_names(msg: Any) -> None:
    # The real topic and the group's check topic become Kafka topic names on the way out; a
    # name Kafka refuses would fail the sink on every retry and stall the coordinator, so the
    # record is refused here, where it can still be dead-lettered.
    try:
        validate_topic(msg.topic)
        validate_group(msg.producer_group)
    except ConfigError as exc:
        raise MalformedRecord(str(exc)) from None


def record_row(
    is_half: bool,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[tuple[Any, Any]] | None,
    topic: str,
    partition: int,
    offset: int,
    max_body: int,
) -> tuple[Any, ...]:
    """One record of the half (``is_half``) or end topic as a row; never raises on bad input."""
    try:
        if is_half:
            msg = decode_half(key, value, headers, max_body)
            _check_names(msg)
            return _half_row(msg, topic, partition, offset)
        return _end_row(decode_end(key, value, headers), topic, partition, offset)
    except MalformedRecord as exc:
        reason = exc.reason
    except Exception as exc:
        # A decoder bug must not stop the coordinator: the record is dead-lettered with the
        # error instead, which keeps it visible rather than lost.
        reason = f"undecodable record ({type(exc).__name__}: {exc})"
    return malformed_row(reason, key, value, headers, topic, partition, offset)


def arrow_schema(spark_schema: Any) -> Any:
    """The Arrow schema Spark expects for ``spark_schema`` (it checks equality exactly)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(spark_schema, timezone="UTC")


def rows_to_batch(rows: Iterable[tuple[Any, ...]], schema: Any) -> Any:
    """Rows -> one ``pyarrow.RecordBatch`` of ``schema``.

    Building the columns here is cheaper than letting Spark convert tuple by tuple, which
    verifies every value's type on the way.
    """
    import pyarrow as pa

    columns = list(zip(*rows)) or [()] * len(schema)
    arrays = [
        pa.array(col, type=field.type) for col, field in zip(columns, schema, strict=True)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
