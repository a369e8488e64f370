"""What the coordinator writes to Kafka, and how big it is (``docs/wire-format.md``).

Check requests, released messages, discards, dead letters and history records. Every record is
checked against the size limit the coordinator writes under (Kafka's ``message.max.bytes``,
1 MB by default): a dead letter too big to write whole is written as a reference to the
refused record (where it lay, why, how big), and a half message whose records would not fit
is refused when it arrives, with that reason, rather than failing a write later.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from txstream.errors import MalformedRecord
from txstream.headers import header_dict
from txstream.message import Message
from txstream.refusals import Code
from txstream.topics import Topics
from txstream.wire import (
    INT_LIMIT,
    RESERVED_HEADERS,
    H,
    Headers,
    Record,
    body_bytes,
    half_headers,
    int_header,
    message_from,
    message_headers,
    user_properties,
    utf8,
)

__all__ = [
    "KAFKA_MAX_MESSAGE_BYTES",
    "MAX_REASON_BYTES",
    "CheckRequest",
    "encode_check",
    "decode_check",
    "encode_visible",
    "decode_visible",
    "encode_discard",
    "encode_dead_letter",
    "encode_reference",
    "encode_refused_release",
    "restate_refused",
    "encode_history",
    "decode_history",
    "encode_compact",
    "record_bytes",
    "largest_output_bytes",
]

# Kafka's default message.max.bytes: the largest record batch a stock broker takes.
KAFKA_MAX_MESSAGE_BYTES = 1_048_588
# Reasons are short sentences; a longer one is cut (a dead letter keeps the record, not prose).
# In UTF-8 bytes, so that the output size bound counts any reason exactly.
MAX_REASON_BYTES = 300
# What a record batch of one record costs beyond its key, value and headers: the batch header
# (61 bytes) and the record's own varints, at their widest.
_OVERHEAD = 61 + 25
# The widest record id: TAG.KEY.EPOCH.NUMBER, 8 hex, a 20-digit key, 13-digit ms, a number.
_RECORD_ID_BYTES = len(H.RECORD_ID) + 8 + 1 + 20 + 1 + 13 + 1 + 19 + 10


def record_bytes(key: bytes | None, value: bytes | None,
                 headers: Iterable[tuple[str, bytes | None]]) -> int:
    """The size of ``key``, ``value`` and ``headers`` as a record batch of one record, at most
    (what the broker compares with ``max.message.bytes``)."""
    size = _OVERHEAD + len(key or b"") + len(value or b"")
    for name, raw in headers:
        size += len(name.encode("utf-8")) + len(raw or b"") + 10  # two varints, at their widest
    return size


def _cut(reason: str) -> str:
    raw = reason.encode("utf-8")
    if len(raw) <= MAX_REASON_BYTES:
        return reason
    ellipsis = "…"
    kept = raw[:MAX_REASON_BYTES - len(ellipsis.encode("utf-8"))]
    return kept.decode("utf-8", errors="ignore") + ellipsis  # a character cut in two is dropped


# --- check requests, released messages, discards --------------------------------------------


class CheckRequest(NamedTuple):
    """A back-check request as a producer reads it."""

    message: Message
    check_times: int
    # When the next check of the transaction is due (coordinator's clock, ms): after that this
    # one is superseded. None from a request that does not say.
    valid_until: int | None
    # When the coordinator registered the half message (ms): a later registration (a new
    # checkpoint, the id sent again) numbers its checks from 1 again. None: not said.
    life: int | None = None

    @property
    def order(self) -> tuple[int, int]:
        """Where the request stands among its transaction's: by life, then by number."""
        return (self.life or 0, self.check_times)


def encode_check(
    msg: Message, check_times: int, topics: Topics, valid_until: int | None = None,
    life: int | None = None,
) -> Record:
    """A back-check request, on the check topic of the message's producer group: the half
    message (key, body, its headers written anew in a fixed order), the check's number, until
    when it holds and which registration of the transaction it is of."""
    assert msg.transaction_id and msg.producer_group
    headers = [*half_headers(msg), (H.CHECK_TIMES, utf8(str(check_times)))]
    if valid_until is not None:
        headers.append((H.CHECK_VALID_UNTIL, utf8(str(valid_until))))
    if life is not None:
        headers.append((H.CHECK_LIFE, utf8(str(life))))
    return Record(
        topics.check(msg.producer_group), utf8(msg.transaction_id), msg.body, tuple(headers)
    )


