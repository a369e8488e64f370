"""An ``EventRow``'s record -> the message model: the event it carries, or why none.

Never raises on bad input: a record that cannot be decoded becomes :class:`Malformed` with the
reason and its stable code, and the coordinator dead-letters it intact (the record as read)
and keeps running.
"""

from __future__ import annotations

from dataclasses import dataclass

from txstream.errors import MalformedRecord
from txstream.message import MAX_BODY_BYTES, EndEvent, Message, RawRecord
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES, largest_output_bytes
from txstream.refusals import Code
from txstream.schema import EventKind
from txstream.wire import end_from_text, half_from_text, packed_header_dict

__all__ = ["Malformed", "parse_event"]


@dataclass(frozen=True, slots=True)
class Malformed:
    """A record that is no event (or one the coordinator must refuse as it comes);
    ``reason`` says why, for the dead-letter topic, and ``code`` says so for programs."""

    reason: str
    code: str = Code.UNDECODABLE


def _stamp(value: object) -> int | None:
    """A record timestamp as pandas hands it over: an int, or a float (NaN: none) when the
    column held nulls."""
    if value is None or value != value or not isinstance(value, (int, float)) or value < 0:
        return None
    return int(value)


def _half(key: bytes | None, value: bytes | None, text: dict[str, str], partition: int,
          offset: int, max_body: int, max_record: int, timestamp: int | None
          ) -> Message | Malformed:
    msg = half_from_text(key, value, text, max_body)
    # Where the half message lies (RocketMQ's queue id and offset), for the admin tools, and
    # when the broker stored it, against the producer's clock (state.timing).
    msg.queue_id, msg.queue_offset = partition, offset
    msg.stored_timestamp = _stamp(timestamp)
    size = largest_output_bytes(msg)
    if size > max_record:
        return Malformed(f"the coordinator's records for this half message (its release, "
                         f"check requests, discard) would be up to {size} bytes, over the limit "
                         f"of {max_record} bytes it writes under", Code.OUTPUTS_TOO_LARGE)
    return msg


def parse_event(
    kind: int,
    key: bytes | None,
    value: bytes | None,
    headers: bytes | None,
    partition: int,
    offset: int,
    max_body: int = MAX_BODY_BYTES,
    max_record: int = KAFKA_MAX_MESSAGE_BYTES,
    timestamp: int | None = None,
) -> Message | EndEvent | Malformed:
    """Decode one record of the half (``kind`` HALF) or end topic; ``headers`` packed.
    ``max_record``: the largest record the coordinator may write (a half message whose records
    would be larger is refused now, not when a write fails)."""
    try:
        text = packed_header_dict(headers)
        if kind in (EventKind.HALF, EventKind.HALF_AGAIN):
            return _half(key, value, text, partition, offset, max_body, max_record, timestamp)
        return end_from_text(key, value, text, RawRecord(partition, offset, key, value, headers))
    except MalformedRecord as exc:
        return Malformed(exc.reason, exc.code)
    except Exception as exc:
        # A decoder bug must not stop the coordinator: the record is dead-lettered with the
        # error instead, which keeps it visible rather than lost.
        return Malformed(f"undecodable record ({type(exc).__name__}: {exc})", Code.UNDECODABLE)
