"""What the coordinator writes, against the size limit it writes under: no record it emits may
be one the broker refuses, and a refused record is never lost from sight."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.base.test_wire import messages
from txstream.message import Decision, EndEvent, Message, RawRecord
from txstream.outputs import (
    MAX_REASON_BYTES,
    decode_history,
    encode_check,
    encode_dead_letter,
    encode_discard,
    encode_history,
    encode_visible,
    largest_output_bytes,
    record_bytes,
)
from txstream.refusals import Code
from txstream.schema import EventKind
from txstream.sources.events import Malformed, parse_event
from txstream.state.effects import DeadLetter
from txstream.streaming.engine.records import history_rows, records_for
from txstream.topics import Topics
from txstream.wire import H, Record, encode_end, encode_half, header_dict, pack_headers

TOPICS = Topics.with_prefix("o_")
SOME = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _kafka_size(record: Record) -> int:
    """kafka-python's own estimate of a one-record batch, what the producer checks."""
    return int(DefaultRecordBatchBuilder.estimate_size_in_bytes(
        record.key, record.value, list(record.headers)))


@SOME
@given(messages(), st.binary(max_size=2000))
def test_the_size_estimate_is_never_below_kafkas(m: Message, body: bytes) -> None:
    m.body = body
    for record in (encode_visible(m), encode_check(m, 3, TOPICS),
                   encode_discard(m, "x" * 80, 3, TOPICS), encode_half(m, TOPICS)):
        assert record_bytes(record.key, record.value, record.headers) >= _kafka_size(record)


@SOME
@given(messages(), st.integers(min_value=0, max_value=2**31 - 1))
def test_no_output_of_a_half_message_is_bigger_than_announced(m: Message, checks: int) -> None:
    limit = largest_output_bytes(m)
    reasons = ("r" * (MAX_REASON_BYTES + 50), "é" * MAX_REASON_BYTES, "r€" * 200)  # cut
    for record in (encode_visible(m), encode_check(m, checks, TOPICS),
                   *(encode_discard(m, reason, checks, TOPICS) for reason in reasons)):
        with_id = [*record.headers, (H.RECORD_ID, b"ffffffff.-4611686018427387904."
                                     b"1700000000000.9223372036854775807")]
        assert _kafka_size(record._replace(headers=tuple(with_id))) <= limit


