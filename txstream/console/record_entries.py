"""What the index takes from each Kafka record: typed entries, one per event of a transaction.

A history record holds many notes (one state key's micro-batch): one :class:`Entry` each. A
discard, a dead letter and a half message are one entry each, with the headers an operator
needs (the body is not kept). Decoding never raises for bad input: :func:`entries_of` raises
:class:`~txstream.errors.MalformedRecord`, and the feed logs the record and skips it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, NamedTuple

from txstream.errors import MalformedRecord
from txstream.outputs import decode_history
from txstream.wire import H

__all__ = ["Source", "Entry", "KIND_OF_SOURCE", "entries_of", "record_headers"]


class Source:
    """Which topic an entry came from."""

    HISTORY = "history"
    DISCARD = "discard"
    DEAD_LETTER = "dead_letter"
    HALF = "half"


# The kinds of the entries that are records, not history notes.
KIND_OF_SOURCE = {Source.DISCARD: "discard_record", Source.DEAD_LETTER: "dead_letter",
                  Source.HALF: "half_record"}

# A header value is kept up to this many characters: one message with huge properties must not
# bloat the index.
_MAX_HEADER_CHARS = 1000


class Entry(NamedTuple):
    """One event about one transaction, as the index stores it.

    ``detail``: a history note as written (``transaction_id``, ``at``, ``event`` and its
    fields, in order), or a record's ``headers`` and where it lay. ``fingerprint``: equal for
    the same event read twice (a note a replayed micro-batch wrote again; a record read again).
    """

    transaction_id: str | None
    at_ms: int
    kind: str
    source: str
    detail: dict[str, Any]
    origin: str
    offset: int
    fingerprint: bytes


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def record_headers(headers: Any) -> dict[str, str]:
    """Headers as text, leniently: a dead letter's headers may be the very reason it is one."""
    out: dict[str, str] = {}
    for item in headers or ():
        try:
            name, raw = item
        except (TypeError, ValueError):
            continue
        if isinstance(raw, (bytes, bytearray, memoryview)):
            text = bytes(raw).decode("utf-8", "replace")
        else:
            text = "" if raw is None else str(raw)
        out[str(name)] = text[:_MAX_HEADER_CHARS]
    return out


def _key_text(key: Any) -> str | None:
    if not isinstance(key, (bytes, bytearray, memoryview)) or not key:
        return None
    text = bytes(key).decode("utf-8", "replace")
    return text if text.strip() else None


def _timestamp(record: Any) -> int:
    ts = getattr(record, "timestamp", None)
    return int(ts) if isinstance(ts, int) and ts >= 0 else 0


def _origin(record: Any) -> str:
    return f"{record.topic}[{record.partition}]@{record.offset}"


def _note_entry(note: Mapping[str, Any], record: Any) -> Entry:
    txid = note.get("transaction_id")
    if not isinstance(txid, str) or not txid:
        raise MalformedRecord("history line without a transaction id")
    at = note.get("at")
    event = note.get("event")
    if not isinstance(at, int) or isinstance(at, bool) or not isinstance(event, str):
        raise MalformedRecord(f"history line of {txid} without a time or an event name")
    # The note as written identifies it: a replayed batch writes it again, identical.
    canonical = json.dumps(note, sort_keys=True, separators=(",", ":"))
    return Entry(txid, at, event, Source.HISTORY, dict(note), _origin(record), record.offset,
                 _digest("note:" + canonical))


def _history_entries(record: Any) -> list[Entry]:
    notes = decode_history(record.value, record.key)
    return [_note_entry(note, record) for note in notes]


def _record_entry(source: str, record: Any, half_topic: str | None) -> Entry:
    headers = record_headers(record.headers)
    detail: dict[str, Any] = {"topic": record.topic, "partition": record.partition,
                              "offset": record.offset, "headers": headers}
    if source == Source.DEAD_LETTER and half_topic and (
            headers.get(H.DLQ_ORIGIN_TOPIC) == half_topic):
        # Refused where it was read from the half topic: a half message, even one whose
        # headers (TRAN_MSG among them) were missing, which may be why it was refused.
        detail["half_message"] = True
    if record.value is not None and source != Source.HALF:
        detail["value_bytes"] = len(record.value)
    txid = _key_text(record.key)
    if source == Source.HALF and txid is None:
        raise MalformedRecord("half message without a transaction id (record key)")
    # A record read twice (two processes feeding one index) is the same record: where it lay.
    fingerprint = _digest(f"record:{record.topic}:{record.partition}:{record.offset}")
    return Entry(txid, _timestamp(record), KIND_OF_SOURCE[source], source, detail,
                 _origin(record), record.offset, fingerprint)


def entries_of(source: str, record: Any, half_topic: str | None = None) -> list[Entry]:
    """The entries of one Kafka record of ``source``; raises MalformedRecord for bad input.
    ``half_topic``: the coordinator's, which tells a dead-lettered half message by its origin."""
    if source == Source.HISTORY:
        return _history_entries(record)
    if source in KIND_OF_SOURCE:
        return [_record_entry(source, record, half_topic)]
    raise ValueError(f"unknown source {source!r}")
