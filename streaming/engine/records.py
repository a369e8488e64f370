"""What the operator writes: the core's effects as ``OutputRow`` rows.

Every record gets an id, ``tag.key.epoch.number`` (:func:`record_id`), also carried in its
``TXSTREAM_RECORD_ID`` header. A replayed micro-batch gives every record the same id again,
which is how the sink recognises what a crashed run already wrote
(docs/decisions/0005-replay-check.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from txstream.message import EndEvent, Message
from txstream.outputs import (
    KAFKA_MAX_MESSAGE_BYTES,
    encode_check,
    encode_dead_letter,
    encode_discard,
    encode_history,
    encode_visible,
)
from txstream.record_ids import coordinator_tag, record_id
from txstream.refusals import Code
from txstream.schema import EventKind, Kind, OutputRow
from txstream.sources.events import Malformed
from txstream.state.effects import (
    BodyLost,
    DeadLetter,
    Discard,
    Effect,
    Note,
    Release,
    RequestCheck,
)
from txstream.topics import Topics
from txstream.wire import (
    H,
    Record,
    encode_end,
    encode_half,
    half_headers,
    pack_headers,
    unpack_headers,
    utf8,
)

__all__ = ["Emit", "body_at", "records_for", "dead_letter_of_record", "history_rows", "timer_row",
           "coordinator_tag", "record_id", "output_rows"]

class Emit(NamedTuple):
    """A record the operator asks to write, before it is numbered."""

    kind: str
    record: Record
    not_before_ms: int | None = None  # the sink holds it until then (a timer run ahead)
    # (partition, offset) of the half topic record whose value is this record's value: the
    # sink reads it back when record.value is null (a half message from the state), and a
    # refused release's dead letter says where it lies.
    body_at: tuple[int, int] | None = None


def dead_letter_of_record(kind: int, key: Any, value: Any, headers: Any, partition: int,
                          offset: int, refusal: Malformed, topics: Topics,
                          limit: int = KAFKA_MAX_MESSAGE_BYTES) -> Emit:
    """A record that is no event, written to the dead-letter topic as it was read."""
    topic = topics.half if kind in (EventKind.HALF, EventKind.HALF_AGAIN) else topics.end
    try:
        original_headers = tuple(unpack_headers(headers))
    except Exception:  # the packed headers are the source's own; keep the reason if not
        original_headers = ()
    original = Record(topic, key, value, original_headers)
    return Emit(Kind.DEAD_LETTER, encode_dead_letter(
        original, refusal.reason, refusal.code, (partition, offset), topics, limit))


def _refused_event(effect: DeadLetter, topics: Topics, limit: int) -> Record:
    """The dead letter of an event the core refused: as it was read when it was (an end event
    keeps its record, also while held in the state), else as txstream encodes it."""
    event = effect.event
    if isinstance(event, EndEvent) and event.raw is not None:
        raw = event.raw
        original = Record(topics.end, raw.key, raw.value, tuple(unpack_headers(raw.headers)))
        origin = (raw.partition, raw.offset)
    else:
        original = (encode_half(event, topics) if isinstance(event, Message)
                    else encode_end(event, topics))
        origin = (-1, -1)
    return encode_dead_letter(original, effect.reason, effect.code, origin, topics, limit)


def _body_lost(message: Message, instead_of: str, reason: str, topics: Topics,
               limit: int) -> Record:
    """The dead letter written instead of a release or discard whose half message's body is
    gone: keyed by the transaction id (its story finds it), everything but the body, where the
    body was and why it cannot be read."""
    where = (f"{topics.half}/{message.queue_id} offset {message.queue_offset}"
             if message.queue_id is not None else topics.half)
    what = "release to " + message.topic if instead_of == Kind.VISIBLE else instead_of
    original = Record(topics.half, utf8(message.transaction_id or ""), None,
                      tuple(half_headers(message)))
    origin = (message.queue_id, message.queue_offset) if message.queue_offset is not None \
        else (-1, -1)
    return encode_dead_letter(
        original, f"the {what} cannot be written: the body of its half message, {where}, "
        f"{reason}", Code.HALF_MESSAGE_LOST, origin, topics, limit)


def body_at(message: Message) -> tuple[int, int] | None:
    """Where the body of a half message lies in the half topic (None: not known). The state
    holds a half message without its body (``txstream.state.bucket``: bodies stay in the
    topic); one read in this batch carries it too."""
    if message.queue_id is not None and message.queue_offset is not None:
        return message.queue_id, message.queue_offset
    return None


def _body_missing(message: Message) -> bool:
    """A message with no body and nowhere to read it from: a coordinator bug, written as a
    dead letter rather than stopping the coordinator."""
    return message.body is None and body_at(message) is None


def records_for(
    effects: Iterable[Effect],
    topics: Topics,
    not_before: int | None = None,
    limit: int = KAFKA_MAX_MESSAGE_BYTES,
) -> Iterator[Emit]:
    """The records the core's effects ask for, history notes aside (:func:`history_rows`).
    ``not_before``: the sink holds the records until then (a timer run ahead of its deadline);
    ``limit``: the largest record the coordinator may write."""
    for effect in effects:
        if isinstance(effect, (Release, RequestCheck, Discard)) and _body_missing(effect.message):
            kind = {Release: Kind.VISIBLE, RequestCheck: Kind.CHECK}.get(type(effect), "discard")
            yield Emit(Kind.DEAD_LETTER, _body_lost(
                effect.message, kind, "is nowhere to be read (a coordinator defect: please report)",
                topics, limit), not_before)
        elif isinstance(effect, Release):
            yield Emit(Kind.VISIBLE, encode_visible(effect.message), not_before,
                       body_at(effect.message))
        elif isinstance(effect, RequestCheck):
            record = encode_check(effect.message, effect.check_times, topics, effect.valid_until,
                                  effect.life)
            yield Emit(Kind.CHECK, record, not_before, body_at(effect.message))
        elif isinstance(effect, Discard):
            record = encode_discard(effect.message, effect.reason, effect.check_times, topics)
            yield Emit(Kind.DISCARD, record, not_before, body_at(effect.message))
        elif isinstance(effect, BodyLost):
            yield Emit(Kind.DEAD_LETTER, _body_lost(effect.message, effect.instead_of,
                                                    effect.reason, topics, limit), not_before)
        elif isinstance(effect, DeadLetter):
            yield Emit(Kind.DEAD_LETTER, _refused_event(effect, topics, limit), not_before)


def history_rows(notes: list[Note], key: int, topics: Topics,
                 limit: int = KAFKA_MAX_MESSAGE_BYTES) -> Iterator[Emit]:
    """The history records of a key's notes in a batch: one, unless they would not fit in
    one record."""
    lines = [(n.transaction_id, n.at, n.event, n.detail) for n in notes]
    for record, _ in encode_history(lines, str(key).encode("ascii"), topics, limit):
        yield Emit(Kind.HISTORY, record)


def timer_row(key: int, timeout_ms: int | None, summary: bytes | None = None) -> Emit:
    """The key's processing-time timeout as Spark armed it (None: no timer), for the sink to
    fold into the timer schedule, and in its value the key's metrics of the call
    (:mod:`txstream.streaming.engine.key_metrics`), which the query observes; it is no record and
    takes no record number."""
    return Emit(Kind.TIMER, Record("", str(key).encode("ascii"), summary),
                not_before_ms=timeout_ms)


def output_rows(emits: Sequence[Emit], ids: Sequence[str | None], batch_ms: int
                ) -> list[OutputRow]:
    """The emitted records as output rows, each with its id (None: a timer row)."""
    rows = []
    for emit, rid in zip(emits, ids, strict=True):
        record = emit.record
        headers = (pack_headers((*record.headers, (H.RECORD_ID, rid.encode("ascii"))))
                   if rid else None)
        rows.append(OutputRow(
            emit.kind, record.topic, record.key, record.value, headers, rid, batch_ms,
            emit.not_before_ms,            *(emit.body_at or (None, None)),
        ))
    return rows
