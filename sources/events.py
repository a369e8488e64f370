"""An ``EVENT_SCHEMA`` row's record -> the message model: the event it carries, or why none.

Never raises on bad input: a record that cannot be decoded becomes :class:`Malformed` with the
reason, and the coordinator dead-letters it intact (the record as read) and keeps running.
"""

from __future__ import annotations

from dataclasses import dataclass

from txstream.errors import MalformedRecord
from txstream.message import MAX_BODY_BYTES, EndEvent, Message
from txstream.schema import EventKind
from txstream.wire import end_from_text, half_from_text, packed_header_dict

__all__ = ["Malformed", "parse_event"]


@dataclass(frozen=True, slots=True)
class Malformed:
    """A record that is no event; ``reason`` says why, for the dead-letter topic."""

    reason: str


def parse_event(
    kind: int,
    key: bytes | None,
    value: bytes | None,
    headers: bytes | None,
    partition: int,
    offset: int,
    max_body: int = MAX_BODY_BYTES,
) -> Message | EndEvent | Malformed:
    """Decode one record of the half (``kind`` HALF) or end topic; ``headers`` packed."""
    try:
        text = packed_header_dict(headers)
        if kind == EventKind.HALF:
            msg = half_from_text(key, value, text, max_body)
            # Where the half message lies (RocketMQ's queue id and offset), for the admin tools.
            msg.queue_id, msg.queue_offset = partition, offset
            return msg
        return end_from_text(key, value, text)
    except MalformedRecord as exc:
        return Malformed(exc.reason)
    except Exception as exc:
        # A decoder bug must not stop the coordinator: the record is dead-lettered with the
        # error instead, which keeps it visible rather than lost.
        return Malformed(f"undecodable record ({type(exc).__name__}: {exc})")
