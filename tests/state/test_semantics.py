"""RocketMQ's rules where a careful reading found txstream wrong, each through the pure core:
a producer's clock, the timer lead and outcomes, RocketMQ's -1 immunity, contradicting
settings, a group that goes away and returns, and outcomes remembered after the retention."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from tests.support.tx_helpers import COMMIT, ROLLBACK, T0, UNKNOWN, answer, end, half, kinds, only
from txstream.state.bucket import Bucket
from txstream.state.effects import DeadLetter, Discard, Note, Release, RequestCheck
from txstream.state.lifecycle import apply
from txstream.state.policy import Policy
from txstream.state.transaction import Status

SECOND = 1000
RESERVED = Policy(transaction_timeout=6 * SECOND, check_interval=60 * SECOND,
                  reserved_time=30 * SECOND, timer_lead=500)


def _stored(skew_ms: int, **kw: object) -> object:
    """A half message whose producer's clock is ``skew_ms`` off the broker's (T0)."""
    msg = half(born=T0 + skew_ms, **kw)  # type: ignore[arg-type]
    msg.stored_timestamp = T0
    return msg


@pytest.mark.parametrize("skew_s", [-31, -3600, 3600, -100 * 3600, 365 * 24 * 3600])
def test_a_producers_clock_far_off_the_brokers_decides_nothing(skew_s: int) -> None:
    registered_at = T0 + 50
    tx, _ = apply(None, _stored(skew_s * SECOND), registered_at, RESERVED)  # type: ignore[arg-type]
    assert tx is not None and tx.status is Status.PENDING
    # The first check counts from when the broker stored it, a transaction timeout on, not
    # an hour early or late; the reserved time from when the coordinator registered it.
    assert tx.next_check == T0 + RESERVED.transaction_timeout
    bucket = Bucket({tx.transaction_id: tx})
    fired = bucket.fire_due(registered_at + RESERVED.reserved_time - 1, RESERVED)
    assert not only(fired, Discard)
    fired = bucket.fire_due(registered_at + RESERVED.reserved_time, RESERVED)
    assert "reserved time" in only(fired, Discard)[0].reason


def test_a_producers_clock_within_the_skew_is_taken_as_it_is() -> None:
    tx, _ = apply(None, _stored(-4 * SECOND), T0, RESERVED)  # type: ignore[arg-type]
    assert tx is not None and tx.next_check == T0 - 4 * SECOND + RESERVED.transaction_timeout


def test_an_end_event_just_before_a_discard_deadline_wins_over_the_timer_lead() -> None:
    policy = dataclasses.replace(RESERVED, check_max=1, reserved_time=3600 * SECOND)
    tx, _ = apply(None, half(born=T0), T0, policy)
    assert tx is not None
    bucket = Bucket({tx.transaction_id: tx})
    [(at, _)] = bucket.run_timers(tx.deadline, 0, policy)  # check 1
    bucket.apply(answer(UNKNOWN, 1), at + 10, policy)  # answered: still unknown
    deadline = bucket.get(tx.transaction_id).deadline  # type: ignore[union-attr]
    # A batch starts 400 ms before the discard is due: within the lead, but it must not run.
    assert bucket.run_timers(deadline - 400, policy.timer_lead, policy) == []
    assert bucket.next_wakeup(policy.timer_lead, policy) == deadline
    effects = bucket.apply(end(COMMIT, born=deadline - 200), deadline - 200, policy)
    assert kinds(effects)[0] is Release
    assert bucket.get(tx.transaction_id).status is Status.COMMITTED  # type: ignore[union-attr]


def test_a_check_still_runs_ahead_within_the_lead() -> None:
    tx, _ = apply(None, half(born=T0), T0, RESERVED)
    assert tx is not None
    bucket = Bucket({tx.transaction_id: tx})
    assert bucket.next_wakeup(500, RESERVED) == tx.deadline - 500
    [(at, effects)] = bucket.run_timers(tx.deadline - 400, 500, RESERVED)
    assert at == tx.deadline and kinds(effects)[0] is RequestCheck


def test_rocketmqs_minus_one_immunity_means_the_transaction_timeout() -> None:
    tx, _ = apply(None, half(born=T0, immunity=-1), T0, RESERVED)
    assert tx is not None and tx.next_check == T0 + RESERVED.transaction_timeout


def test_settings_that_contradict_each_other_are_refused() -> None:
    with pytest.raises(ValueError, match=r"reserved_time .* must be longer than "
                                         "transaction_timeout"):
        Policy(transaction_timeout=60 * SECOND, reserved_time=30 * SECOND)


AWAY = Policy(transaction_timeout=10 * SECOND, check_interval=2 * SECOND, check_max=3,
              reserved_time=3600 * SECOND)


def _checks_while_away(bucket: Bucket, until: int) -> list[RequestCheck]:
    """Run the bucket's timers up to ``until`` with nobody answering."""
    sent: list[RequestCheck] = []
    while (due := bucket.next_wakeup(0, AWAY)) is not None and due <= until:
        sent += only(bucket.fire_due(due, AWAY), RequestCheck)
    return sent


