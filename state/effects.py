"""What the transaction core asks the outside world to do. Plain values, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from txstream.message import EndEvent, Message

__all__ = ["Release", "RequestCheck", "Discard", "DeadLetter", "Note", "Effect"]


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
    """

    message: Message
    check_times: int
    late_ms: int = 0


@dataclass(frozen=True, slots=True)
class Discard:
    """Give up on a message: it goes to the discard topic with the reason."""

    message: Message
    reason: str
    check_times: int


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Refuse an event; it goes to the dead-letter topic with the reason."""

    event: Message | EndEvent
    reason: str


@dataclass(frozen=True, slots=True)
class Note:
    """One line of the transaction's history."""

    transaction_id: str
    event: str
    at: int
    detail: Mapping[str, object] = field(default_factory=dict)


Effect = Release | RequestCheck | Discard | DeadLetter | Note
