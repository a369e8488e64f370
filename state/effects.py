"""What the transaction core asks the outside world to do. Plain values, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from txstream.message import EndEvent, Message

__all__ = ["Release", "RequestCheck", "Discard", "DiscardCause", "DeadLetter", "BodyLost",
           "Note", "NoteKind", "Effect"]


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
    answer this one after that (it has been superseded). ``life``: when the coordinator
    registered the half message: a new checkpoint, or the id sent again as a new transaction,
    registers it later and numbers its checks from 1 again, so a producer orders checks by
    (life, number).
    """

    message: Message
    check_times: int
    late_ms: int = 0
    valid_until: int | None = None
    life: int | None = None


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


class NoteKind(StrEnum):
    """What a history line tells: the ``event`` of a :class:`Note`, as written in the history
    topic (the words are the wire format: a new kind adds one, none is renamed). The operator
    writes them, the metrics count them, ``txstream history`` and the console tell them."""

    HALF = "half"  # the half message registered
    END_BEFORE_HALF = "end_before_half"  # an end event held until its half message comes
    CHECK_SENT = "check_sent"  # a back-check asked
    UNKNOWN = "unknown"  # an answer (or end event) saying the outcome is not known yet
    RELEASED = "released"  # committed: released to its real topic
    RELEASE_LOST = "release_lost"  # committed, but the half message's body was gone
    # committed, but the broker refused the release (its topic missing, too large, not
    # allowed): it waits on the dead-letter topic (the sink writes this note, not the core)
    RELEASE_REFUSED = "release_refused"
    BODY_GONE = "body_gone"  # the held half message's body can no longer be read
    ROLLED_BACK = "rolled_back"  # rolled back: never visible
    DISCARDED = "discarded"  # given up: on the discard topic
    DUPLICATE = "duplicate"  # a repeated half message or end event, ignored
    REJECTED = "rejected"  # an end event refused (wrong group, contradicting decision)
    EXPIRED = "expired"  # held end events whose half message never came

    @property
    def final(self) -> bool:
        """The transaction ended (for now: a lost release waits for its half message again)."""
        return self in _FINAL


_FINAL = frozenset({NoteKind.RELEASED, NoteKind.RELEASE_LOST, NoteKind.RELEASE_REFUSED,
                    NoteKind.ROLLED_BACK, NoteKind.DISCARDED, NoteKind.EXPIRED})


@dataclass(frozen=True, slots=True)
class Note:
    """One line of the transaction's history."""

    transaction_id: str
    event: NoteKind
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
