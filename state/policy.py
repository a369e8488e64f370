"""The coordinator's timing rules, with RocketMQ's broker defaults."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Policy"]

SECOND = 1000
HOUR = 3600 * SECOND


@dataclass(frozen=True, slots=True)
class Policy:
    """All durations in milliseconds.

    | field                 | RocketMQ broker setting    |
    |-----------------------|----------------------------|
    | transaction_timeout   | transactionTimeOut         |
    | check_interval        | transactionCheckInterval   |
    | check_max             | transactionCheckMax        |
    | reserved_time         | fileReservedTime           |
    | orphan_end_timeout    | (none: txstream)           |
    | resolved_retention    | (none: txstream)           |
    | timer_lead            | (none: txstream)           |
    | max_clock_skew        | (none: txstream)           |
    | check_backoff_max     | (none: txstream)           |

    The defaults are the fields' own (the flags of ``txstream run`` show them, and
    docs/configuration.md lists them, checked by tests/cli/test_flag_defaults.py).

    ``orphan_end_timeout``: how long an end event waits for its half message before it goes to
    the dead-letter topic. ``resolved_retention``: how long a resolved transaction is remembered
    so that duplicates and conflicting decisions are recognised.

    ``timer_lead``: a timer due within this long after a micro-batch's start runs in that batch,
    as of its deadline, and what it writes is held back until the deadline. Without it a timer
    waits for the first batch that starts after its deadline, and its records come at the end of
    that batch: up to two batch durations late. 0 runs timers only once due. Longer than a
    busy batch's duration, it costs: a batch that carries a check due after the batch's
    natural end cannot finish before that deadline (docs/decisions/0004-timer-lead.md). Only a
    check runs ahead: a discard, or an end event's expiry, waits for its deadline, so that an
    end event that comes before it still wins.

    ``max_clock_skew``: how far a producer's born time may be from the broker's timestamp of
    the half message before timers count from the broker's time instead (``txstream.state.timing``).

    ``check_backoff_max``: while checks go unanswered (the group is away), each next check
    comes twice as long after the last, up to this many check intervals; one answered check
    restores the interval. 1 checks every interval, as RocketMQ does.
    """

    transaction_timeout: int = 6 * SECOND
    check_interval: int = 60 * SECOND
    check_max: int = 15
    reserved_time: int = 72 * HOUR
    orphan_end_timeout: int = 60 * SECOND
    resolved_retention: int = 120 * SECOND
    timer_lead: int = 500
    max_clock_skew: int = 10 * SECOND
    check_backoff_max: int = 16

    def __post_init__(self) -> None:
        for name in (
            "transaction_timeout",
            "check_interval",
            "reserved_time",
            "orphan_end_timeout",
            "resolved_retention",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.timer_lead < 0 or self.max_clock_skew < 0:
            raise ValueError("timer_lead and max_clock_skew must not be negative")
        if self.check_max < 0:
            raise ValueError("check_max must not be negative")
        if self.check_backoff_max < 1:
            raise ValueError("check_backoff_max must be at least 1 (no back-off)")
        # Settings that contradict each other: every message discarded before its first check.
        if self.reserved_time <= self.transaction_timeout:
            raise ValueError(f"reserved_time ({self.reserved_time} ms) must be longer than "
                             f"transaction_timeout ({self.transaction_timeout} ms): every "
                             "message would be discarded before its first back-check")
