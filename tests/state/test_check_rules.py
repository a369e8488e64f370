"""Back-checks as their rules say: an answer restores the interval, a check request names the
life of its transaction, and the answered-checks metric counts what the core counted (no Spark,
no Kafka)."""

from __future__ import annotations

import dataclasses

from tests.support.tx_helpers import COMMIT, T0, UNKNOWN, P, answer, half
from txstream.client.check_choice import CheckChoice, Fetched, Verdict
from txstream.outputs import CheckRequest
from txstream.state.bucket import Bucket
from txstream.state.effects import RequestCheck
from txstream.state.lifecycle import apply, on_timeout
from txstream.state.policy import SECOND
from txstream.state.transaction import Transaction
from txstream.streaming.engine.key_metrics import Counted, KeyTally

BACKING_OFF = dataclasses.replace(P, check_interval=60 * SECOND, check_backoff_max=16,
                                  check_max=15)


def _checked(tx: Transaction, times: int) -> tuple[Transaction, int]:
    """``tx`` after ``times`` checks nobody answered; the time of the last one."""
    at = 0
    for _ in range(times):
        at = tx.deadline
        new, _ = on_timeout(tx, at, BACKING_OFF)
        assert new is not None
        tx = new
    return tx, at


def test_an_answer_brings_the_next_check_within_one_interval() -> None:
    """An answer sets the next check's time again: fixed when a check was sent, it stayed
    backed off after unanswered checks (959 s after an answer with a 60 s interval)."""
    tx, _ = apply(None, half(), T0, BACKING_OFF)
    assert tx is not None
    tx, last = _checked(tx, 5)  # backed off: the next is 16 intervals away
    assert tx.next_check is not None and tx.next_check - last == 16 * 60 * SECOND
    answered_at = last + 5 * SECOND
    new, effects = apply(tx, answer(UNKNOWN, tx.checks_sent), answered_at, BACKING_OFF)
    assert new is not None and new.checks_answered == 1
    assert new.next_check == answered_at + 60 * SECOND
    assert new.deadline == new.next_check
    assert effects[0].detail["next_check"] == new.next_check  # type: ignore[attr-defined]
    # And the check after it comes one interval later again: the back-off starts over.
    after, [check, _] = on_timeout(new, new.deadline, BACKING_OFF)
    assert isinstance(check, RequestCheck) and after is not None
    assert after.next_check == new.deadline + 60 * SECOND
    # An answer that does not count (a copy) moves nothing.
    again, _ = apply(new, answer(UNKNOWN, tx.checks_sent), answered_at + 1, BACKING_OFF)
    assert again == new


def test_a_check_names_the_life_of_its_transaction() -> None:
    """A new checkpoint numbers its checks from 1 again; the request says which registration
    it is of, so a producer that answered checks 1..n before answers them again."""
    tx, _ = apply(None, half(), T0, BACKING_OFF)
    assert tx is not None
    _, [check, _] = on_timeout(tx, tx.deadline, BACKING_OFF)
    assert isinstance(check, RequestCheck) and check.life == T0
    choice = CheckChoice()
    old = [Fetched(CheckRequest(half(), n, None, T0), None) for n in (1, 2, 3)]
    assert choice.choose(old, T0).verdicts == (Verdict.SUPERSEDED,) * 2 + (Verdict.ANSWER,)
    later = T0 + 3_600_000  # registered again by a new checkpoint
    new = [Fetched(CheckRequest(half(), 1, None, later), None)]
    assert choice.choose(new, later).verdicts == (Verdict.ANSWER,)
    # A request of an older coordinator names no life: it is of life 0, before any named one.
    assert choice.choose([Fetched(CheckRequest(half(), 5, None), None)], later).verdicts == (
        Verdict.TAKEN,)


def test_the_answered_checks_metric_counts_what_the_core_counted() -> None:
    """Only the answers the core takes are counted, not stale ones, copies or another
    group's (counting every answer from a check gave 4 where the core counted 1)."""
    bucket = Bucket()
    tally = KeyTally(T0)
    bucket.apply(half(), T0, BACKING_OFF)
    for _ in range(2):  # two checks: the first one's answers are stale by then
        tx = bucket.get("tx-1")
        assert tx is not None
        bucket.fire_due(tx.deadline, BACKING_OFF)
    tx = bucket.get("tx-1")
    assert tx is not None and tx.checks_sent == 2
    now = tx.next_check - 1  # type: ignore[operator]
    answers = [answer(UNKNOWN, 1),  # stale: check 2 was sent since
               answer(UNKNOWN, 2),  # counts
               answer(UNKNOWN, 2),  # a copy
               answer(UNKNOWN, 2, group="OTHER")]  # not the owner's
    for event in answers:
        before = bucket.get("tx-1")
        tally.applied(event, before, bucket.apply(event, now, BACKING_OFF))
    counted = {labels: n for (name, labels), n in tally.counts.items()
               if name == Counted.CHECKS_ANSWERED}
    assert counted == {("G", "unknown"): 1}
    # A commit that answers a check decides the transaction: it counted.
    before = bucket.get("tx-1")
    tally.applied(answer(COMMIT, 2), before, bucket.apply(answer(COMMIT, 2), now, BACKING_OFF))
    assert tally.counts[(Counted.CHECKS_ANSWERED, ("G", "commit"))] == 1