# What RocketMQ's check message carries as properties, and a Java listener reads with
# getProperty: here they are headers of the request, given back the same way.
_CHECK_PROPERTIES = (H.TRAN_MSG, H.PGROUP, H.UNIQ_KEY, H.REAL_TOPIC, H.CHECK_TIMES)


def decode_check(
    key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]] | None
) -> CheckRequest:
    h = header_dict(headers)
    topic = h.get(H.REAL_TOPIC)
    if not topic:
        raise MalformedRecord(f"missing header {H.REAL_TOPIC}", Code.MISSING_HEADER)
    check_times = int_header(h, H.CHECK_TIMES, required=True, limit=INT_LIMIT)
    assert check_times is not None
    msg = message_from(key, body_bytes(value), h, topic)
    msg.properties.update({name: h[name] for name in _CHECK_PROPERTIES if h.get(name)})
    msg.properties.setdefault(H.UNIQ_KEY, msg.msg_id or "")
    return CheckRequest(msg, check_times, int_header(h, H.CHECK_VALID_UNTIL),
                        int_header(h, H.CHECK_LIFE))


def encode_visible(msg: Message) -> Record:
    """The released message on its real topic: original body, keys and user properties.

    The record key is the message's ``keys`` (RocketMQ's message key) so that messages with one
    key keep their order; ``UNIQ_KEY`` carries the stable message id consumers dedup on.
    """
    key = utf8(msg.keys) if msg.keys else None
    # TRAN_MSG stays, as on a message RocketMQ releases; REAL_TOPIC and REAL_QUEUE_ID have
    # nothing to say here (the record is on its real topic, in the partition its key chose).
    headers = [(H.TRAN_MSG, b"true"), *message_headers(msg),
               (H.TRANSACTION_ID, utf8(msg.transaction_id or ""))]
    return Record(msg.topic, key, msg.body, tuple(headers))


# What a consumer reads through get_property on a released message, as from RocketMQ's.
_RELEASED_PROPERTIES = (H.TRAN_MSG, H.PGROUP, H.UNIQ_KEY)


def decode_visible(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    headers: Iterable[tuple[str, bytes | None]] | None,
) -> Message:
    h = header_dict(headers)
    txid = h.get(H.TRANSACTION_ID) or h.get(H.UNIQ_KEY)
    properties = user_properties(h)
    properties.update({name: h[name] for name in _RELEASED_PROPERTIES if h.get(name)})
    return Message(
        topic=topic,
        body=body_bytes(value) or b"",
        tags=h.get(H.TAGS),
        keys=h.get(H.KEYS),
        properties=properties,
        transaction_id=txid,
        msg_id=h.get(H.UNIQ_KEY) or txid,
        producer_group=h.get(H.PGROUP),
        born_timestamp=int_header(h, H.BORN_TIMESTAMP),
    )


def encode_discard(msg: Message, reason: str, check_times: int, topics: Topics) -> Record:
    """A message the coordinator gave up on: the half message with the answered checks and the
    reason. Never silent."""
    headers = [*half_headers(msg), (H.CHECK_TIMES, utf8(str(check_times))),
               (H.DISCARD_REASON, utf8(_cut(reason)))]
    return Record(topics.discard, utf8(msg.transaction_id or ""), msg.body, tuple(headers))


