"""Bad input: no Kafka record, however broken, crashes the coordinator's parsing.

Every record of the half and end topics goes through two steps: the source turns it into a row
(``txstream.sources.event_rows.record_row``: raw key, value, packed headers and the state key), and
the operator decodes the row (``txstream.sources.events.parse_event``). Whatever comes in, the row
must be one Spark accepts (the Arrow batch builds), and a record that cannot be decoded must come
out ``Malformed`` with a reason, to be dead-lettered with the record intact. Random records, and
valid records with one header broken, are thrown at both.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txstream.message import Decision, EndEvent, Message
from txstream.schema import EVENT_COLUMNS, EventKind
from txstream.sources.event_rows import (
    NUM_COLUMNS,
    arrow_schema,
    event_struct,
    record_row,
    rows_to_batch,
)
from txstream.sources.events import Malformed, parse_event
from txstream.state.keys import UNROUTABLE, KeyLayout, state_key
from txstream.topics import Topics
from txstream.wire import encode_end, encode_half, unpack_headers

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_BODY = 64  # small, so that "body over the size limit" comes up often
COL = {name: i for i, (name, _) in enumerate(EVENT_COLUMNS)}
TOPICS = Topics()
LAYOUT = KeyLayout()


ARROW = arrow_schema(event_struct())

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


def _check(is_half: bool, key: Any, value: Any, hdrs: Any) -> Message | EndEvent | Malformed:
    row = record_row(is_half, key, value, hdrs, 3, 17, LAYOUT)
    assert len(row) == NUM_COLUMNS
    assert row[COL["kind"]] == (EventKind.HALF if is_half else EventKind.END)
    assert (row[COL["src_partition"]], row[COL["src_offset"]]) == (3, 17)
    # The record travels as read: a dead letter gives it back byte for byte (a null header
    # value as an empty one, the way Kafka clients write it anyway).
    assert row[COL["key"]] == key and row[COL["value"]] == value
    assert unpack_headers(row[COL["headers"]]) == [(k, v or b"") for k, v in hdrs or ()]
    rows_to_batch([row], ARROW)  # Spark gets a batch it accepts, whatever came in
    event = parse_event(row[COL["kind"]], key, value, row[COL["headers"]], 3, 17, MAX_BODY)
    if isinstance(event, Malformed):
        assert event.reason, "a malformed record says why"
    else:
        # A decoded event's transaction lives under the state key its record was routed by.
        assert row[COL["state_key"]] != UNROUTABLE
        assert row[COL["state_key"]] == state_key(event.transaction_id, LAYOUT)
        assert bytes(key).decode("utf-8") == event.transaction_id
    if isinstance(event, Message):
        assert len(event.body) <= MAX_BODY
        assert (event.queue_id, event.queue_offset) == (3, 17)
    return event


@FUZZ
@given(is_half=st.booleans(), key=blobs, value=blobs, hdrs=headers)
def test_any_record_becomes_a_row_and_an_event_or_a_reason(
    is_half: bool, key: Any, value: Any, hdrs: Any
) -> None:
    _check(is_half, key, value, hdrs)


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
    _check(is_half, key, record.value, hdrs)


def test_valid_records_decode_to_their_events() -> None:
    half = _valid(True, b"body")
    event = _check(True, half.key, half.value, half.headers)
    assert isinstance(event, Message) and event.body == b"body" and event.topic == "orders"
    end = _valid(False, b"")
    event = _check(False, end.key, end.value, end.headers)
    assert isinstance(event, EndEvent) and event.decision is Decision.COMMIT_MESSAGE


def test_the_bad_inputs_of_the_issue_are_malformed_with_their_reason() -> None:
    """A body over the limit, an unknown event type and plain garbage each come out
    ``Malformed`` with a reason; a key that cannot be routed gets the unroutable state key."""
    half = _valid(True, b"x" * (MAX_BODY + 1))
    over = _check(True, half.key, half.value, half.headers)
    assert isinstance(over, Malformed) and f"exceeds the limit of {MAX_BODY}" in over.reason
    end = _valid(False, b"")
    odd = [(k, b"MAYBE" if k == "COMMIT_OR_ROLLBACK" else v) for k, v in end.headers]
    unknown = _check(False, end.key, end.value, odd)
    assert isinstance(unknown, Malformed) and "unknown event type" in unknown.reason
    garbage = _check(False, b"\xff", b"\x00", [("\x00", None)])
    assert isinstance(garbage, Malformed) and garbage.reason
    assert record_row(False, b"\xff", b"", [], 0, 0, LAYOUT)[COL["state_key"]] == UNROUTABLE
