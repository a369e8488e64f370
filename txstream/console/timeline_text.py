"""A timeline entry in words, and times as people read them: what ``txstream history`` prints
and the console's pages show."""

from __future__ import annotations

import json
import time
from typing import Any

from txstream.console.queries import TimelineRow
from txstream.console.record_entries import Source
from txstream.console.transaction_rows import refused_half
from txstream.state.effects import NoteKind
from txstream.wire import H

__all__ = ["describe", "describe_event", "describe_discard", "describe_dead_letter",
           "describe_half_record", "format_ms"]


def format_ms(epoch_ms: int | None) -> str:
    """Local wall-clock time with milliseconds, or '-'."""
    if epoch_ms is None:
        return "-"
    seconds, ms = divmod(int(epoch_ms), 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f".{ms:03d}"


def _how(note: dict[str, Any]) -> str:
    how = ""
    if note.get("from_check"):
        how += " answering a back-check"
    if note.get("operator"):
        how += f" (admin decision by {note['operator']})"
    return how


def _given(*parts: tuple[str, Any]) -> str:
    """``label value`` for each part that has a value, comma-separated: a field a note or
    record lacks is left out, never printed as None."""
    return ", ".join(f"{label} {value}".strip() for label, value in parts
                     if value is not None and value != "")


def _decision(note: dict[str, Any]) -> str:
    return str(note.get("decision") or "decision")


def _half(note: dict[str, Any]) -> str:
    said = _given(("group", note.get("group")), ("real topic", note.get("topic")))
    first = note.get("first_check")
    check = f"; first check at {format_ms(first)}" if isinstance(first, int) else ""
    return f"half message registered{': ' + said if said else ''}{check}"


def _check_sent(note: dict[str, Any]) -> str:
    number = f" #{note['check']}" if note.get("check") is not None else ""
    late = f" ({note['late_ms']} ms after due)" if note.get("late_ms") is not None else ""
    return f"back-check{number} sent{late}"


def _why(note: dict[str, Any]) -> str:
    return f": {note['reason']}" if note.get("reason") else ""


def _gone(note: dict[str, Any]) -> str:
    return str(note.get("reason") or "is gone")  # the reason says how: "is no longer ..."


def describe(note: dict[str, Any]) -> str:
    """A history note in words."""
    event = str(note.get("event"))
    how = _how(note)
    remark = f"; remark: {note['remark']}" if note.get("remark") else ""
    match event:
        case NoteKind.HALF:
            return _half(note)
        case NoteKind.CHECK_SENT:
            return _check_sent(note)
        case NoteKind.UNKNOWN:
            answered = note.get("checks_answered")
            count = f", {answered} check(s) answered" if answered is not None else ""
            return f"{_decision(note)}{how}: still unknown{count}{remark}"
        case NoteKind.RELEASED if note.get("again"):
            return "half message sent again: released to its real topic"
        case NoteKind.RELEASED if note.get("from_dead_letter"):
            return (f"released from its dead letter ({note['from_dead_letter']}) once the "
                    f"cause was mended{how}")
        case NoteKind.RELEASED if note.get("found_on"):
            return (f"found already released on {note['found_on']} by a coordinator before "
                    "this checkpoint, which had not noted it: not released again")
        case NoteKind.RELEASED:
            return f"{_decision(note)}{how}: released to its real topic{remark}"
        case NoteKind.RELEASE_LOST:
            return (f"{_decision(note)}{how}: NOT released: the body of its half message "
                    f"{_gone(note)}; see its dead letter (HALF_MESSAGE_LOST). Sending the "
                    "half message again releases it")
        case NoteKind.RELEASE_REFUSED:
            return (f"{_decision(note)}{how}: NOT released: the broker refused it "
                    f"({note.get('code')}: {note.get('reason')}); it waits on the dead-letter "
                    f"topic at {note.get('dead_letter')}: txstream dead-letters release")
        case NoteKind.BODY_GONE:
            return f"the body of its half message {_gone(note)}"
        case NoteKind.ROLLED_BACK:
            return f"{_decision(note)}{how}: rolled back, never visible{remark}"
        case NoteKind.END_BEFORE_HALF:
            return (f"end event {_decision(note)}{how} came before its half message: held "
                    "until it comes")
        case NoteKind.DUPLICATE:
            what = note.get("of") or note.get("decision") or "event"
            status = f" (already {note['status']})" if note.get("status") else ""
            return f"duplicate {what} ignored{status}"
        case NoteKind.DISCARDED | NoteKind.REJECTED | NoteKind.EXPIRED:
            return f"{event}{_why(note)}"
    extra = {k: v for k, v in note.items() if k not in ("at", "event", "transaction_id")}
    return f"{event} {json.dumps(extra)}" if extra else event


def describe_discard(event: TimelineRow) -> str:
    h = event.detail.get("headers") or {}
    reason = h.get(H.DISCARD_REASON)
    said = _given(("answered checks", h.get(H.CHECK_TIMES)),
                  ("real topic", h.get(H.REAL_TOPIC)))
    return (f"discard record {event.origin}{': ' + reason if reason else ''}"
            f"{f' ({said})' if said else ''}")


def describe_dead_letter(event: TimelineRow) -> str:
    h = event.detail.get("headers") or {}
    half = refused_half(event.detail)
    kind = h.get(H.COMMIT_OR_ROLLBACK) or ("half message" if half else "record")
    by = f"; the decision of operator {h[H.OPERATOR]}" if h.get(H.OPERATOR) else ""
    reason = f": {h[H.DLQ_REASON]}" if h.get(H.DLQ_REASON) else ""
    origin = h.get(H.DLQ_ORIGIN_TOPIC)
    where = ""
    if origin:
        spot = (f"[{h.get(H.DLQ_ORIGIN_PARTITION)}]@{h.get(H.DLQ_ORIGIN_OFFSET)}"
                if h.get(H.DLQ_ORIGIN_OFFSET) not in (None, "-1") else "")
        where = f" (from {origin}{spot})"
    return f"dead letter {event.origin}: {kind} refused{reason}{where}{by}"


def describe_half_record(event: TimelineRow) -> str:
    h = event.detail.get("headers") or {}
    if not h:
        return f"half message with no headers, only its key ({event.origin})"
    sent = _given(("by group", h.get(H.PGROUP)), ("for", h.get(H.REAL_TOPIC)))
    born = _int_or_none(h.get(H.BORN_TIMESTAMP))
    said = _given(("message id", h.get(H.UNIQ_KEY) or event.transaction_id),
                  ("keys", h.get(H.KEYS)), ("tags", h.get(H.TAGS)),
                  ("born", format_ms(born) if born is not None else None))
    return f"half message sent{' ' + sent.replace(', for', ' for') if sent else ''}: {said} " \
           f"({event.origin})"


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def describe_event(event: TimelineRow) -> str:
    """Any timeline entry in words."""
    if event.source == Source.HISTORY:
        return describe(event.detail)
    if event.source == Source.DISCARD:
        return describe_discard(event)
    if event.source == Source.DEAD_LETTER:
        return describe_dead_letter(event)
    return describe_half_record(event)