def _text_bytes(text: str) -> int:
    """``len(utf8(text))`` without encoding ASCII text (the flag is known, len is O(1))."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _header_bytes(name: str, text: str) -> int:
    """What a header of ``name`` and text value ``text`` adds to :func:`record_bytes`."""
    return _text_bytes(name) + _text_bytes(text) + 10


# The headers of the widest discard whose values do not depend on the message: its check count
# (10 digits, an int's) and its reason (the longest, ASCII as the core's reasons are).
_DISCARD_EXTRA = len(H.CHECK_TIMES) + 10 + 10 + len(H.DISCARD_REASON) + MAX_REASON_BYTES + 10
_TRAN_MSG_BYTES = len(H.TRAN_MSG) + len(b"true") + 10


def _message_header_bytes(msg: Message) -> int:
    """What :func:`txstream.wire.message_headers` adds to :func:`record_bytes`, counted
    without building the headers."""
    size = 0
    if msg.tags is not None:
        size += _header_bytes(H.TAGS, msg.tags)
    if msg.keys is not None:
        size += _header_bytes(H.KEYS, msg.keys)
    if msg.msg_id is not None:
        size += _header_bytes(H.UNIQ_KEY, msg.msg_id)
    if msg.producer_group is not None:
        size += _header_bytes(H.PGROUP, msg.producer_group)
    if msg.born_timestamp is not None:
        size += len(H.BORN_TIMESTAMP) + len(str(msg.born_timestamp)) + 10
    for name, text in msg.properties.items():
        if name not in RESERVED_HEADERS:
            size += _header_bytes(name, text)
    return size


def largest_output_bytes(msg: Message) -> int:
    """The size of the largest record the coordinator may write for half message ``msg``: its
    release, a check request or its discard (the widest reason, check count and record id).

    Counted as :func:`record_bytes` counts :func:`encode_visible` and :func:`encode_discard`
    (a check request is a discard's headers with a shorter last one), without building them:
    every half message pays this as it is read.
    """
    common = _OVERHEAD + len(msg.body or b"") + _message_header_bytes(msg)
    txid = _text_bytes(msg.transaction_id or "")
    # The discard: the half message's headers, keyed by the transaction id.
    discard = (common + txid + _TRAN_MSG_BYTES + _header_bytes(H.REAL_TOPIC, msg.topic)
               + _DISCARD_EXTRA)
    if msg.check_immunity_time_s is not None:
        discard += len(H.CHECK_IMMUNITY) + len(str(msg.check_immunity_time_s)) + 10
    # The release: keyed by the message key, and the transaction id as a header.
    release = (common + (_text_bytes(msg.keys) if msg.keys else 0) + _TRAN_MSG_BYTES
               + len(H.TRANSACTION_ID) + txid + 10)
    return max(discard, release) + _RECORD_ID_BYTES


# --- dead letters ----------------------------------------------------------------------------


def _origin(topic: str, partition: int, offset: int) -> Headers:
    return ((H.DLQ_ORIGIN_TOPIC, utf8(topic)), (H.DLQ_ORIGIN_PARTITION, utf8(str(partition))),
            (H.DLQ_ORIGIN_OFFSET, utf8(str(offset))))


def encode_reference(topic: str, key: bytes | None, size: int, reason: str, code: str,
                     origin: tuple[int, int], topics: Topics) -> Record:
    """A dead letter that does not carry the refused record, only where it lay (``origin``:
    partition and offset of ``topic``, or -1, -1), its key (if short), its size and why."""
    headers = ((H.DLQ_REASON, utf8(_cut(reason))), (H.DLQ_CODE, utf8(code)),
               *_origin(topic, *origin), (H.DLQ_ORIGINAL_BYTES, utf8(str(size))))
    return Record(topics.dead_letter, key if key is not None and len(key) <= 1024 else None,
                  None, headers)


def encode_dead_letter(original: Record, reason: str, code: str, origin: tuple[int, int],
                       topics: Topics, limit: int = KAFKA_MAX_MESSAGE_BYTES) -> Record:
    """The refused record byte for byte (key, value, headers in order) plus why it was refused
    and where it came from (``origin``: partition and offset, -1 when not known); if that would
    not fit under ``limit``, a reference to it instead (:func:`encode_reference`)."""
    headers = (*original.headers, (H.DLQ_REASON, utf8(_cut(reason))), (H.DLQ_CODE, utf8(code)),
               *_origin(original.topic, *origin))
    record = Record(topics.dead_letter, original.key, original.value, headers)
    if record_bytes(record.key, record.value, headers) + _RECORD_ID_BYTES <= limit:
        return record
    size = record_bytes(original.key, original.value, original.headers)
    return encode_reference(original.topic, original.key, size,
                            f"{reason} (the record, {size} bytes, does not fit in a dead letter "
                            f"under the limit of {limit} bytes: read it at its origin)",
                            code, origin, topics)


def encode_refused_release(release: Record, transaction_id: str, reason: str, code: str,
                           body_at: tuple[str, int, int] | None, topics: Topics,
                           limit: int = KAFKA_MAX_MESSAGE_BYTES) -> Record:
    """The dead letter of a release the broker refused: keyed by the transaction id, the
    release's headers with the topic it was for (``REAL_TOPIC``), its body when it fits, and
    where the body lies in the half topic (``body_at``: topic, partition, offset) as its
    origin, so that it can be released again (``txstream dead-letters release``)."""
    kept = [(k, v) for k, v in release.headers if k not in (H.RECORD_ID, H.REAL_TOPIC)]
    origin = _origin(*body_at) if body_at is not None else _origin(release.topic, -1, -1)
    headers = (*kept, (H.REAL_TOPIC, utf8(release.topic)), (H.DLQ_REASON, utf8(_cut(reason))),
               (H.DLQ_CODE, utf8(code)), *origin)
    key = utf8(transaction_id)
    if record_bytes(key, release.value, headers) + _RECORD_ID_BYTES <= limit:
        return Record(topics.dead_letter, key, release.value, headers)
    size = record_bytes(release.key, release.value, release.headers)
    return Record(topics.dead_letter, key, None,
                  (*headers, (H.DLQ_ORIGINAL_BYTES, utf8(str(size)))))


# --- history ---------------------------------------------------------------------------------

Note = tuple[str, int, str, Mapping[str, object]]  # transaction id, at ms, event, detail
# json.dumps with separators builds an encoder per call; one serves every line (same bytes).
_JSON = json.JSONEncoder(separators=(",", ":"))


def encode_history(notes: Sequence[Note], key: bytes | None, topics: Topics,
                   limit: int = KAFKA_MAX_MESSAGE_BYTES) -> Iterator[tuple[Record, list[Note]]]:
    """The history lines of one state key's micro-batch, as few records as fit under ``limit``
    (one, nearly always), each with the notes it holds (``txstream history TXID`` reads
    them). Per key and batch, not per transition: per transition, history was two of every
    three records the coordinator wrote. ``key`` keeps a key's lines in one partition, in order.
    """
    budget = limit - _OVERHEAD - _RECORD_ID_BYTES - len(key or b"")
    docs = [{"transaction_id": txid, "at": at, "event": event, **detail}
            for txid, at, event, detail in notes]
    encode = encode_compact
    # Nearly always one record: the list encoded at once is the same bytes as its lines
    # joined, and fits exactly when the line by line packing below would not split it.
    whole = encode(docs)
    if len(docs) == 1 or (docs and len(whole) < budget):
        yield Record(topics.history, key, whole, ()), list(notes)
        return
    lines: list[bytes] = []
    held: list[Note] = []
    size = 2
    for note, doc in zip(notes, docs, strict=True):
        line = encode(doc)
        if lines and size + len(line) + 1 > budget:
            yield Record(topics.history, key, b"[" + b",".join(lines) + b"]", ()), held
            lines, held, size = [], [], 2
        lines.append(line)
        held.append(note)
        size += len(line) + 1
    if lines:
        yield Record(topics.history, key, b"[" + b",".join(lines) + b"]", ()), held


def _compact_encoder() -> Callable[[object], bytes]:
    """Compact JSON as bytes: orjson where it is installed (with the coordinator; a C encoder,
    a third of the standard one's time per line, which was a fifth of the operator's time
    under load), else the standard library, whose output differs only in escaping non-ASCII
    text. orjson refuses what the standard one writes (an int beyond 64 bits): then that."""
    try:
        import orjson
    except ImportError:
        return _encode_standard

    def encode(doc: object) -> bytes:
        try:
            return orjson.dumps(doc)
        except TypeError:  # orjson.JSONEncodeError
            return _encode_standard(doc)

    return encode


def _encode_standard(doc: object) -> bytes:
    return _JSON.encode(doc).encode()


encode_compact = _compact_encoder()
"""``doc`` as compact JSON (no spaces), UTF-8 bytes: every line the coordinator writes."""


def restate_refused(value: bytes | None, refused: Mapping[str, Mapping[str, object]]
                    ) -> bytes | None:
    """A history record's lines with each ``released`` note of a transaction in ``refused``
    made a ``release_refused`` one with the detail given (why, and where its dead letter lies);
    None when no line changed."""
    try:
        lines = decode_history(value)
    except MalformedRecord:
        return None
    changed = False
    for line in lines:
        detail = refused.get(str(line.get("transaction_id")))
        if detail is not None and line.get("event") == "released":
            line.update(event="release_refused", **detail)
            changed = True
    return encode_compact(lines) if changed else None


def decode_history(value: bytes | None, key: bytes | None = None) -> list[dict[str, object]]:
    """The lines of a history record, each with its ``transaction_id``.

    A single JSON object is a line of the first format (one record per transition, keyed by
    the transaction id), still read so that older history stays readable.
    """
    if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
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
