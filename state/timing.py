"""When a pending transaction's timers are due, and what its timer may do then.

The first back-check counts from the producer's born time, as RocketMQ's does, while it is
within ``Policy.max_clock_skew`` of when the broker stored the half message (its record
timestamp); further off, from that timestamp; never from later than the batch that registers
it. A wrong clock only moves that first question. Nothing that ends a transaction counts from a
producer's clock or a record timestamp: the reserved time counts from when the coordinator
registered the half message (``pending_deadline``; docs/decisions/0022-trusted-time.md).
Pure: every time is given.
"""

from __future__ import annotations

from txstream.message import Message
from txstream.state.policy import Policy
from txstream.state.transaction import Status, Transaction

__all__ = [
    "anchor",
    "first_check",
    "check_spacing",
    "pending_deadline",
    "registered_at",
    "reserved_deadline",
    "sends_check",
    "discard_due",
    "waits_for_ends",
    "latest_visible_check",
]


def anchor(half: Message, fallback: int, policy: Policy) -> int:
    """The born time timers count from: the producer's, unless it is further than the allowed
    skew from the broker's timestamp, then the broker's (``fallback`` when the message has
    neither)."""
    born = half.born_timestamp if half.born_timestamp is not None else fallback
    stored = half.stored_timestamp
    if stored is None or stored < 0 or abs(born - stored) <= policy.max_clock_skew:
        return born
    return stored


def first_check(half: Message, now: int, policy: Policy) -> int:
    """When the first back-check is due: the transaction timeout (or the message's own check
    immunity) after its born time, the born time no later than ``now``."""
    born = min(anchor(half, now, policy), now)
    immunity = half.check_immunity_time_s
    # RocketMQ reads a negative immunity (-1) as "use transactionTimeout"; taken literally it
    # would ask the producer before its local transaction could have run.
    if immunity is not None and immunity >= 0:
        return born + immunity * 1000
    return born + policy.transaction_timeout


def check_spacing(unanswered: int, policy: Policy) -> int:
    """How long after a check the next one is due, ``unanswered`` being how many checks in a
    row (this one included) have gone unanswered: the interval, doubled for each unanswered
    one after the first, at most ``check_backoff_max`` intervals. A group that is away is not
    sent thousands of requests per transaction, and one that returns loses nothing: the
    latest request stays valid until the next is due, so it is answered at once."""
    doublings = min(max(unanswered - 1, 0), policy.check_backoff_max.bit_length())
    return policy.check_interval * min(1 << doublings, policy.check_backoff_max)


def pending_deadline(seen_at: int, next_check: int, policy: Policy) -> int:
    """The next timer of a pending transaction registered at ``seen_at``: its next check, or
    its reserved time if that comes first."""
    return min(next_check, seen_at + policy.reserved_time)


def registered_at(tx: Transaction, policy: Policy) -> int:
    """When the coordinator registered the half message. A transaction saved before that was
    recorded (state format 5 and older) counts from its born time, as it did then."""
    if tx.seen_at is not None:
        return tx.seen_at
    assert tx.half is not None
    return anchor(tx.half, tx.deadline, policy)


def reserved_deadline(tx: Transaction, policy: Policy) -> int:
    """When a pending transaction has outlived the reserved time, on the coordinator's clock."""
    return registered_at(tx, policy) + policy.reserved_time


def sends_check(tx: Transaction, at: int, policy: Policy) -> bool:
    """Whether the transaction's timer, run at ``at``, would only send a check: the one kind
    of timer that may run ahead of its deadline (``Policy.timer_lead``). One that decides an
    outcome (a discard, an end event's expiry) runs only once due, so that an end event that
    comes before it wins."""
    if tx.status is not Status.PENDING or tx.half is None or tx.body_gone is not None:
        return False
    return (max(at, tx.deadline) < reserved_deadline(tx, policy)
            and tx.checks_answered < policy.check_max)


def discard_due(tx: Transaction, now: int, policy: Policy) -> int | None:
    """When the discard that the pending transaction's timer makes at ``now`` became due (its
    reserved deadline, or the check after the last one it may have), or None: it checks."""
    reserved = reserved_deadline(tx, policy)
    if now >= reserved:
        return reserved
    if tx.body_gone is not None or tx.checks_answered >= policy.check_max:
        return tx.deadline
    return None


def waits_for_ends(tx: Transaction, now: int, policy: Policy, ends_read: int) -> bool:
    """Whether the transaction's timer would discard it but must wait: the end topic has not
    been read up to when the discard became due, so a commit written before then may still be
    unread (and must win). Or it would expire held end events but must wait: the half topic
    has not been read up to when they were held (their half message, written before them,
    may lie in a backlog). ``ends_read``: how far both topics have been read."""
    if tx.status is Status.EARLY_END and now >= tx.deadline:
        return ends_read < tx.deadline - policy.orphan_end_timeout
    if tx.status is not Status.PENDING or now < tx.deadline:
        return False
    due = discard_due(tx, now, policy)
    return due is not None and ends_read < due


def latest_visible_check(tx: Transaction, now: int) -> int:
    """The number of the latest check a producer can have seen at ``now``: a check made ahead
    of its deadline (``Policy.timer_lead``) is held back until then, and the one before it is
    still the latest request (its ``CHECK_VALID_UNTIL`` is that deadline)."""
    if tx.check_due is not None and now < tx.check_due:
        return tx.checks_sent - 1
    return tx.checks_sent
