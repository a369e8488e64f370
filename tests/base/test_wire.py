"""The Kafka wire codec: round trips, clear refusals, and no crash on arbitrary records."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txstream.errors import MalformedRecord
from txstream.message import MAX_BODY_BYTES, Decision, EndEvent, Message
from txstream.outputs import (
    decode_check,
    decode_history,
    decode_visible,
    encode_check,
    encode_dead_letter,
    encode_discard,
    encode_history,
    encode_visible,
)
from txstream.refusals import Code
from txstream.topics import Topics
from txstream.wire import (
    RESERVED_HEADERS,
    H,
    Record,
    decode_end,
    decode_half,
    encode_end,
    encode_half,
    header_dict,
    pack_headers,
    packed_header_dict,
    unpack_headers,
)

TOPICS = Topics.with_prefix("t_")
T0 = 1_700_000_000_000
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies -------------------------------------------------------------------------------

names = st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True).filter(lambda s: s not in
                                                                       (".", ".."))
txids = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() != "")
words = st.text(max_size=30)
nonempty = st.text(min_size=1, max_size=30)
props = st.dictionaries(st.text(max_size=15).filter(lambda k: k not in RESERVED_HEADERS), words,
                        max_size=4)
longs = st.integers(min_value=0, max_value=2**63 - 1)
ints = st.integers(min_value=0, max_value=2**31 - 1)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    txid = draw(txids)
    return Message(
        topic=draw(names),
        body=draw(st.binary(max_size=200)),
        tags=draw(st.none() | words),
        keys=draw(st.none() | words),
        properties=draw(props),
        transaction_id=txid,
        msg_id=draw(st.none() | nonempty) or txid,
        producer_group=draw(names),
        born_timestamp=draw(longs),
        check_immunity_time_s=draw(st.none() | ints),
    )


@st.composite
def end_events(draw: st.DrawFn) -> EndEvent:
    return EndEvent(
        transaction_id=draw(txids),
        producer_group=draw(nonempty),
        decision=draw(st.sampled_from(list(Decision))),
        from_check=draw(st.booleans()),
        check_times=draw(st.none() | ints),
        operator=draw(st.none() | nonempty),
        remark=draw(st.none() | nonempty),
        born_timestamp=draw(st.none() | longs),
    )


def msg(**kw: object) -> Message:
    base = Message(topic="orders", body=b"hello", tags="TagA", keys="K1",
                   properties={"color": "red", "ü": "ß"}, transaction_id="tx-1",
                   msg_id="m-1", producer_group="G", born_timestamp=T0,
                   check_immunity_time_s=30)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def half_headers(**override: bytes | None) -> list[tuple[str, bytes | None]]:
    base: dict[str, bytes | None] = {
        H.TRAN_MSG: b"true", H.REAL_TOPIC: b"orders", H.PGROUP: b"G",
        H.BORN_TIMESTAMP: str(T0).encode(),
    }
    base.update(override)
    return [(k, v) for k, v in base.items() if v is not None]


def end_headers(**override: bytes | None) -> list[tuple[str, bytes | None]]:
    base: dict[str, bytes | None] = {H.COMMIT_OR_ROLLBACK: b"COMMIT_MESSAGE", H.PGROUP: b"G"}
    base.update(override)
    return [(k, v) for k, v in base.items() if v is not None]


# --- round trips ------------------------------------------------------------------------------


def test_half_round_trip() -> None:
    m = msg()
    rec = encode_half(m, TOPICS)
    assert rec.topic == TOPICS.half and rec.key == b"tx-1" and rec.value == b"hello"
    assert decode_half(rec.key, rec.value, rec.headers) == m


@FAST
@given(messages())
def test_half_round_trip_any_message(m: Message) -> None:
    rec = encode_half(m, TOPICS)
    assert decode_half(rec.key, rec.value, rec.headers) == m


def test_half_without_required_fields_is_not_encoded() -> None:
    for missing in ("transaction_id", "producer_group", "born_timestamp"):
        with pytest.raises(ValueError, match="half message needs"):
            encode_half(msg(**{missing: None}), TOPICS)


@FAST
@given(end_events())
def test_end_round_trip(e: EndEvent) -> None:
    rec = encode_end(e, TOPICS)
    assert rec.topic == TOPICS.end and rec.key == e.transaction_id.encode()
    assert decode_end(rec.key, rec.value, rec.headers) == e


def test_end_round_trip_all_fields() -> None:
    e = EndEvent("tx-1", "G", Decision.UNKNOW, True, 3, "alice", "db timeout", T0)
    rec = encode_end(e, TOPICS)
    assert rec.value == b"db timeout"
    assert decode_end(rec.key, rec.value, rec.headers) == e


def test_unknown_decision_alias_is_the_rocketmq_spelling() -> None:
    e = EndEvent("tx-1", "G", Decision.UNKNOWN)
    assert header_dict(encode_end(e, TOPICS).headers)[H.COMMIT_OR_ROLLBACK] == "UNKNOW"


def _as_stored(request_message: Message) -> Message:
    """A check's message without the properties the request adds (RocketMQ's system ones)."""
    kept = {k: v for k, v in request_message.properties.items() if k not in RESERVED_HEADERS}
    return dataclasses.replace(request_message, properties=kept)


@FAST
@given(messages(), ints, st.none() | st.integers(0, 2**62), st.none() | st.integers(0, 2**62))
def test_check_round_trip(m: Message, times: int, valid_until: int | None,
                          life: int | None) -> None:
    rec = encode_check(m, times, TOPICS, valid_until, life)
    assert rec.topic == TOPICS.check(m.producer_group or "")
    back, back_times, back_until, back_life = decode_check(rec.key, rec.value, rec.headers)
    assert (back_times, back_until, back_life) == (times, valid_until, life)
    # The half message as it was stored, its immunity included ...
    assert _as_stored(back) == m
    # ... and what a Java listener reads through getProperty.
    assert back.get_property("TRANSACTION_CHECK_TIMES") == str(times)
    assert back.get_property("PGROUP") == m.producer_group
    assert back.get_property("UNIQ_KEY") == m.msg_id
    assert back.get_property("TRAN_MSG") == "true"


@FAST
@given(messages())
def test_visible_round_trip(m: Message) -> None:
    rec = encode_visible(m)
    assert rec.topic == m.topic
    assert rec.key == (m.keys.encode() if m.keys else None)
    back = decode_visible(rec.topic, rec.key, rec.value, rec.headers)
    assert _as_stored(back) == dataclasses.replace(m, check_immunity_time_s=None)
    # What a Java consumer reads with getProperty on a released message.
    assert back.get_property("TRAN_MSG") == "true"
    assert back.get_property("PGROUP") == m.producer_group


def test_discard_round_trip() -> None:
    m = msg()
    rec = encode_discard(m, "still unknown after 15 answered checks", 15, TOPICS)
    assert rec.topic == TOPICS.discard and rec.key == b"tx-1" and rec.value == b"hello"
    back, times, _, _ = decode_check(rec.key, rec.value, rec.headers)
    assert times == 15 and _as_stored(back) == m  # the half message as stored, with headers
    h = header_dict(rec.headers)
    assert h[H.DISCARD_REASON] == "still unknown after 15 answered checks"
    assert h[H.REAL_TOPIC] == "orders"


@pytest.mark.parametrize("original", [
    encode_end(EndEvent("tx-1", "G", Decision.ROLLBACK_MESSAGE, remark="x"), TOPICS),
    encode_half(msg(), TOPICS),
])
def test_dead_letter_keeps_the_original_record(original: Record) -> None:
    dead = encode_dead_letter(original, "why not", Code.WRONG_GROUP, (4, 1234), TOPICS)
    assert dead.topic == TOPICS.dead_letter
    assert (dead.key, dead.value) == (original.key, original.value)
    assert dead.headers[: len(original.headers)] == original.headers
    h = header_dict(dead.headers)
    assert h[H.DLQ_REASON] == "why not" and h[H.DLQ_ORIGIN_TOPIC] == original.topic
    assert h[H.DLQ_CODE] == "WRONG_GROUP" and H.DLQ_ORIGINAL_BYTES not in h
    assert (h[H.DLQ_ORIGIN_PARTITION], h[H.DLQ_ORIGIN_OFFSET]) == ("4", "1234")
    # The dead letter still decodes to the event it carries: it can be replayed as is.
    decode = decode_half if original.topic == TOPICS.half else decode_end
    assert decode(dead.key, dead.value, dead.headers) == decode(  # type: ignore[operator]
        original.key, original.value, original.headers)


@FAST
@given(txids, longs, st.sampled_from(["half", "released", "check_sent"]),
       st.dictionaries(st.text(max_size=10).filter(
                           lambda k: k not in ("at", "event", "transaction_id")),
                       st.none() | st.booleans() | st.integers() | words, max_size=4))
def test_history_round_trip(txid: str, at: int, event: str, detail: dict[str, object]) -> None:
    lines = [(txid, at, event, detail), (txid + "2", at + 1, "released", {})]
    [(rec, held)] = list(encode_history(lines, b"7", TOPICS))
    assert held == lines
    assert rec.topic == TOPICS.history and rec.key == b"7"
    assert decode_history(rec.value, rec.key) == [
        {"transaction_id": txid, "at": at, "event": event, **detail},
        {"transaction_id": txid + "2", "at": at + 1, "event": "released"},
    ]


def test_history_of_the_first_format_still_reads() -> None:
    # Before history was batched: one JSON object per record, keyed by the transaction id.
    assert decode_history(b'{"at":5,"event":"half"}', b"tx-1") == [
        {"transaction_id": "tx-1", "at": 5, "event": "half"}]


def test_reserved_names_in_user_properties_cannot_override_system_headers() -> None:
    m = msg(properties={H.PGROUP: "INTRUDER", H.TRANSACTION_ID: "tx-evil", "ok": "1"})
    back = decode_half(*encode_half(m, TOPICS)[1:])
    assert back.producer_group == "G" and back.properties == {"ok": "1"}
    rec = encode_visible(m)
    assert header_dict(rec.headers)[H.TRANSACTION_ID] == "tx-1"
    assert decode_visible(rec.topic, rec.key, rec.value, rec.headers).transaction_id == "tx-1"


def test_header_values_may_be_none_bytearray_or_memoryview() -> None:
    # Spark hands binary columns over as bytearray; kafka-python as bytes.
    items: list[Any] = [("a", None), ("b", bytearray(b"x")), ("c", memoryview(b"y"))]
    h = header_dict(items)
    assert h == {"a": "", "b": "x", "c": "y"}


# --- refusals ---------------------------------------------------------------------------------


def _reason(call: object, *args: object, **kw: object) -> str:
    with pytest.raises(MalformedRecord) as info:
        call(*args, **kw)  # type: ignore[operator]
    assert info.value.reason == str(info.value) and info.value.reason
    return info.value.reason


@pytest.mark.parametrize("key", [None, b"", b"   "])
def test_missing_key(key: bytes | None) -> None:
    assert "missing transaction id" in _reason(decode_half, key, b"v", half_headers())
    assert "missing transaction id" in _reason(decode_end, key, None, end_headers())


def test_non_utf8_key() -> None:
    assert "not UTF-8" in _reason(decode_end, b"\xff\xfe", None, end_headers())


def test_non_utf8_header() -> None:
    reason = _reason(decode_half, b"tx", b"v", half_headers(PGROUP=b"\xc3\x28"))
    assert "'PGROUP'" in reason and "UTF-8" in reason


@pytest.mark.parametrize("raw", [b"COMMIT", b"commit_message", b"UNKNOWN", b""])
def test_unknown_decision(raw: bytes) -> None:
    assert "unknown event type" in _reason(decode_end, b"tx", None,
                                           end_headers(COMMIT_OR_ROLLBACK=raw))


def test_end_without_decision_or_group() -> None:
    assert H.COMMIT_OR_ROLLBACK in _reason(decode_end, b"tx", None,
                                           end_headers(COMMIT_OR_ROLLBACK=None))
    assert "missing header PGROUP" in _reason(decode_end, b"tx", None, end_headers(PGROUP=None))
    assert "missing header PGROUP" in _reason(decode_end, b"tx", None, end_headers(PGROUP=b""))


@pytest.mark.parametrize("flag", [None, b"false", b"", b"yes"])
def test_half_without_tran_msg(flag: bytes | None) -> None:
    assert "TRAN_MSG" in _reason(decode_half, b"tx", b"v", half_headers(TRAN_MSG=flag))


@pytest.mark.parametrize("name", [H.PGROUP, H.REAL_TOPIC, H.BORN_TIMESTAMP])
@pytest.mark.parametrize("value", [None, b""])
def test_half_missing_required_header(name: str, value: bytes | None) -> None:
    reason = _reason(decode_half, b"tx", b"v", half_headers(**{name: value}))
    assert reason == f"missing header {name}"


@pytest.mark.parametrize(("name", "value"), [
    (H.BORN_TIMESTAMP, b"yesterday"),
    (H.BORN_TIMESTAMP, b"-5"),
    (H.BORN_TIMESTAMP, b"1e3"),
    (H.BORN_TIMESTAMP, "١٢٣".encode()),  # Arabic-Indic digits: int() takes them, Java does not
    (H.BORN_TIMESTAMP, "12²".encode()),  # a digit to str.isdigit, not to Java
    *((H.BORN_TIMESTAMP, text) for text in (b"+1", b" 10", b"1_0", b"10\n")),  # int() takes
    (H.BORN_TIMESTAMP, str(2**63).encode()),  # does not fit a Kafka/Spark long
    (H.BORN_TIMESTAMP, b"9" * 5000),  # past Python's int-parsing limit
    (H.CHECK_IMMUNITY, b"-2"),  # -1 is RocketMQ's "not set"; nothing below it means anything
    (H.CHECK_IMMUNITY, str(2**31).encode()),  # does not fit the int column
])
def test_half_bad_integer_header(name: str, value: bytes) -> None:
    reason = _reason(decode_half, b"tx", b"v", half_headers(**{name: value}))
    assert name in reason and "integer" in reason


def test_check_immunity_minus_one_is_rocketmqs_not_set() -> None:
    m = decode_half(b"tx", b"v", half_headers(**{H.CHECK_IMMUNITY: b"-1"}))
    assert m.check_immunity_time_s == -1  # the timers then use the transaction timeout


def test_end_bad_check_times() -> None:
    reason = _reason(decode_end, b"tx", None, end_headers(**{H.CHECK_TIMES: b"-2"}))
    assert H.CHECK_TIMES in reason


@pytest.mark.parametrize(("name", "value"), [
    (H.REAL_TOPIC, b"has space"),
    (H.REAL_TOPIC, b"x" * 250),
    (H.REAL_TOPIC, b".."),
    (H.PGROUP, b"bad/group"),
    (H.PGROUP, b"g" * 201),
])
def test_half_invalid_topic_or_group(name: str, value: bytes) -> None:
    # Either would fail later, in the sink, for every retry of the batch: refuse it here.
    reason = _reason(decode_half, b"tx", b"v", half_headers(**{name: value}))
    assert name in reason


def test_body_over_max_size() -> None:
    assert "exceeds the limit of 4" in _reason(decode_half, b"tx", b"12345", half_headers(),
                                               max_body=4)
    big = b"\0" * (MAX_BODY_BYTES + 1)
    assert str(MAX_BODY_BYTES) in _reason(decode_half, b"tx", big, half_headers())
    assert decode_half(b"tx", b"1234", half_headers(), max_body=4).body == b"1234"


def test_check_without_topic_or_times() -> None:
    rec = encode_check(msg(), 2, TOPICS)
    headers = [(k, v) for k, v in rec.headers if k != H.CHECK_TIMES]
    assert "missing header TRANSACTION_CHECK_TIMES" in _reason(decode_check, rec.key, rec.value,
                                                               headers)
    headers = [(k, v) for k, v in rec.headers if k != H.REAL_TOPIC]
    assert "missing header REAL_TOPIC" in _reason(decode_check, rec.key, rec.value, headers)


@pytest.mark.parametrize(("headers", "text"), [
    ([("a",)], "not a (name, value) pair"),
    ([("a", b"x", b"y")], "not a (name, value) pair"),
    ([42], "not a (name, value) pair"),
    ([(b"PGROUP", b"G")], "name is not text"),
    ([("PGROUP", "G")], "not bytes"),
    ([("PGROUP", -1)], "not bytes"),
    ([("PGROUP", 10**12)], "not bytes"),  # bytes(10**12) would zero a terabyte
])
def test_malformed_header_items(headers: list[object], text: str) -> None:
    assert text in _reason(header_dict, headers)


@pytest.mark.parametrize("value", [b"not json", b"[1, 2]", b"", None, b"\xff", b"3"])
def test_bad_history(value: bytes | None) -> None:
    assert "history record" in _reason(decode_history, value)


def test_non_bytes_key_or_value() -> None:
    assert "key" in _reason(decode_end, "tx", None, end_headers())
    assert "value" in _reason(decode_half, b"tx", 12, half_headers())


# --- fuzz -------------------------------------------------------------------------------------

_VALUES = st.one_of(
    st.none(),
    st.binary(max_size=12),
    st.sampled_from([b"true", b"COMMIT_MESSAGE", b"ROLLBACK_MESSAGE", b"UNKNOW", b"G", b"orders",
                     b"1700000000000", b"-1", b"0", b"99999999999999999999", b"\xff"]),
)
_GOOD_ITEMS = st.tuples(st.sampled_from(sorted(RESERVED_HEADERS)) | st.text(max_size=8), _VALUES)
_JUNK_ITEMS = st.one_of(
    st.tuples(st.text(max_size=3)),
    st.tuples(st.binary(max_size=3), _VALUES),
    st.tuples(st.text(max_size=3), st.integers(-3, 3) | st.text(max_size=3) | st.floats()),
    st.integers(-3, 3),
    st.none(),
)
_HEADERS = st.none() | st.lists(_GOOD_ITEMS | _JUNK_ITEMS, max_size=12)
_KEYS = st.none() | st.binary(max_size=12) | st.sampled_from([b"tx-1", b" ", b"\xff"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_KEYS, st.none() | st.binary(max_size=40), _HEADERS, st.integers(0, 64))
def test_decoders_raise_only_malformed_record(
    key: bytes | None, value: bytes | None, headers: list[object] | None, max_body: int
) -> None:
    for decode in (
        lambda: decode_half(key, value, headers, max_body),  # type: ignore[arg-type]
        lambda: decode_end(key, value, headers),  # type: ignore[arg-type]
        lambda: decode_check(key, value, headers),  # type: ignore[arg-type]
    ):
        try:
            out = decode()
        except MalformedRecord as e:
            assert e.reason
        else:
            assert out is not None


@settings(max_examples=200, deadline=None)
@given(messages(), st.lists(st.tuples(st.sampled_from(sorted(RESERVED_HEADERS)), _VALUES),
                            max_size=4))
def test_tampered_half_records_decode_or_raise_malformed(
    m: Message, extra: list[tuple[str, bytes | None]]
) -> None:
    # Valid records with system headers appended (later ones win in header_dict).
    rec = encode_half(m, TOPICS)
    try:
        back = decode_half(rec.key, rec.value, [*rec.headers, *extra])
    except MalformedRecord as e:
        assert e.reason
    else:
        assert back.transaction_id == m.transaction_id and back.body == m.body


@FAST
@given(st.lists(st.tuples(st.text(max_size=20), st.none() | st.binary(max_size=300)),
                max_size=12))
def test_packed_headers_round_trip(headers: list[tuple[str, bytes | None]]) -> None:
    assert unpack_headers(pack_headers(headers)) == [(k, v or b"") for k, v in headers]


@FAST
@given(st.binary(max_size=64))
def test_unpacking_any_bytes_gives_headers_or_malformed_record(blob: bytes) -> None:
    try:
        unpack_headers(blob)
    except MalformedRecord:
        pass


def _outcome(decode: Any) -> object:
    try:
        return decode()
    except MalformedRecord as e:
        return ("malformed", e.reason, e.code)


@FAST
@given(st.binary(max_size=64) | st.lists(
    st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=6).map(pack_headers))
def test_packed_header_dict_is_header_dict_of_the_unpacked_headers(blob: bytes) -> None:
    # The fused decoder must read and refuse exactly what the two steps did.
    assert _outcome(lambda: packed_header_dict(blob)) == \
        _outcome(lambda: header_dict(unpack_headers(blob)))
