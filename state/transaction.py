"""What the coordinator knows of one transaction: its status and its record.

The data :mod:`txstream.state.lifecycle` moves from status to status; plain frozen values, no rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from txstream.message import EndEvent, Message

__all__ = ["BodyGone", "Event", "FoundReleased", "Status", "Transaction"]


@dataclass(frozen=True, slots=True)
class BodyGone:
    """An observation, not a record: the body of the transaction's held half message can no
    longer be read from the half topic (``reason`` says why). The operator finds it out when
    it reads the body back to release, check or discard the message."""

    transaction_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class FoundReleased:
    """An observation, not a record: a coordinator before this checkpoint released the
    transaction's message to ``topic`` (its record is there), though the history topic does
    not say so: its batch died between the release and the note. A new checkpoint finds it out
    when it reads the half message again (docs/decisions/0029-releases-found.md)."""

    transaction_id: str
    topic: str


Event = Message | EndEvent | BodyGone | FoundReleased


class Status(str, Enum):
    EARLY_END = "EARLY_END"  # an end event came before its half message; it is held
    PENDING = "PENDING"  # the half message is stored, the outcome is not known yet
    COMMITTED = "COMMITTED"  # released to its real topic (remembered for duplicates)
    ROLLED_BACK = "ROLLED_BACK"  # dropped (remembered for duplicates)
    DISCARDED = "DISCARDED"  # given up: on the discard topic (remembered for duplicates)
    # Committed, but its half message's body was gone: nothing released, a dead letter says
    # so; the half message sent again (the same transaction id) is released.
    LOST = "LOST"

    @property
    def resolved(self) -> bool:
        return self in (Status.COMMITTED, Status.ROLLED_BACK, Status.DISCARDED, Status.LOST)



@dataclass(frozen=True, slots=True)
class Transaction:
    """What the coordinator knows of one transaction.

    ``deadline`` is when :func:`on_timeout` must next run: the next check (or the reserved-time
    limit) while pending, the end of the wait for held end events, or when a resolved
    transaction is forgotten. ``checks_answered`` counts the checks a producer answered, one per
    check interval at most: an answer counts only when it answers the latest check sent
    (``last_answered`` is that check's number), so a returning producer that answers a backlog
    of stale checks gets one counted, not the backlog.

    ``held``: end events that came before the half message, in the order their decisions came,
    at most one per sender (a producer group, or the admins). Until the half message names the
    owning group nobody knows whose decision counts, so an end event from a wrong group must
    not displace or contradict the owner's.

    ``seen_at``: when the coordinator registered the half message, on its own clock: the
    reserved time counts from it. ``check_due``: when the latest check sent was due; until
    then its request is held back, and the one before it is still the latest a producer can
    see (an answer to it counts). ``body_gone``: why the held half message's body can no longer
    be read (:class:`BodyGone`).
    """

    transaction_id: str
    status: Status
    deadline: int
    producer_group: str | None = None
    half: Message | None = None
    held: tuple[EndEvent, ...] = ()
    checks_sent: int = 0
    checks_answered: int = 0
    next_check: int | None = None
    last_answered: int = 0
    # Resolved: until when its outcome is remembered once it leaves the state
    # (``txstream.state.outcomes``): the reserved time after it was resolved.
    remember_until: int | None = None
    seen_at: int | None = None
    check_due: int | None = None
    body_gone: str | None = None
