"""How producers' records travel on Kafka: half messages and end events (``docs/wire-format.md``).

A record's key is the transaction id, its value the message body untouched; everything else
travels as UTF-8 headers named after RocketMQ's message properties. What the coordinator
writes (check requests, released messages, discards, dead letters, history) is
:mod:`txstream.outputs`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from txstream.errors import ConfigError, MalformedRecord
from txstream.headers import (
    Headers,
    header_dict,
    headers_tuple,
    pack_headers,
    packed_header_dict,
    unpack_headers,
)
from txstream.message import (
    CHECK_IMMUNITY_PROPERTY,
    MAX_BODY_BYTES,
    Decision,
    EndEvent,
    Message,
    RawRecord,
)
from txstream.refusals import Code
from txstream.topics import Topics, validate_group, validate_topic

__all__ = [
    "H",
    "utf8",
    "int_header",
    "body_bytes",
    "transaction_id_of",
    "user_properties",
    "message_headers",
    "message_from",
    "half_headers",
    "INT_LIMIT",
    "RESERVED_HEADERS",
    "END_HEADERS",
    "Record",
    "Headers",
    "encode_half",
    "decode_half",
    "encode_end",
    "decode_end",
    "header_dict",
    "headers_tuple",
    "pack_headers",
    "unpack_headers",
    "packed_header_dict",
    "half_from_text",
    "end_from_text",
]

class H:
    """Header names. RocketMQ's property names where it has one."""

    TRAN_MSG = "TRAN_MSG"
    PGROUP = "PGROUP"
    REAL_TOPIC = "REAL_TOPIC"
    UNIQ_KEY = "UNIQ_KEY"
    TRANSACTION_ID = "__transactionId__"
    TAGS = "TAGS"
    KEYS = "KEYS"
    BORN_TIMESTAMP = "BORN_TIMESTAMP"
    CHECK_IMMUNITY = CHECK_IMMUNITY_PROPERTY
    CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    CHECK_VALID_UNTIL = "CHECK_VALID_UNTIL"
    # Which registration of the transaction a check request is of (the coordinator's time of
    # it, ms): checks are ordered by (life, TRANSACTION_CHECK_TIMES).
    CHECK_LIFE = "TXSTREAM_CHECK_LIFE"
    COMMIT_OR_ROLLBACK = "COMMIT_OR_ROLLBACK"
    FROM_CHECK = "FROM_TRANSACTION_CHECK"
    REMARK = "REMARK"
    OPERATOR = "ADMIN_OPERATOR"
    DISCARD_REASON = "DISCARD_REASON"
    DLQ_REASON = "DLQ_REASON"
    DLQ_CODE = "DLQ_CODE"
    DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
    DLQ_ORIGIN_PARTITION = "DLQ_ORIGIN_PARTITION"
    DLQ_ORIGIN_OFFSET = "DLQ_ORIGIN_OFFSET"
    DLQ_ORIGINAL_BYTES = "DLQ_ORIGINAL_BYTES"
    # On every record the coordinator writes: stable across a replayed micro-batch, so the sink
    # can tell what a crashed run already wrote (sinks.kafka_sink).
    RECORD_ID = "TXSTREAM_RECORD_ID"


# What an end event's headers mean; on a message they would be plain user properties.
END_HEADERS = frozenset({H.COMMIT_OR_ROLLBACK, H.FROM_CHECK, H.REMARK, H.OPERATOR})
# Names a message's user property cannot have: they mean something on a half message, a check
# request, a released message, a discard or a dead letter. A producer of another language
# that sets one anyway: the coordinator reads it as what it means, and does not pass it on.
RESERVED_HEADERS = frozenset(v for k, v in vars(H).items() if k.isupper()) - END_HEADERS

_LONG = 2**63 - 1  # Kafka/Spark bigint
INT_LIMIT = 2**31 - 1  # Spark int: check_times and immunity_s columns
_BYTES = (bytes, bytearray, memoryview)


