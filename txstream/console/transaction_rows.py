"""A transaction's row in the index, folded from its entries one at a time.

The status follows the history notes, which come in order (all of one transaction's notes are
in one partition of the history topic). The discard, dead-letter and half topics are read
beside it, in no order relative to it: what they tell fills in only what the notes do not
(the message id, keys and born time of the half message) or agrees with them (a discard).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from txstream.console.record_entries import Entry, Source
from txstream.state.effects import NoteKind
from txstream.state.transaction import Status
from txstream.wire import H

__all__ = ["IndexStatus", "TxRow", "COLUMNS", "fold", "keys_of", "refused_half"]

# The index stores a status as its word (a template shows it as it is).
_PENDING, _EARLY_END = Status.PENDING.value, Status.EARLY_END.value
_COMMITTED, _ROLLED_BACK = Status.COMMITTED.value, Status.ROLLED_BACK.value
_DISCARDED, _LOST = Status.DISCARDED.value, Status.LOST.value


class IndexStatus:
    """A transaction's status in the index: the coordinator's (the core's :class:`Status`, as
    its word), or one of the index's own three."""

    PENDING, EARLY_END = _PENDING, _EARLY_END
    EXPIRED = "EXPIRED"  # its end events waited for a half message that never came
    UNSEEN = "UNSEEN"  # on the half topic; the coordinator wrote nothing about it yet
    REFUSED = "REFUSED"  # its half message, or its release, went to the dead-letter topic

    OPEN = (_PENDING, _EARLY_END)
    RESOLVED = tuple(s.value for s in Status if s.resolved)
    ALL = (*OPEN, UNSEEN, *RESOLVED, EXPIRED, REFUSED)


@dataclass(slots=True)
class TxRow:
    """One row of the ``transactions`` table."""

    transaction_id: str
    status: str | None = None
    producer_group: str | None = None
    real_topic: str | None = None
    msg_id: str | None = None  # UNIQ_KEY
    keys: str | None = None  # KEYS: RocketMQ's business keys, space separated
    tags: str | None = None
    born_ms: int | None = None
    first_seen_ms: int | None = None  # the coordinator's first note about it
    checks_sent: int = 0
    checks_answered: int = 0
    next_check_ms: int | None = None
    # released, rolled_back, discarded, expired, release_lost, release_refused
    outcome: str | None = None
    reason: str | None = None  # why: the discard's or expiry's reason, an operator's remark
    operator: str | None = None  # who resolved it by hand
    updated_ms: int | None = None  # time of the latest entry


COLUMNS = tuple(f.name for f in fields(TxRow))

_FINAL_NOTES = {NoteKind.RELEASED: _COMMITTED, NoteKind.ROLLED_BACK: _ROLLED_BACK,
                NoteKind.DISCARDED: _DISCARDED, NoteKind.EXPIRED: IndexStatus.EXPIRED,
                NoteKind.RELEASE_LOST: _LOST, NoteKind.RELEASE_REFUSED: IndexStatus.REFUSED}


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 19:
        return int(value)
    return None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def keys_of(keys: str | None) -> list[str]:
    """RocketMQ's KEYS: several business keys separated by spaces."""
    return sorted(set((keys or "").split()))


def _fill_message(row: TxRow, h: dict[str, str]) -> None:
    """The half message's own fields, from its headers, where the row has none yet."""
    row.msg_id = row.msg_id or _text(h.get(H.UNIQ_KEY)) or row.transaction_id
    row.keys = row.keys or _text(h.get(H.KEYS))
    row.tags = row.tags or _text(h.get(H.TAGS))
    row.producer_group = row.producer_group or _text(h.get(H.PGROUP))
    row.real_topic = row.real_topic or _text(h.get(H.REAL_TOPIC))
    if row.born_ms is None:
        row.born_ms = _int(h.get(H.BORN_TIMESTAMP))