@pytest.mark.parametrize("away_intervals", [12, 600])
def test_a_group_away_is_asked_less_and_less_and_gets_every_check_when_back(
    away_intervals: int,
) -> None:
    bucket = Bucket()
    bucket.apply(half(born=T0), T0, AWAY)
    first = T0 + AWAY.transaction_timeout
    back = first + away_intervals * AWAY.check_interval
    sent = _checks_while_away(bucket, back)
    # Spaced 1, 2, 4, 8, then 16 intervals: not one request per interval.
    spacing = [b.valid_until - a.valid_until for a, b in itertools.pairwise(sent)]  # type: ignore[operator]
    doubling = [4 * SECOND, 8 * SECOND, 16 * SECOND] + [32 * SECOND] * len(spacing)
    assert spacing == doubling[:len(spacing)]
    assert len(sent) <= 5 + away_intervals // AWAY.check_backoff_max
    # Each request says until when it holds: when the next one is due.
    latest = sent[-1]
    assert latest.valid_until is not None and latest.valid_until > back
    # The group returns and answers the latest request at once: that counts; the backlog's
    # older requests (answered by a slow client) count nothing.
    bucket.apply(answer(UNKNOWN, sent[0].check_times), back + 100, AWAY)
    bucket.apply(answer(UNKNOWN, latest.check_times), back + 200, AWAY)
    tx = bucket.get("tx-1")
    assert tx is not None and tx.checks_answered == 1
    # From then on one check per interval, each answered: check_max answers, then the discard.
    answered, now = 1, back + 200
    while answered < AWAY.check_max:
        due = bucket.next_wakeup(0, AWAY)
        assert due is not None and due <= max(now, latest.valid_until) + AWAY.check_interval
        [check] = only(bucket.fire_due(due, AWAY), RequestCheck)
        assert check.valid_until == due + AWAY.check_interval  # answered: no back-off
        assert not only(bucket.apply(answer(UNKNOWN, check.check_times), due + 50, AWAY),
                        Discard)
        answered, now = answered + 1, due + 50
    due = bucket.next_wakeup(0, AWAY)
    assert due is not None
    [discard] = only(bucket.fire_due(due, AWAY), Discard)
    assert discard.check_times == AWAY.check_max


def test_a_backoff_of_one_checks_every_interval_as_rocketmq_does() -> None:
    policy = dataclasses.replace(AWAY, check_backoff_max=1)
    bucket = Bucket()
    bucket.apply(half(born=T0), T0, policy)
    sent = []
    while (due := bucket.next_wakeup(0, policy)) is not None and due <= T0 + 30 * SECOND:
        sent += only(bucket.fire_due(due, policy), RequestCheck)
    assert [c.valid_until for c in sent] == [T0 + (12 + 2 * i) * SECOND for i in range(len(sent))]
    with pytest.raises(ValueError, match="check_backoff_max"):
        dataclasses.replace(AWAY, check_backoff_max=0)


REMEMBER = Policy(transaction_timeout=6 * SECOND, check_interval=60 * SECOND, check_max=1,
                  reserved_time=3600 * SECOND, resolved_retention=120 * SECOND)


def _resolved_and_forgotten(decision_or_none: object) -> tuple[Bucket, int]:
    """A bucket whose one transaction was committed (or discarded, for None) and has left the
    state, through a save and a load; returns it and the time it was forgotten."""
    bucket = Bucket()
    bucket.apply(half(born=T0), T0, REMEMBER)
    if decision_or_none is None:  # discarded after check_max answered checks
        [check] = only(bucket.fire_due(T0 + 6 * SECOND, REMEMBER), RequestCheck)
        bucket.apply(answer(UNKNOWN, check.check_times), T0 + 7 * SECOND, REMEMBER)
        assert only(bucket.fire_due(T0 + 66 * SECOND, REMEMBER), Discard)
    else:
        assert only(bucket.apply(end(COMMIT), T0 + SECOND, REMEMBER), Release)
    resolved = bucket.get("tx-1")
    assert resolved is not None and resolved.status.resolved
    bucket.fire_due(resolved.deadline, REMEMBER)
    assert bucket.get("tx-1") is None and len(bucket.outcomes) == 1
    return Bucket.decode(bucket.encode()), resolved.deadline


def test_a_half_read_again_after_the_retention_is_not_released_again() -> None:
    bucket, forgotten = _resolved_and_forgotten(COMMIT)
    again = bucket.apply(half(born=T0), forgotten + 1, REMEMBER)
    assert kinds(again) == [Note] and again[0].event == "duplicate"  # type: ignore[attr-defined]
    assert bucket.get("tx-1") is None  # nothing registered: no check, no second release
    assert bucket.apply(end(COMMIT), forgotten + 2, REMEMBER)[0].event == "duplicate"  # type: ignore[attr-defined]
    # Remembered for the reserved time after it was decided (a checkpoint reset reads the
    # older outcomes back from the history topic: sources.journal).
    assert bucket.next_wakeup(0, REMEMBER) == T0 + SECOND + REMEMBER.reserved_time
    bucket.fire_due(T0 + SECOND + REMEMBER.reserved_time, REMEMBER)
    assert len(bucket.outcomes) == 0 and bucket.next_wakeup(0, REMEMBER) is None


@pytest.mark.parametrize(("outcome", "contradiction", "named"), [
    (COMMIT, ROLLBACK, "already COMMITTED"),
    (None, COMMIT, "already DISCARDED"),
])
def test_a_late_end_event_after_the_retention_is_told_the_outcome(
    outcome: object, contradiction: object, named: str
) -> None:
    bucket, forgotten = _resolved_and_forgotten(outcome)
    effects = bucket.apply(end(contradiction, group="another"), forgotten + 1, REMEMBER)  # type: ignore[arg-type]
    [dead] = only(effects, DeadLetter)
    assert named in dead.reason and "no half message" not in dead.reason
