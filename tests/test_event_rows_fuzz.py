"""Issue 5, bad input: no Kafka record, however broken, crashes the source's parsing.

``sources.event_rows.record_row`` turns every record of the half and end topics into a row;
whatever it gets, it must return a row Spark accepts (the Arrow batch builds), and a record it
cannot read must come out ``malformed`` with a reason and the record intact, to be
dead-lettered. Random records, and valid records with one header broken, are thrown at it.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from sources.event_rows import NUM_COLUMNS, arrow_schema, record_row, rows_to_batch
from txstream.message import Decision, EndEvent, Message
from txstream.schema import EVENT_COLUMNS, EventKind
from txstream.topics import Topics
from txstream.wire import encode_end, encode_half

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_BODY = 64  # small, so that "body over the size limit" comes up often
COL = {name: i for i, (name, _) in enumerate(EVENT_COLUMNS)}
TOPICS = Topics()


def _struct() -> StructType:
    """EVENT_SCHEMA as Spark hands it to the reader (parsing the DDL would need the JVM)."""
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    types = {"string": StringType(), "boolean": BooleanType(), "int": IntegerType(),
             "bigint": LongType(), "binary": BinaryType(),
             "map<string,string>": MapType(StringType(), StringType()),
             "array<struct<key:string,value:binary>>": ArrayType(header)}
    return StructType([StructField(n, types[t]) for n, t in EVENT_COLUMNS])


ARROW = arrow_schema(_struct())

header_names = st.one_of(
    st.sampled_from(["TRAN_MSG", "REAL_TOPIC", "PGROUP", "BORN_TIMESTAMP", "UNIQ_KEY", "KEYS",
                     "TAGS", "COMMIT_OR_ROLLBACK", "FROM_TRANSACTION_CHECK",
                     "TRANSACTION_CHECK_TIMES", "ADMIN_OPERATOR", "CHECK_IMMUNITY_TIME_IN_SECONDS",
                     "REMARK"]),
    st.text(max_size=12),
)
header_values = st.one_of(
    st.none(),
    st.binary(max_size=24),
    st.sampled_from([b"true", b"false", b"COMMIT_MESSAGE", b"ROLLBACK_MESSAGE", b"UNKNOW",
                     b"-1", b"99999999999999999999", b"\xff\xfe", b"topic-a", b"g", b"1"]),
)
headers = st.lists(st.tuples(header_names, header_values), max_size=8)
blobs = st.one_of(st.none(), st.binary(max_size=2 * MAX_BODY))


def _check(row: tuple[Any, ...], key: Any, value: Any, hdrs: Any) -> None:
    assert len(row) == NUM_COLUMNS
    kind = row[COL["kind"]]
    assert kind in (EventKind.HALF, EventKind.END, EventKind.MALFORMED)
    assert (row[COL["src_topic"]], row[COL["src_partition"]], row[COL["src_offset"]]) == (
        "in", 3, 17)
    if kind == EventKind.MALFORMED:
        assert row[COL["error"]], "a malformed row says why"
        assert row[COL["raw_key"]] == key and row[COL["raw_value"]] == value
        assert [v for _, v in row[COL["raw_headers"]]] == [v for _, v in hdrs or ()]
    else:
        assert row[COL["transaction_id"]] == bytes(key).decode("utf-8")
        assert row[COL["error"]] is None
    if kind == EventKind.HALF:
        assert len(row[COL["body"]] or b"") <= MAX_BODY
    rows_to_batch([row], ARROW)  # Spark gets a batch it accepts, whatever came in


@FUZZ
@given(is_half=st.booleans(), key=blobs, value=blobs, hdrs=headers)
def test_any_record_becomes_a_row_or_a_malformed_row(
    is_half: bool, key: Any, value: Any, hdrs: Any
) -> None:
    row = record_row(is_half, key, value, hdrs, "in", 3, 17, MAX_BODY)
    _check(row, key, value, hdrs)


def _valid(is_half: bool, body: bytes) -> Any:
    if is_half:
        return encode_half(Message("orders", body, transaction_id="tx-1", msg_id="tx-1",
                                   producer_group="g", born_timestamp=1_700_000_000_000),
                           TOPICS)
    return encode_end(EndEvent("tx-1", "g", Decision.COMMIT_MESSAGE, born_timestamp=1), TOPICS)


@FUZZ
@given(is_half=st.booleans(), body=st.binary(max_size=2 * MAX_BODY), data=st.data())
def test_a_valid_record_with_one_header_broken_never_crashes(
    is_half: bool, body: bytes, data: st.DataObject
) -> None:
    record = _valid(is_half, body)
    hdrs = list(record.headers)
    i = data.draw(st.integers(0, len(hdrs) - 1))
    action = data.draw(st.sampled_from(["value", "drop", "duplicate", "name"]))
    if action == "value":
        hdrs[i] = (hdrs[i][0], data.draw(header_values))
    elif action == "drop":
        del hdrs[i]
    elif action == "duplicate":
        hdrs.append((hdrs[i][0], data.draw(header_values)))
    else:
        hdrs[i] = (data.draw(st.text(max_size=8)), hdrs[i][1])
    key = data.draw(st.one_of(st.just(record.key), blobs))
    row = record_row(is_half, key, record.value, hdrs, "in", 3, 17, MAX_BODY)
    _check(row, key, record.value, hdrs)


def test_the_bad_inputs_of_the_issue_are_malformed_with_their_reason() -> None:
    half = _valid(True, b"x" * (MAX_BODY + 1))
    over = record_row(True, half.key, half.value, half.headers, "in", 3, 17, MAX_BODY)
    assert over[COL["kind"]] == EventKind.MALFORMED
    assert f"exceeds the limit of {MAX_BODY}" in over[COL["error"]]
    end = _valid(False, b"")
    odd = [(k, b"MAYBE" if k == "COMMIT_OR_ROLLBACK" else v) for k, v in end.headers]
    unknown = record_row(False, end.key, end.value, odd, "in", 3, 17, MAX_BODY)
    assert "unknown event type" in unknown[COL["error"]]
    garbage = record_row(False, b"\xff", b"\x00", [("\x00", None)], "in", 3, 17, MAX_BODY)
    assert garbage[COL["kind"]] == EventKind.MALFORMED and garbage[COL["error"]]