def _fold_final(row: TxRow, note: dict[str, Any], event: NoteKind) -> None:
    row.status = _FINAL_NOTES[event]
    row.outcome = event.value
    row.next_check_ms = None
    row.reason = _text(note.get("reason")) or _text(note.get("remark"))
    row.operator = _text(note.get("operator"))
    row.checks_sent = max(row.checks_sent, _int(note.get("checks_sent")) or 0)
    if note.get("from_check") is True:  # the answer to a back-check that settled it
        row.checks_answered += 1


def _kind(event: Any) -> NoteKind | None:
    """A note's kind; None for one this version does not know (a newer coordinator's)."""
    try:
        return NoteKind(event)
    except ValueError:
        return None


def _fold_note(row: TxRow, note: dict[str, Any], at: int) -> None:
    event = _kind(note.get("event"))
    if row.first_seen_ms is None or at < row.first_seen_ms:
        row.first_seen_ms = at
    if event == NoteKind.HALF:
        if row.status not in IndexStatus.OPEN:  # registered (again, if it had expired)
            row.outcome = row.reason = row.operator = None
        row.status = _PENDING
        row.producer_group = _text(note.get("group")) or row.producer_group
        row.real_topic = _text(note.get("topic")) or row.real_topic
        row.next_check_ms = _int(note.get("first_check"))
        row.msg_id = _text(note.get("msg_id")) or row.msg_id
        row.keys = row.keys or _text(note.get("keys"))
        row.tags = row.tags or _text(note.get("tags"))
        row.born_ms = row.born_ms if row.born_ms is not None else _int(note.get("born"))
    elif event == NoteKind.END_BEFORE_HALF:
        if row.status in (None, IndexStatus.UNSEEN):
            row.status = _EARLY_END
    elif event == NoteKind.CHECK_SENT:
        row.checks_sent = max(row.checks_sent, _int(note.get("check")) or 0)
        if row.status == _PENDING:
            row.next_check_ms = _int(note.get("next_check")) or row.next_check_ms
    elif event == NoteKind.UNKNOWN:
        row.checks_answered = max(row.checks_answered, _int(note.get("checks_answered")) or 0)
    elif event in _FINAL_NOTES:
        _fold_final(row, note, event)
    # duplicate, rejected, body_gone, and a kind this version does not know: the timeline
    # shows them; the row does not change.


def _fold_record(row: TxRow, entry: Entry) -> None:
    h: dict[str, str] = entry.detail.get("headers") or {}
    if entry.source == Source.HALF:
        _fill_message(row, h)
        row.status = row.status or IndexStatus.UNSEEN
    elif entry.source == Source.DISCARD:
        _fill_message(row, h)
        if row.status not in (_COMMITTED, _ROLLED_BACK, _LOST):
            row.status, row.outcome, row.next_check_ms = _DISCARDED, NoteKind.DISCARDED.value, None
            row.reason = row.reason or _text(h.get(H.DISCARD_REASON))
        row.checks_answered = max(row.checks_answered, _int(h.get(H.CHECK_TIMES)) or 0)
    elif entry.source == Source.DEAD_LETTER and refused_half(entry.detail):
        _fill_message(row, h)  # a refused half message: nothing more will come of it
        if row.status in (None, IndexStatus.UNSEEN):
            row.status, row.reason = IndexStatus.REFUSED, _text(h.get(H.DLQ_REASON))


def refused_half(detail: dict[str, Any]) -> bool:
    """Whether a dead letter is a half message's: marked so, or refused from the half topic
    (:func:`txstream.console.record_entries.entries_of`); entries indexed before the mark was
    made are told by the header alone."""
    h: dict[str, str] = detail.get("headers") or {}
    return bool(detail.get("half_message")) or h.get(H.TRAN_MSG, "").lower() == "true"


def fold(row: TxRow, entry: Entry) -> None:
    """Apply one entry to its transaction's row (in place)."""
    if entry.source == Source.HISTORY:
        _fold_note(row, entry.detail, entry.at_ms)
    else:
        _fold_record(row, entry)
    if row.updated_ms is None or entry.at_ms > row.updated_ms:
        row.updated_ms = entry.at_ms
