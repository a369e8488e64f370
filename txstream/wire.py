"""How messages and events travel on Kafka (see ``docs/wire-format.md``).

A record's key is the transaction id, its value the message body untouched; everything else
travels as UTF-8 headers named after RocketMQ's message properties.
"""

from __future__ import annotations

import json
import re
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
from txstream.message import MAX_BODY_BYTES, Decision, EndEvent, Message
from txstream.topics import Topics, validate_group, validate_topic

__all__ = [
    "H",
    "RESERVED_HEADERS",
    "Record",
    "Headers",
    "encode_half",
    "decode_half",
    "encode_end",
    "decode_end",
    "encode_check",
    "decode_check",
    "encode_visible",
    "decode_visible",
    "encode_discard",
    "encode_dead_letter",
    "encode_history",
    "decode_history",
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
    CHECK_IMMUNITY = "CHECK_IMMUNITY_TIME_IN_SECONDS"
    CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
    COMMIT_OR_ROLLBACK = "COMMIT_OR_ROLLBACK"
    FROM_CHECK = "FROM_TRANSACTION_CHECK"
    REMARK = "REMARK"
    OPERATOR = "ADMIN_OPERATOR"
    DISCARD_REASON = "DISCARD_REASON"
    DLQ_REASON = "DLQ_REASON"
    DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
    DLQ_ORIGIN_PARTITION = "DLQ_ORIGIN_PARTITION"
    DLQ_ORIGIN_OFFSET = "DLQ_ORIGIN_OFFSET"
    # On every record the coordinator writes: stable across a replayed micro-batch, so the sink
    # can tell what a crashed run already wrote (sinks.kafka_sink).
    RECORD_ID = "TXSTREAM_RECORD_ID"


RESERVED_HEADERS = frozenset(v for k, v in vars(H).items() if k.isupper())

_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: int() would also take "١٢", " 1_0 ", "+1"
_LONG = 2**63 - 1  # Kafka/Spark bigint
_INT = 2**31 - 1  # Spark int: check_times and immunity_s columns
_BYTES = (bytes, bytearray, memoryview)


class Record(NamedTuple):
    """A Kafka record to write or as read (headers in order, duplicates allowed)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


def _b(text: str) -> bytes:
    return text.encode("utf-8")


def _int(
    h: Mapping[str, str], name: str, *, required: bool = False, limit: int = _LONG
) -> int | None:
    """A non-negative integer header, as Java would parse it and as the Spark column holds it."""
    text = h.get(name)
    if text is None or text == "":
        if required:
            raise MalformedRecord(f"missing header {name}")
        return None
    if not _DIGITS.fullmatch(text) or int(text) > limit:
        raise MalformedRecord(
            f"header {name} is not an integer in 0..{limit}: {text[:40]!r}"
        )
    return int(text)


def _body(value: object) -> bytes | None:
    if value is not None and not isinstance(value, _BYTES):
        raise MalformedRecord("record value is not bytes")
    return bytes(value) if value is not None else None


def _txid(key: bytes | None, h: Mapping[str, str]) -> str:
    if key is not None and not isinstance(key, _BYTES):
        raise MalformedRecord("record key is not bytes")
    if not key:
        raise MalformedRecord("missing transaction id (record key)")
    try:
        txid = bytes(key).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedRecord("transaction id (record key) is not UTF-8 text") from None
    if not txid.strip():
        raise MalformedRecord("missing transaction id (record key)")
    return txid


def _user_properties(h: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in h.items() if k not in RESERVED_HEADERS}


def _message_headers(msg: Message) -> list[tuple[str, bytes]]:
    # A user property named like a system header is not written: the decoder keeps the last
    # header of a name, so it could replace the group, the topic or the transaction id.
    out: list[tuple[str, bytes]] = []
    if msg.tags is not None:
        out.append((H.TAGS, _b(msg.tags)))
    if msg.keys is not None:
        out.append((H.KEYS, _b(msg.keys)))
    if msg.msg_id is not None:
        out.append((H.UNIQ_KEY, _b(msg.msg_id)))
    if msg.producer_group is not None:
        out.append((H.PGROUP, _b(msg.producer_group)))
    if msg.born_timestamp is not None:
        out.append((H.BORN_TIMESTAMP, _b(str(msg.born_timestamp))))
    out.extend((k, _b(v)) for k, v in msg.properties.items() if k not in RESERVED_HEADERS)
    return out


def _message_from(
    key: bytes | None, value: bytes | None, h: Mapping[str, str], topic: str
) -> Message:
    txid = _txid(key, h)
    return Message(
        topic=topic,
        body=bytes(value) if value is not None else b"",
        tags=h.get(H.TAGS),
        keys=h.get(H.KEYS),
        properties=_user_properties(h),
        transaction_id=txid,
        msg_id=h.get(H.UNIQ_KEY) or txid,
        producer_group=h.get(H.PGROUP),
        born_timestamp=_int(h, H.BORN_TIMESTAMP),
        check_immunity_time_s=_int(h, H.CHECK_IMMUNITY, limit=_INT),
    )


# --- half messages -------------------------------------------------------------------------


def encode_half(msg: Message, topics: Topics) -> Record:
    """The half message as written to the half topic (invisible to consumers)."""
    if not msg.transaction_id or not msg.producer_group or msg.born_timestamp is None:
        raise ValueError("a half message needs transaction_id, producer_group and born_timestamp")
    headers = [(H.TRAN_MSG, b"true"), (H.REAL_TOPIC, _b(msg.topic)), *_message_headers(msg)]
    if msg.check_immunity_time_s is not None:
        headers.append((H.CHECK_IMMUNITY, _b(str(msg.check_immunity_time_s))))
    return Record(topics.half, _b(msg.transaction_id), msg.body, tuple(headers))


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
        raise MalformedRecord(f"unknown event type on the half topic: {H.TRAN_MSG} is not 'true'")
    topic = h.get(H.REAL_TOPIC)
    if not topic:
        raise MalformedRecord(f"missing header {H.REAL_TOPIC}")
    group = h.get(H.PGROUP)
    if not group:
        raise MalformedRecord(f"missing header {H.PGROUP}")
    # The topic receives the release and the group names the check topic: a bad name would
    # fail in the sink, again on every retry of the batch, long after this record was read.
    try:
        validate_topic(topic)
    except ConfigError as e:
        raise MalformedRecord(f"header {H.REAL_TOPIC}: {e}") from None
    try:
        validate_group(group)
    except ConfigError as e:
        raise MalformedRecord(f"header {H.PGROUP}: {e}") from None
    _int(h, H.BORN_TIMESTAMP, required=True)
    body = _body(value)
    if body is not None and len(body) > max_body:
        raise MalformedRecord(f"body of {len(body)} bytes exceeds the limit of {max_body}")
    return _message_from(key, body, h, topic)


# --- end events (commit / rollback / unknown, and check answers) -----------------------------


def encode_end(event: EndEvent, topics: Topics) -> Record:
    headers = [
        (H.COMMIT_OR_ROLLBACK, _b(event.decision.value)),
        (H.PGROUP, _b(event.producer_group)),
        (H.FROM_CHECK, b"true" if event.from_check else b"false"),
    ]
    if event.check_times is not None:
        headers.append((H.CHECK_TIMES, _b(str(event.check_times))))
    if event.operator is not None:
        headers.append((H.OPERATOR, _b(event.operator)))
    if event.born_timestamp is not None:
        headers.append((H.BORN_TIMESTAMP, _b(str(event.born_timestamp))))
    value = _b(event.remark) if event.remark else None
    if value is not None:
        headers.append((H.REMARK, b"true"))
    return Record(topics.end, _b(event.transaction_id), value, tuple(headers))


def decode_end(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None
) -> EndEvent:
    return end_from_text(key, value, header_dict(headers))


def end_from_text(key: bytes | None, value: bytes | None, h: Mapping[str, str]) -> EndEvent:
    """An end event from its key, value and headers already decoded to text."""
    txid = _txid(key, h)
    raw = h.get(H.COMMIT_OR_ROLLBACK)
    if raw is None:
        raise MalformedRecord(f"unknown event type: missing header {H.COMMIT_OR_ROLLBACK}")
    try:
        decision = Decision(raw)
    except ValueError:
        raise MalformedRecord(f"unknown event type {raw[:40]!r}") from None
    group = h.get(H.PGROUP)
    if not group:
        raise MalformedRecord(f"missing header {H.PGROUP}")
    remark = None
    body = _body(value)
    if body:
        remark = body.decode("utf-8", errors="replace")
    return EndEvent(
        transaction_id=txid,
        producer_group=group,
        decision=decision,
        from_check=h.get(H.FROM_CHECK, "false").lower() == "true",
        check_times=_int(h, H.CHECK_TIMES, limit=_INT),
        operator=h.get(H.OPERATOR) or None,
        remark=remark,
        born_timestamp=_int(h, H.BORN_TIMESTAMP),
    )


# --- coordinator outputs --------------------------------------------------------------------


def encode_check(msg: Message, check_times: int, topics: Topics) -> Record:
    """A back-check request, on the check topic of the message's producer group."""
    assert msg.transaction_id and msg.producer_group
    headers = [
        (H.REAL_TOPIC, _b(msg.topic)),
        *_message_headers(msg),
        (H.CHECK_TIMES, _b(str(check_times))),
    ]
    return Record(
        topics.check(msg.producer_group), _b(msg.transaction_id), msg.body, tuple(headers)
    )


def decode_check(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None
) -> tuple[Message, int]:
    h = header_dict(headers)
    topic = h.get(H.REAL_TOPIC)
    if not topic:
        raise MalformedRecord(f"missing header {H.REAL_TOPIC}")
    check_times = _int(h, H.CHECK_TIMES, required=True, limit=_INT)
    assert check_times is not None
    return _message_from(key, _body(value), h, topic), check_times


def encode_visible(msg: Message) -> Record:
    """The released message on its real topic: original body, keys and user properties.

    The record key is the message's ``keys`` (RocketMQ's message key) so that messages with one
    key keep their order; ``UNIQ_KEY`` carries the stable message id consumers dedup on.
    """
    key = _b(msg.keys) if msg.keys else None
    headers = [*_message_headers(msg), (H.TRANSACTION_ID, _b(msg.transaction_id or ""))]
    return Record(msg.topic, key, msg.body, tuple(headers))


def decode_visible(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
) -> Message:
    h = header_dict(headers)
    txid = h.get(H.TRANSACTION_ID) or h.get(H.UNIQ_KEY)
    msg = Message(
        topic=topic,
        body=_body(value) or b"",
        tags=h.get(H.TAGS),
        keys=h.get(H.KEYS),
        properties=_user_properties(h),
        transaction_id=txid,
        msg_id=h.get(H.UNIQ_KEY) or txid,
        producer_group=h.get(H.PGROUP),
        born_timestamp=_int(h, H.BORN_TIMESTAMP),
    )
    return msg


def encode_discard(msg: Message, reason: str, check_times: int, topics: Topics) -> Record:
    """A message the coordinator gave up on: never silent, always with the reason."""
    headers = [
        (H.REAL_TOPIC, _b(msg.topic)),
        *_message_headers(msg),
        (H.CHECK_TIMES, _b(str(check_times))),
        (H.DISCARD_REASON, _b(reason)),
    ]
    return Record(topics.discard, _b(msg.transaction_id or ""), msg.body, tuple(headers))


def encode_dead_letter(
    original: Record, reason: str, origin_partition: int, origin_offset: int, topics: Topics
) -> Record:
    """The original record, byte for byte, plus why it was refused and where it came from."""
    headers = (
        *original.headers,
        (H.DLQ_REASON, _b(reason)),
        (H.DLQ_ORIGIN_TOPIC, _b(original.topic)),
        (H.DLQ_ORIGIN_PARTITION, _b(str(origin_partition))),
        (H.DLQ_ORIGIN_OFFSET, _b(str(origin_offset))),
    )
    return Record(topics.dead_letter, original.key, original.value, headers)


def encode_history(
    notes: Iterable[tuple[str, int, str, Mapping[str, object]]], key: bytes | None,
    topics: Topics,
) -> Record:
    """The history lines ``(transaction id, at ms, event, detail)`` of one bucket's micro-batch,
    as one record (``txstream history TXID`` reads these).

    One record per bucket and batch, not one per transition: per transition, history was two of
    every three records the coordinator wrote. ``key`` (the bucket) keeps a bucket's lines in one
    partition, in order.
    """
    lines = [{"transaction_id": txid, "at": at, "event": event, **detail}
             for txid, at, event, detail in notes]
    return Record(topics.history, key, _b(json.dumps(lines, separators=(",", ":"))), ())


def decode_history(value: bytes | None, key: bytes | None = None) -> list[dict[str, object]]:
    """The lines of a history record, each with its ``transaction_id``.

    A single JSON object is a line of the first format (one record per transition, keyed by
    the transaction id), still read so that older history stays readable.
    """
    if value is not None and not isinstance(value, _BYTES):
        raise MalformedRecord("history record is not bytes")
    try:
        out = json.loads(bytes(value or b""))
    except ValueError:
        raise MalformedRecord("history record is not JSON") from None
    if isinstance(out, dict):
        txid = bytes(key).decode("utf-8", "replace") if key is not None else None
        return [{"transaction_id": txid, **out}]
    if not isinstance(out, list) or not all(isinstance(line, dict) for line in out):
        raise MalformedRecord("history record is not a JSON list of objects")
    return out