@pytest.mark.parametrize("reason, kept", [
    ("short", "short"),
    ("x" * MAX_REASON_BYTES, "x" * MAX_REASON_BYTES),
    ("x" * (MAX_REASON_BYTES + 1), "x" * (MAX_REASON_BYTES - 3) + "…"),
    ("é" * MAX_REASON_BYTES, "é" * ((MAX_REASON_BYTES - 3) // 2) + "…"),  # no half character
])
def test_a_discard_reason_is_cut_to_its_bytes(reason: str, kept: str) -> None:
    m = Message(topic="real", body=b"b", transaction_id="tx", producer_group="g")
    got = header_dict(encode_discard(m, reason, 1, TOPICS).headers)[H.DISCARD_REASON]
    assert got == kept and len(got.encode("utf-8")) <= MAX_REASON_BYTES


# The widest record id the bound allows for: tag, key, epoch, number (records.record_id).
_WIDEST_ID = (H.RECORD_ID, b"f" * 8 + b"." + b"9" * 20 + b"." + b"9" * 13 + b"." + b"9" * 19)


@SOME
@given(messages())
def test_the_output_bound_is_the_widest_discard_or_the_release_exactly(m: Message) -> None:
    # Counted without building the records: it must still be what they would measure.
    discard = encode_discard(m, "x" * MAX_REASON_BYTES, 9_999_999_999, TOPICS)
    release = encode_visible(m)
    assert largest_output_bytes(m) == max(
        record_bytes(r.key, r.value, (*r.headers, _WIDEST_ID)) for r in (discard, release))


def _half_row(body: bytes) -> tuple[bytes, bytes, bytes]:
    m = Message("orders", body, transaction_id="tx-9", msg_id="tx-9", producer_group="G",
                born_timestamp=1_700_000_000_000)
    record = encode_half(m, TOPICS)
    return record.key or b"", record.value or b"", pack_headers(record.headers)


def test_a_half_message_whose_records_would_not_fit_is_refused_as_it_comes() -> None:
    key, value, headers = _half_row(b"x" * 3_000)
    assert isinstance(parse_event(EventKind.HALF, key, value, headers, 0, 5, max_record=4_000),
                      Message)
    key, value, headers = _half_row(b"x" * 3_900)
    refused = parse_event(EventKind.HALF, key, value, headers, 0, 6, max_record=4_000)
    assert isinstance(refused, Malformed) and refused.code == Code.OUTPUTS_TOO_LARGE
    assert "over the limit of 4000 bytes" in refused.reason


def test_a_dead_letter_too_big_to_carry_its_record_carries_a_reference() -> None:
    original = Record(TOPICS.half, b"tx-9", b"v" * 5_000, (("A", b"1"),))
    dead = encode_dead_letter(original, "why", Code.MALFORMED_HEADERS, (1, 77), TOPICS, 4_000)
    assert dead.topic == TOPICS.dead_letter and dead.value is None and dead.key == b"tx-9"
    h = header_dict(dead.headers)
    assert h[H.DLQ_CODE] == "MALFORMED_HEADERS" and h[H.DLQ_REASON].startswith("why (the record")
    assert (h[H.DLQ_ORIGIN_TOPIC], h[H.DLQ_ORIGIN_PARTITION], h[H.DLQ_ORIGIN_OFFSET]) == (
        TOPICS.half, "1", "77")
    assert int(h[H.DLQ_ORIGINAL_BYTES]) >= 5_000
    assert "A" not in h  # the reference does not carry the record's headers
    assert record_bytes(dead.key, dead.value, dead.headers) < 4_000
    whole = encode_dead_letter(original, "why", Code.MALFORMED_HEADERS, (1, 77), TOPICS, 8_000)
    assert whole.value == original.value and H.DLQ_ORIGINAL_BYTES not in header_dict(whole.headers)


def test_a_refused_end_event_is_dead_lettered_byte_for_byte_also_when_held() -> None:
    # A third-party producer's end event: its own header, FROM_TRANSACTION_CHECK left out, an
    # empty value. The dead letter must be that record, not txstream's re-encoding of it.
    headers = pack_headers([("COMMIT_OR_ROLLBACK", b"COMMIT_MESSAGE"), ("PGROUP", b"other"),
                            ("X-Trace", b"abc")])
    raw = RawRecord(1, 42, b"tx-9", b"", headers)
    end = EndEvent("tx-9", "other", Decision.COMMIT_MESSAGE, raw=raw)
    [emit] = records_for([DeadLetter(end, "wrong group", Code.WRONG_GROUP)], TOPICS)
    record = emit.record
    assert (record.key, record.value) == (b"tx-9", b"")
    assert record.headers[:3] == (("COMMIT_OR_ROLLBACK", b"COMMIT_MESSAGE"),
                                  ("PGROUP", b"other"), ("X-Trace", b"abc"))
    h = header_dict(record.headers)
    assert H.FROM_CHECK not in h and h[H.DLQ_CODE] == "WRONG_GROUP"
    assert (h[H.DLQ_ORIGIN_TOPIC], h[H.DLQ_ORIGIN_PARTITION], h[H.DLQ_ORIGIN_OFFSET]) == (
        TOPICS.end, "1", "42")
    # Without the record (an admin's event made in memory), txstream's encoding stands in.
    made = EndEvent("tx-9", "G", Decision.ROLLBACK_MESSAGE)
    [emit] = records_for([DeadLetter(made, "late", Code.CONTRADICTS_OUTCOME)], TOPICS)
    assert emit.record.headers[:len(encode_end(made, TOPICS).headers)] == \
        encode_end(made, TOPICS).headers


def test_a_user_property_named_remark_reaches_the_released_message() -> None:
    m = Message("orders", b"b", properties={"REMARK": "gift wrap"}, transaction_id="t",
                msg_id="t", producer_group="G", born_timestamp=1)
    key, value, headers = encode_half(m, TOPICS).key, m.body, encode_half(m, TOPICS).headers
    parsed = parse_event(EventKind.HALF, key, value, pack_headers(headers), 0, 0)
    assert isinstance(parsed, Message) and parsed.properties == {"REMARK": "gift wrap"}
    assert header_dict(encode_visible(parsed).headers)["REMARK"] == "gift wrap"


def test_a_batch_of_history_too_big_for_one_record_is_split_and_loses_no_line() -> None:
    from txstream.state.effects import Note, NoteKind

    notes = [Note(f"tx-{i:04d}", NoteKind.HALF, 1_700_000_000_000 + i, {"group": "G" * 50})
             for i in range(200)]
    emits = list(history_rows(notes, 7, TOPICS, limit=4_000))
    assert len(emits) > 1
    seen = [line["transaction_id"] for e in emits for line in json.loads(e.record.value or b"")]
    assert seen == [n.transaction_id for n in notes]
    for e in emits:
        assert record_bytes(e.record.key, e.record.value, e.record.headers) < 4_000


def test_history_records_are_the_lines_packed_one_by_one_at_every_limit() -> None:
    # A batch's history is encoded at once when it fits: at every limit around where it stops
    # fitting, the records must be those of packing its lines one by one.
    notes = [(f"tx-{i}", 1_700_000_000_000 + i, "released",
              {"decision": "é\u2028\"", "n": i, "late": i / 3, "none": None})
             for i in range(4)]
    lines = [orjson.dumps({"transaction_id": t, "at": at, "event": e, **d})
             for t, at, e, d in notes]
    whole = len(b",".join(lines)) + 2
    for limit in range(whole - 200, whole + 300):
        packed: list[list[bytes]] = [[]]
        for line in lines:
            records = [*(packed[:-1]), [*packed[-1], line]]
            if packed[-1] and len(b",".join(records[-1])) + 2 >= _budget(limit):
                records = [*packed, [line]]
            packed = records
        got = [(r.value, [n[0] for n in held])
               for r, held in encode_history(notes, b"7", TOPICS, limit)]
        assert got == [(b"[" + b",".join(part) + b"]",
                        [json.loads(line)["transaction_id"] for line in part])
                       for part in packed]


@pytest.mark.parametrize("detail", [
    {"remark": "é\u2028\"\n", "late": 1 / 3, "none": None},
    {"remark": "é", "checks": 2**70},  # beyond 64 bits: orjson refuses, the standard one writes
])
def test_history_lines_read_as_the_standard_encoder_writes_them(detail: dict[str, object]
                                                                ) -> None:
    # orjson writes non-ASCII text as UTF-8 where the standard encoder escapes it: the same
    # JSON, which every reader decodes alike.
    notes = [("tx-é", 1, "released", detail)]
    (record, _), = encode_history(notes, b"7", TOPICS)
    assert decode_history(record.value) == [
        json.loads(json.dumps({"transaction_id": "tx-é", "at": 1, "event": "released",
                               **detail}))]


def _budget(limit: int) -> int:
    """What a history record's value may take under ``limit``: the limit less the
    overhead of a one-record batch, its widest id header and its key (record_bytes)."""
    widest_id = (H.RECORD_ID, b"f" * 8 + b"." + b"9" * 20 + b"." + b"9" * 13 + b"." + b"9" * 19)
    return limit - record_bytes(b"7", b"", (widest_id,))
