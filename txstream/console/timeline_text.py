"""A timeline entry in words, and times as people read them: what ``txstream history`` prints
and the console's pages show."""

from __future__ import annotations

import json
import time
from typing import Any

from txstream.console.queries import TimelineRow
from txstream.console.record_entries import Source
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


def describe(note: dict[str, Any]) -> str:
    """A history note in words."""
    event = str(note.get("event"))
    decision = note.get("decision")
    how = _how(note)
    remark = f"; remark: {note['remark']}" if note.get("remark") else ""
    match event:
        case NoteKind.HALF:
            return (f"half message registered: group {note.get('group')}, real topic "
                    f"{note.get('topic')}; first check at {format_ms(note.get('first_check'))}")
        case NoteKind.CHECK_SENT:
            return f"back-check #{note.get('check')} sent ({note.get('late_ms')} ms after due)"
        case NoteKind.UNKNOWN:
            return (f"{decision}{how}: still unknown, {note.get('checks_answered')} check(s) "
                    f"answered{remark}")
        case NoteKind.RELEASED if note.get("again"):
            return "half message sent again: released to its real topic"
        case NoteKind.RELEASED:
            return f"{decision}{how}: released to its real topic{remark}"
        case NoteKind.RELEASE_LOST:
            return (f"{decision}{how}: NOT released: the body of its half message "
                    f"{note.get('reason')}; see its dead letter (HALF_MESSAGE_LOST). Sending "
                    f"the half message again releases it")
        case NoteKind.BODY_GONE:
            return f"the body of its half message {note.get('reason')}"
        case NoteKind.ROLLED_BACK:
            return f"{decision}{how}: rolled back, never visible{remark}"
        case NoteKind.END_BEFORE_HALF:
            return f"end event {decision} came before its half message: held until it comes"
        case NoteKind.DUPLICATE:
            return (f"duplicate {note.get('of') or decision} ignored (already "
                    f"{note.get('status')})")
        case NoteKind.DISCARDED | NoteKind.REJECTED | NoteKind.EXPIRED:
            return f"{event}: {note.get('reason')}"
    extra = {k: v for k, v in note.items() if k not in ("at", "event", "transaction_id")}
    return f"{event} {json.dumps(extra)}" if extra else event


def describe_discard(event: TimelineRow) -> str:
    h = event.detail.get("headers") or {}
    return (f"discard record {event.origin}: {h.get(H.DISCARD_REASON)} "
            f"(answered checks {h.get(H.CHECK_TIMES)}, real topic {h.get(H.REAL_TOPIC)})")


def describe_dead_letter(event: TimelineRow) -> str:
    h = event.detail.get("headers") or {}
    kind = h.get(H.COMMIT_OR_ROLLBACK) or ("half message" if h.get(H.TRAN_MSG) else "record")
    return (f"dead letter {event.origin}: {kind} refused: {h.get(H.DLQ_REASON)} (from "
            f"{h.get(H.DLQ_ORIGIN_TOPIC)}[{h.get(H.DLQ_ORIGIN_PARTITION)}]"
            f"@{h.get(H.DLQ_ORIGIN_OFFSET)})")


def describe_half_record(event: TimelineRow) -> str:
    h = event.detail.get("headers") or {}
    keys = f", keys {h[H.KEYS]}" if h.get(H.KEYS) else ""
    tags = f", tags {h[H.TAGS]}" if h.get(H.TAGS) else ""
    return (f"half message sent by group {h.get(H.PGROUP)} for {h.get(H.REAL_TOPIC)}: "
            f"message id {h.get(H.UNIQ_KEY) or event.transaction_id}{keys}{tags}, born "
            f"{format_ms(_int_or_none(h.get(H.BORN_TIMESTAMP)))} ({event.origin})")


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
