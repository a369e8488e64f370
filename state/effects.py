"""What the transaction core asks the outside world to do. Plain values, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from txstream.message import EndEvent, Message

__all__ = ["Release", "RequestCheck", "Discard", "DiscardCause", "DeadLetter", "BodyLost",
           "Note", "Effect"]


@dataclass(frozen=True, slots=True)
class Release:
    """Make the committed message visible on its real topic.

    ``committed_at``: when the producer sent the commit (its born time), for latency figures.
    """

    message: Message
    committed_at: int | None = None


@dataclass(frozen=True, slots=True)
class RequestCheck:
    """Ask one producer of the message's group for its local transaction state.

    ``late_ms``: how long after the check was due it was asked (timer precision).
    ``valid_until``: when the next check of the transaction is due; a producer does not
    answer this one after that (it has been superseded).
    """

    message: Message
    check_times: int
    late_ms: int = 0
    valid_until: int | None = None


class DiscardCause:
    """Why a message was given up, as a stable word (the reason's text is for people)."""

    CHECK_MAX = "check_max"  # answered checks reached check_max, still unknown
    RESERVED_TIME = "reserved_time"  # the half message outlived the reserved time
    HALF_MESSAGE_LOST = "half_message_lost"  # its body can no longer be read from the half topic

    ALL = (CHECK_MAX, RESERVED_TIME, HALF_MESSAGE_LOST)


@dataclass(frozen=True, slots=True)
class Discard:
    """Give up on a message: it goes to the discard topic with the reason; ``cause`` is one
    of :class:`DiscardCause` (the coordinator's metrics label)."""

    message: Message
    reason: str
    check_times: int
    cause: str = DiscardCause.CHECK_MAX


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Refuse an event; it goes to the dead-letter topic with the reason and its stable code
    (``txstream.refusals.Code``)."""

    event: Message | EndEvent
    reason: str
    code: str


@dataclass(frozen=True, slots=True)
class Note:
    """One line of the transaction's history."""

    transaction_id: str
    event: str
    at: int
    detail: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BodyLost:
    """The record ``instead_of`` (``visible``: a release, ``discard``) cannot be written: the
    held half message's body is gone from the half topic (``reason``). Written instead: a dead
    letter keyed by the transaction id, with everything but the body and where it was."""

    message: Message
    instead_of: str
    reason: str


Effect = Release | RequestCheck | Discard | DeadLetter | BodyLost | Note