class Record(NamedTuple):
    """A Kafka record to write or as read (headers in order, duplicates allowed)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


def utf8(text: str) -> bytes:
    return text.encode("utf-8")


def int_header(
    h: Mapping[str, str], name: str, *, required: bool = False, limit: int = _LONG,
    minus_one: bool = False,
) -> int | None:
    """A non-negative integer header, as Java would parse it and as the Spark column holds it;
    with ``minus_one``, also ``-1`` (RocketMQ's "not set")."""
    text = h.get(name)
    if text is None or text == "":
        if required:
            raise MalformedRecord(f"missing header {name}", Code.MISSING_HEADER)
        return None
    if minus_one and text == "-1":
        return -1
    # [0-9]{1,19} without a regular expression: the only ASCII characters isdigit takes.
    value = int(text) if len(text) <= 19 and text.isascii() and text.isdigit() else None
    if value is None or value > limit:
        raise MalformedRecord(
            f"header {name} is not an integer in 0..{limit}: {text[:40]!r}", Code.INVALID_HEADER
        )
    return value


def body_bytes(value: object) -> bytes | None:
    if value is not None and not isinstance(value, _BYTES):
        raise MalformedRecord("record value is not bytes", Code.UNDECODABLE)
    return bytes(value) if value is not None else None


def transaction_id_of(key: bytes | None, h: Mapping[str, str]) -> str:
    if key is not None and not isinstance(key, _BYTES):
        raise MalformedRecord("record key is not bytes", Code.MALFORMED_KEY)
    if not key:
        raise MalformedRecord("missing transaction id (record key)", Code.MALFORMED_KEY)
    try:
        txid = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRecord("transaction id (record key) is not UTF-8 text",
                              Code.MALFORMED_KEY) from None
    if not txid.strip():
        raise MalformedRecord("missing transaction id (record key)", Code.MALFORMED_KEY)
    return txid


def user_properties(h: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in h.items() if k not in RESERVED_HEADERS}


def message_headers(msg: Message) -> list[tuple[str, bytes]]:
    # A user property named like a system header is not written: the decoder keeps the last
    # header of a name, so it could replace the group, the topic or the transaction id.
    out: list[tuple[str, bytes]] = []
    if msg.tags is not None:
        out.append((H.TAGS, utf8(msg.tags)))
    if msg.keys is not None:
        out.append((H.KEYS, utf8(msg.keys)))
    if msg.msg_id is not None:
        out.append((H.UNIQ_KEY, utf8(msg.msg_id)))
    if msg.producer_group is not None:
        out.append((H.PGROUP, utf8(msg.producer_group)))
    if msg.born_timestamp is not None:
        out.append((H.BORN_TIMESTAMP, utf8(str(msg.born_timestamp))))
    out.extend((k, utf8(v)) for k, v in msg.properties.items() if k not in RESERVED_HEADERS)
    return out


def message_from(
    key: bytes | None, value: bytes | None, h: Mapping[str, str], topic: str
) -> Message:
    return _message_from(key, value, h, topic, int_header(h, H.BORN_TIMESTAMP))


def _message_from(key: bytes | None, value: bytes | None, h: Mapping[str, str], topic: str,
                  born: int | None) -> Message:
    """:func:`message_from` with its born timestamp read already (a half message's is checked
    before anything else: not read twice)."""
    txid = transaction_id_of(key, h)
    return Message(
        topic=topic,
        body=bytes(value) if value is not None else b"",
        tags=h.get(H.TAGS),
        keys=h.get(H.KEYS),
        properties=user_properties(h),
        transaction_id=txid,
        msg_id=h.get(H.UNIQ_KEY) or txid,
        producer_group=h.get(H.PGROUP),
        born_timestamp=born,
        check_immunity_time_s=int_header(h, H.CHECK_IMMUNITY, limit=INT_LIMIT, minus_one=True),
    )


# --- half messages -------------------------------------------------------------------------


def half_headers(msg: Message) -> list[tuple[str, bytes]]:
    """The headers of a half message; check requests and discards carry the same."""
    headers = [(H.TRAN_MSG, b"true"), (H.REAL_TOPIC, utf8(msg.topic)), *message_headers(msg)]
    if msg.check_immunity_time_s is not None:
        headers.append((H.CHECK_IMMUNITY, utf8(str(msg.check_immunity_time_s))))
    return headers


def encode_half(msg: Message, topics: Topics) -> Record:
    """The half message as written to the half topic (invisible to consumers)."""
    if not msg.transaction_id or not msg.producer_group or msg.born_timestamp is None:
        raise ValueError("a half message needs transaction_id, producer_group and born_timestamp")
    return Record(topics.half, utf8(msg.transaction_id), msg.body, tuple(half_headers(msg)))


def decode_half(
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
    max_body: int = MAX_BODY_BYTES,
) -> Message:
    return half_from_text(key, value, header_dict(headers), max_body)


def half_from_text(
    key: bytes | None, value: bytes | None, h: Mapping[str, str], max_body: int = MAX_BODY_BYTES
) -> Message:
    """A half message from its key, value and headers already decoded to text."""
    if h.get(H.TRAN_MSG, "").lower() != "true":
        raise MalformedRecord(f"unknown event type on the half topic: {H.TRAN_MSG} is not 'true'",
                              Code.UNKNOWN_EVENT)
    topic = h.get(H.REAL_TOPIC)
    if not topic:
        raise MalformedRecord(f"missing header {H.REAL_TOPIC}", Code.MISSING_HEADER)
    group = h.get(H.PGROUP)
    if not group:
        raise MalformedRecord(f"missing header {H.PGROUP}", Code.MISSING_HEADER)
    # The topic receives the release and the group names the check topic: a bad name would
    # fail in the sink, again on every retry of the batch, long after this record was read.
    try:
        validate_topic(topic)
    except ConfigError as e:
        raise MalformedRecord(f"header {H.REAL_TOPIC}: {e}", Code.INVALID_HEADER) from None
    try:
        validate_group(group)
    except ConfigError as e:
        raise MalformedRecord(f"header {H.PGROUP}: {e}", Code.INVALID_HEADER) from None
    born = int_header(h, H.BORN_TIMESTAMP, required=True)
    body = body_bytes(value)
    if body is not None and len(body) > max_body:
        raise MalformedRecord(f"body of {len(body)} bytes exceeds the limit of {max_body}",
                              Code.BODY_TOO_LARGE)
    return _message_from(key, body, h, topic, born)


# --- end events (commit / rollback / unknown, and check answers) -----------------------------


def encode_end(event: EndEvent, topics: Topics) -> Record:
    headers = [
        (H.COMMIT_OR_ROLLBACK, utf8(event.decision.value)),
        (H.PGROUP, utf8(event.producer_group)),
        (H.FROM_CHECK, b"true" if event.from_check else b"false"),
    ]
    if event.check_times is not None:
        headers.append((H.CHECK_TIMES, utf8(str(event.check_times))))
    if event.operator is not None:
        headers.append((H.OPERATOR, utf8(event.operator)))
    if event.born_timestamp is not None:
        headers.append((H.BORN_TIMESTAMP, utf8(str(event.born_timestamp))))
    value = utf8(event.remark) if event.remark else None
    if value is not None:
        headers.append((H.REMARK, b"true"))
    return Record(topics.end, utf8(event.transaction_id), value, tuple(headers))


def decode_end(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None
) -> EndEvent:
    return end_from_text(key, value, header_dict(headers))


# Decision(text) goes through Enum's lookup machinery; every end event asks.
_DECISIONS = {decision.value: decision for decision in Decision}


def end_from_text(key: bytes | None, value: bytes | None, h: Mapping[str, str],
                  raw: RawRecord | None = None) -> EndEvent:
    """An end event from its key, value and headers already decoded to text; ``raw``: the
    record it was read from (made here, not copied in afterwards: a frozen dataclass's copy
    costs as much as decoding it)."""
    txid = transaction_id_of(key, h)
    text = h.get(H.COMMIT_OR_ROLLBACK)
    if text is None:
        raise MalformedRecord(f"unknown event type: missing header {H.COMMIT_OR_ROLLBACK}",
                              Code.UNKNOWN_EVENT)
    decision = _DECISIONS.get(text)
    if decision is None:
        raise MalformedRecord(f"unknown event type {text[:40]!r}", Code.UNKNOWN_EVENT)
    group = h.get(H.PGROUP)
    if not group:
        raise MalformedRecord(f"missing header {H.PGROUP}", Code.MISSING_HEADER)
    remark = None
    body = body_bytes(value)
    if body:
        remark = body.decode("utf-8", errors="replace")
    return EndEvent(
        transaction_id=txid,
        producer_group=group,
        decision=decision,
        from_check=h.get(H.FROM_CHECK, "false").lower() == "true",
        check_times=int_header(h, H.CHECK_TIMES, limit=INT_LIMIT),
        operator=h.get(H.OPERATOR) or None,
        remark=remark,
        born_timestamp=int_header(h, H.BORN_TIMESTAMP),
        raw=raw,
    )
