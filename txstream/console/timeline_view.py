"""What a transaction's page shows beyond its row: the timeline from the message's born time,
its user properties, the operators who decided, and where its release lies on the real topic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from txstream.console.index import Index
from txstream.console.queries import TimelineRow
from txstream.console.record_entries import Source
from txstream.console.release_lookup import MAX_RECORDS, ReleaseLocation
from txstream.console.timeline_text import describe_event
from txstream.console.transaction_rows import TxRow
from txstream.state.effects import NoteKind
from txstream.wire import H, user_properties

__all__ = ["Locate", "TimelineLine", "Releases", "timeline_lines", "message_properties",
           "operators", "releases", "release_json"]

log = logging.getLogger(__name__)

# (real topic, transaction id, the release note's time) -> the released records
Locate = Callable[[str, str, int], list[ReleaseLocation]]


class TimelineLine(NamedTuple):
    """One line of the page's timeline: an event, or the message's born time."""

    at_ms: int
    kind: str
    source: str
    text: str
    origin: str


def timeline_lines(row: TxRow | None, events: Sequence[TimelineRow]) -> list[TimelineLine]:
    """The events, oldest first, after the half message's born time (the producer's clock) when
    it is known: the first line is the start every "+" counts from, so no time the notes give
    (the first check is due from the born time) comes before it."""
    lines = [TimelineLine(e.at_ms, e.kind, e.source, describe_event(e), e.origin)
             for e in events]
    if row is not None and row.born_ms is not None:
        born = TimelineLine(row.born_ms, "born", "producer",
                            "the producer sent the half message (its born time, by the "
                            "producer's clock)", "BORN_TIMESTAMP")
        lines.append(born)
        lines.sort(key=lambda line: (line.at_ms, line.kind != "born"))
    return lines


def _message_headers(events: Sequence[TimelineRow]) -> dict[str, str]:
    """The headers of the half message as read from the half topic, else as a discard or
    dead letter carries them."""
    for source in (Source.HALF, Source.DISCARD, Source.DEAD_LETTER):
        for event in events:
            if event.source == source and event.detail.get("headers"):
                return dict(event.detail["headers"])
    return {}


def message_properties(events: Sequence[TimelineRow]) -> dict[str, str]:
    """The message's user properties: the headers that are none of txstream's."""
    return user_properties(_message_headers(events))


def operators(row: TxRow | None, events: Sequence[TimelineRow]) -> list[str]:
    """Who decided by hand, as the history notes and the dead letters (a refused decision)
    name them, in order."""
    names: list[str] = []
    for event in events:
        if event.source == Source.HISTORY:
            name = event.detail.get("operator")
        else:
            name = (event.detail.get("headers") or {}).get(H.OPERATOR)
        if isinstance(name, str) and name and name not in names:
            names.append(name)
    if row is not None and row.operator and row.operator not in names:
        names.append(row.operator)
    return names


class Releases(NamedTuple):
    """Where the released message lies: ``found`` (empty when it was searched for in vain),
    or None with ``why`` it is not known."""

    found: list[ReleaseLocation] | None
    why: str | None = None


def releases(index: Index, locate: Locate | None, row: TxRow | None,
             events: Sequence[TimelineRow]) -> Releases | None:
    """The released records of a transaction with a release note; None without one."""
    notes = [e for e in events if e.source == Source.HISTORY and e.kind == NoteKind.RELEASED]
    if row is None or not notes:
        return None
    latest = notes[-1].at_ms
    known = index.releases(row.transaction_id, latest)
    if known is not None:
        return Releases(known)
    if locate is None or not row.real_topic:
        return Releases(None, "not looked up: the console has no Kafka settings"
                        if locate is None else "its real topic is not known")
    try:
        found = locate(row.real_topic, row.transaction_id, notes[0].at_ms)
    except Exception as exc:  # the broker down: the page shows the rest all the same
        log.warning("console: cannot look up the release of %s: %s", row.transaction_id, exc)
        return Releases(None, f"cannot be looked up now: {exc}")
    if not found:  # not kept: the record may be acknowledged after the note was read
        return Releases([], f"not found in the last {MAX_RECORDS} records of each partition "
                            f"of {row.real_topic} back to the release's time")
    index.store_releases(row.transaction_id, latest, found)
    return Releases(found)


def release_json(found: Releases | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {"locations": None if found.found is None else [
        {"topic": f.topic, "partition": f.partition, "offset": f.offset,
         "timestamp_ms": f.timestamp_ms} for f in found.found], "why": found.why}
