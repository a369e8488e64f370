"""When a pending transaction's timers are due.

The first back-check counts from the producer's born time, as RocketMQ's does, while it is
within ``Policy.max_clock_skew`` of when the broker stored the half message (its record
timestamp); further off, from that timestamp; never from later than the batch that registers
it. A wrong clock only moves that first question. Nothing that ends a transaction counts from a
producer's clock or a record timestamp: the reserved time counts from when the coordinator
registered the half message (``pending_deadline``; docs/decisions/0022-trusted-time.md).
Pure: every time is given.
"""

from __future__ import annotations

from state.policy import Policy
from txstream.message import Message

__all__ = ["anchor", "first_check", "check_spacing", "pending_deadline"]


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
