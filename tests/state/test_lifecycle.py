"""The transaction state machine, entry by entry and deadline by deadline (no Spark, no Kafka)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.tx_helpers import (
    COMMIT,
    ROLLBACK,
    T0,
    UNKNOWN,
    P,
    answer,
    end,
    half,
    kinds,
    only,
    reach,
    registered,
)
from txstream.message import Decision, EndEvent, Message
from txstream.state.effects import DeadLetter, Discard, Note, Release, RequestCheck
from txstream.state.lifecycle import TRANSITIONS, Action, Trigger, apply, on_timeout, trigger_of
from txstream.state.policy import HOUR, SECOND, Policy
from txstream.state.transaction import BodyGone, FoundReleased, Status, Transaction

# --- every entry of TRANSITIONS ----------------------------------------------------------------


_EVENT_OF: dict[Trigger, Message | EndEvent | BodyGone | FoundReleased] = {
    Trigger.HALF: half(),
    Trigger.COMMIT: end(COMMIT),
    Trigger.ROLLBACK: end(ROLLBACK),
    Trigger.UNKNOWN: end(UNKNOWN),
    Trigger.BODY_GONE: BodyGone("tx-1", "is no longer in the topic"),
    Trigger.FOUND_RELEASED: FoundReleased("tx-1", "orders"),
}

# What each action emits, in order (for a transaction reached by ``_reach``).
_EFFECTS_OF = {
    Action.REGISTER: [Note],
    Action.HOLD_END: [Note],
    Action.MERGE_HELD: [Note],
    Action.APPLY_HELD: [Note, Note],  # registered, then the held UNKNOWN applied
    Action.RELEASE: [Release, Note],
    Action.DROP: [Note],
    Action.WAIT: [Note],
    Action.DUPLICATE: [Note],
    Action.REJECT: [DeadLetter, Note],
    Action.CHECK: [RequestCheck, Note],
    Action.EXPIRE: [DeadLetter, Note],
    Action.FORGET: [],
    Action.MARK_GONE: [Note],
    Action.RELEASE_AGAIN: [Release, Note],
    Action.IGNORE: [],
    Action.ADOPT: [Note],
}
# Where the transaction reached makes a difference.
_EFFECTS_FROM = {
    (Status.EARLY_END, Action.ADOPT): [Note, Note],  # found released, then the held UNKNOWN
}


@pytest.mark.parametrize(
    ("before", "trigger", "after", "action"),
    [(b, t, a, act) for (b, t), (a, act) in TRANSITIONS.items()],
    ids=[f"{b.value if b else 'None'}-{t.value}" for b, t in TRANSITIONS],
)
def test_every_transition(
    before: Status | None, trigger: Trigger, after: Status | None, action: Action
) -> None:
    tx = reach(before)
    assert (tx.status if tx else None) is before
    if trigger is Trigger.TIMEOUT:
        assert tx is not None
        new, effects = on_timeout(tx, tx.deadline, P)
    else:
        event = _EVENT_OF[trigger]
        assert trigger_of(event) is trigger
        new, effects = apply(tx, event, T0 + 1, P)
    assert (new.status if new else None) is after
    assert kinds(effects) == _EFFECTS_FROM.get((before, action), _EFFECTS_OF[action])
    if action in (Action.DUPLICATE, Action.REJECT):
        assert new is tx  # nothing changes
    for e in effects:
        if isinstance(e, DeadLetter | Discard):
            assert e.reason


def test_the_table_covers_every_status_and_trigger() -> None:
    statuses: list[Status | None] = [None, *Status]
    missing = [
        (s, t) for s in statuses for t in Trigger
        if (s, t) not in TRANSITIONS and (s, t) != (None, Trigger.TIMEOUT)
    ]
    assert missing == []
    assert (None, Trigger.TIMEOUT) not in TRANSITIONS  # nothing unknown has a timer


def test_every_action_is_reachable_from_the_table() -> None:
    assert {action for _, action in TRANSITIONS.values()} == set(Action)


def test_resolved_statuses() -> None:
    assert {s for s in Status if s.resolved} == {
        Status.COMMITTED, Status.ROLLED_BACK, Status.DISCARDED, Status.LOST
    }


# --- first check ------------------------------------------------------------------------------


def test_first_check_is_transaction_timeout_after_born() -> None:
    tx = registered(now=T0 + 1000)  # arrived a second after it was born
    assert tx.next_check == tx.deadline == T0 + P.transaction_timeout
    same, effects = on_timeout(tx, T0 + P.transaction_timeout - 1, P)
    assert same is tx and effects == []
    new, effects = on_timeout(tx, T0 + P.transaction_timeout, P)
    assert kinds(effects) == [RequestCheck, Note]
    check = effects[0]
    assert isinstance(check, RequestCheck)
    assert check.check_times == 1 and check.late_ms == 0 and check.message == tx.half
    assert new is not None and new.status is Status.PENDING and new.checks_sent == 1


def test_check_records_how_late_it_was_asked() -> None:
    tx = registered()
    _, effects = on_timeout(tx, T0 + P.transaction_timeout + 750, P)
    assert isinstance(effects[0], RequestCheck) and effects[0].late_ms == 750


@pytest.mark.parametrize("immunity_s", [0, 2, 30, 3600])
def test_check_immunity_replaces_the_transaction_timeout(immunity_s: int) -> None:
    tx = registered(immunity=immunity_s)
    assert tx.deadline == T0 + immunity_s * SECOND
    assert on_timeout(tx, tx.deadline - 1, P)[1] == []
    assert kinds(on_timeout(tx, tx.deadline, P)[1]) == [RequestCheck, Note]


def test_negative_check_immunity_means_the_default_timeout() -> None:
    # RocketMQ reads -1 as "use transactionTimeout"; it must never check before the birth.
    tx = registered(immunity=-1)
    assert tx.deadline == T0 + P.transaction_timeout


def test_born_in_the_future_counts_from_now() -> None:
    tx = registered(now=T0, born=T0 + 10 * 60 * SECOND)
    assert tx.deadline == T0 + P.transaction_timeout
    tx = registered(now=T0, born=T0 + 10 * 60 * SECOND, immunity=20)
    assert tx.deadline == T0 + 20 * SECOND


def test_no_born_time_counts_from_now() -> None:
    assert registered(now=T0 + 5, born=None).deadline == T0 + 5 + P.transaction_timeout


def test_half_already_past_its_first_check_is_due_at_once() -> None:
    tx = registered(now=T0 + 60 * SECOND)
    assert tx.deadline == T0 + P.transaction_timeout < T0 + 60 * SECOND
    _, effects = on_timeout(tx, T0 + 60 * SECOND, P)
    assert isinstance(effects[0], RequestCheck) and effects[0].check_times == 1


# --- later checks -----------------------------------------------------------------------------


def test_answered_checks_repeat_every_check_interval_from_when_asked() -> None:
    tx: Transaction | None = registered()
    asked = T0 + P.transaction_timeout + 300  # timers fire a little late
    for number in (1, 2, 3):
        assert tx is not None
        tx, effects = on_timeout(tx, asked, P)
        assert isinstance(effects[0], RequestCheck) and effects[0].check_times == number
        assert effects[0].valid_until == asked + P.check_interval
        assert tx is not None and tx.deadline == asked + P.check_interval
        assert on_timeout(tx, asked + P.check_interval - 1, P)[1] == []
        tx, _ = apply(tx, answer(UNKNOWN, number), asked + 10, P)
        asked += P.check_interval


def test_unanswered_checks_back_off_to_at_most_check_backoff_max_intervals() -> None:
    tx: Transaction | None = registered()
    asked = T0 + P.transaction_timeout
    spacings = []
    for _ in range(8):
        assert tx is not None
        tx, _ = on_timeout(tx, asked, P)
        assert tx is not None
        spacings.append((tx.deadline - asked) // P.check_interval)
        asked = tx.deadline
    assert spacings == [1, 2, 4, 8, 16, 16, 16, 16]


def test_unknown_keeps_waiting_and_keeps_the_timer() -> None:
    tx = registered()
    new, effects = apply(tx, end(UNKNOWN), T0 + 1, P)
    assert new is not None and new.status is Status.PENDING and new.deadline == tx.deadline
    assert new.checks_answered == 0  # the producer's own UNKNOWN answers no check
    assert only(effects, Release) == [] and only(effects, DeadLetter) == []


def _checked(tx: Transaction, times: int, policy: Policy = P) -> Transaction:
    for _ in range(times):
        new, effects = on_timeout(tx, tx.deadline, policy)
        assert new is not None and only(effects, RequestCheck)
        tx = new
    return tx


def test_only_an_answer_to_the_latest_check_counts_and_only_once() -> None:
    tx = _checked(registered(), 3)
    now = tx.check_due  # the latest check is out
    assert now is not None
    for stale in (1, 2):  # answers to checks a newer one replaced
        new, _ = apply(tx, answer(UNKNOWN, stale), now, P)
        assert new is not None and new.checks_answered == 0
    for _ in range(3):  # the latest, and its duplicates
        new, _ = apply(tx, answer(UNKNOWN, 3), now, P)
        assert new is not None and new.checks_answered == 1 and new.last_answered == 3
        tx = new


def test_a_group_back_after_twenty_unanswered_checks_is_not_discarded_at_once() -> None:
    # While the group was away, 20 checks went out; its returning producer answers the last.
    policy = dataclasses.replace(P, check_max=3)
    tx = _checked(registered(policy=policy), 20, policy)
    tx = apply(tx, answer(UNKNOWN, 20), T0, policy)[0]  # type: ignore[assignment]
    assert tx.checks_answered == 1
    _, effects = on_timeout(tx, tx.deadline, policy)
    assert kinds(effects) == [RequestCheck, Note]  # check 21, not a discard


def test_answer_without_a_check_number_answers_the_latest_check_once() -> None:
    tx = _checked(registered(), 2)
    for _ in range(4):  # a duplicated answer must not count again
        new, _ = apply(tx, answer(UNKNOWN, None), tx.check_due or 0, P)
        assert new is not None and new.checks_answered == 1 and new.last_answered == 2
        tx = new


def test_answer_to_a_check_never_sent_counts_nothing() -> None:
    tx = _checked(registered(), 1)
    new, _ = apply(tx, answer(UNKNOWN, 99), T0 + 1, P)
    assert new is not None and new.checks_answered == 0


def test_check_max_counts_answered_checks_only() -> None:
    policy = dataclasses.replace(P, check_max=2)
    tx = _checked(registered(policy=policy), 1, policy)
    tx = apply(tx, answer(UNKNOWN, 1), T0, policy)[0]  # type: ignore[assignment]
    tx = _checked(tx, 1, policy)  # 1 answered < 2: check number 2 goes out
    assert tx.checks_sent == 2
    tx = apply(tx, answer(UNKNOWN, 2), T0, policy)[0]  # type: ignore[assignment]
    at = tx.deadline
    new, effects = on_timeout(tx, at, policy)
    assert kinds(effects) == [Discard, Note]
    discard = effects[0]
    assert isinstance(discard, Discard)
    assert discard.check_times == 2 and discard.message == tx.half
    assert "check_max=2" in discard.reason and "2 answered" in discard.reason
    assert new is not None and new.status is Status.DISCARDED
    assert new.half is None and new.deadline == at + policy.resolved_retention


def test_unanswered_checks_never_reach_check_max() -> None:
    policy = dataclasses.replace(P, check_max=1)
    tx = _checked(registered(policy=policy), 10, policy)
    assert tx.checks_sent == 10 and tx.checks_answered == 0 and tx.status is Status.PENDING


def test_check_max_zero_discards_at_the_first_check() -> None:
    policy = dataclasses.replace(P, check_max=0)
    tx = registered(policy=policy)
    assert on_timeout(tx, tx.deadline - 1, policy)[1] == []
    new, effects = on_timeout(tx, tx.deadline, policy)
    assert kinds(effects) == [Discard, Note]
    assert new is not None and new.status is Status.DISCARDED


# --- reserved time ----------------------------------------------------------------------------


def test_reserved_time_caps_the_deadline_and_discards() -> None:
    policy = Policy(transaction_timeout=6 * SECOND, check_interval=60 * SECOND,
                    reserved_time=100 * SECOND)
    tx = _checked(registered(policy=policy), 2, policy)  # checks at 6 s and 66 s
    assert tx.deadline == T0 + 100 * SECOND  # not 126 s: the reserved time comes first
    assert on_timeout(tx, T0 + 100 * SECOND - 1, policy)[1] == []
    new, effects = on_timeout(tx, T0 + 100 * SECOND, policy)
    assert kinds(effects) == [Discard, Note]
    assert isinstance(effects[0], Discard) and "reserved time" in effects[0].reason
    assert new is not None and new.status is Status.DISCARDED


def test_the_reserved_time_counts_from_registration_not_the_born_time() -> None:
    # Born 72 h ago by its producer's clock (a clock far behind, or a coordinator catching
    # up after an outage): checked at once, discarded only 72 h after it was registered.
    now = T0 + 72 * HOUR
    tx = registered(now=now, born=T0)
    assert tx.seen_at == now and tx.deadline <= now  # its first check is due at once
    new, effects = on_timeout(tx, now, P)
    assert kinds(effects) == [RequestCheck, Note]
    assert new is not None and new.deadline <= now + 72 * HOUR
    _, effects = on_timeout(new, now + 72 * HOUR, P)
    assert isinstance(effects[0], Discard) and "72 h" in effects[0].reason


def test_a_discard_for_age_waits_until_the_end_topic_is_read_past_its_deadline() -> None:
    policy = Policy(transaction_timeout=6 * SECOND, check_interval=60 * SECOND,
                    reserved_time=100 * SECOND, check_max=5)
    tx = _checked(registered(policy=policy), 2, policy)
    deadline = T0 + 100 * SECOND
    assert tx.deadline == deadline
    for ends_read in (T0, deadline - 1):  # a commit written before the deadline may be unread
        same, effects = on_timeout(tx, deadline + 5 * SECOND, policy, ends_read)
        assert same is tx and effects == []
    new, effects = on_timeout(tx, deadline + 5 * SECOND, policy, deadline)
    assert kinds(effects) == [Discard, Note] and new is not None
    assert new.status is Status.DISCARDED


# --- outcomes and duplicates ------------------------------------------------------------------


def test_commit_releases_once() -> None:
    tx = registered()
    new, effects = apply(tx, end(COMMIT, born=T0 + 40), T0 + 50, P)
    assert kinds(effects) == [Release, Note]
    release = effects[0]
    assert isinstance(release, Release) and release.message == half()
    assert release.committed_at == T0 + 40
    assert new is not None and new.status is Status.COMMITTED
    assert new.half is None and new.deadline == T0 + 50 + P.resolved_retention
    again, effects = apply(new, end(COMMIT), T0 + 60, P)
    assert again is new and only(effects, Release) == [] and only(effects, DeadLetter) == []
    again, effects = apply(new, end(COMMIT, from_check=True, check_times=1), T0 + 60, P)
    assert again is new and only(effects, Release) == []


def test_rollback_never_releases() -> None:
    new, effects = apply(registered(), end(ROLLBACK), T0 + 50, P)
    assert kinds(effects) == [Note]
    assert new is not None and new.status is Status.ROLLED_BACK and new.half is None


@pytest.mark.parametrize(
    ("first", "second", "status"),
    [(COMMIT, ROLLBACK, "COMMITTED"), (ROLLBACK, COMMIT, "ROLLED_BACK")],
)
def test_contradicting_decision_is_dead_lettered(
    first: Decision, second: Decision, status: str
) -> None:
    tx = apply(registered(), end(first), T0, P)[0]
    new, effects = apply(tx, end(second), T0 + 1, P)
    assert new is tx
    assert kinds(effects) == [DeadLetter, Note]
    dead = effects[0]
    assert isinstance(dead, DeadLetter) and dead.event == end(second)
    assert status in dead.reason and second.value in dead.reason


def test_commit_after_discard_is_dead_lettered_rollback_is_harmless() -> None:
    tx = reach(Status.DISCARDED)
    new, effects = apply(tx, end(COMMIT), T0 + 1, P)
    assert new is tx and kinds(effects) == [DeadLetter, Note]
    new, effects = apply(tx, end(ROLLBACK), T0 + 1, P)
    assert new is tx and kinds(effects) == [Note]


def test_duplicate_half_changes_nothing() -> None:
    tx = registered()
    new, effects = apply(tx, half(), T0 + 2000, P)
    assert new is tx and kinds(effects) == [Note]


# --- forgetting -------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "resolved_at"), [
    (Status.COMMITTED, T0), (Status.ROLLED_BACK, T0), (Status.DISCARDED, T0 + P.reserved_time),
])
def test_resolved_transaction_is_forgotten_after_the_retention(status: Status,
                                                               resolved_at: int) -> None:
    tx = reach(status)
    assert tx is not None and tx.deadline == resolved_at + P.resolved_retention
    assert tx.remember_until == resolved_at + P.reserved_time  # its outcome, after that
    same, effects = on_timeout(tx, tx.deadline - 1, P)
    assert same is tx and effects == []
    assert on_timeout(tx, tx.deadline, P) == (None, [])


@pytest.mark.parametrize("status", list(Status))
def test_on_timeout_before_the_deadline_is_a_no_op(status: Status) -> None:
    tx = reach(status)
    assert tx is not None
    for now in (T0 - 10**9, tx.deadline - 1):
        same, effects = on_timeout(tx, now, P)
        assert same is tx and effects == []


# --- misuse and determinism -------------------------------------------------------------------


def test_event_for_another_transaction_is_refused() -> None:
    with pytest.raises(ValueError, match="tx-2"):
        apply(registered(), end(COMMIT, txid="tx-2"), T0, P)


def test_event_without_transaction_id_is_refused() -> None:
    with pytest.raises(ValueError, match="no transaction id"):
        apply(None, half(txid=""), T0, P)


@pytest.mark.parametrize("field", ["transaction_timeout", "check_interval", "reserved_time",
                                   "orphan_end_timeout", "resolved_retention"])
def test_policy_refuses_non_positive_durations(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        Policy(**{field: 0})


def test_policy_refuses_negative_check_max() -> None:
    with pytest.raises(ValueError, match="check_max"):
        Policy(check_max=-1)


def test_same_inputs_give_the_same_outputs() -> None:
    def run() -> list[object]:
        out: list[object] = []
        tx, effects = apply(None, end(UNKNOWN), T0, P)
        out += [tx, effects]
        tx, effects = apply(tx, half(), T0 + 1, P)
        out += [tx, effects]
        assert tx is not None
        tx, effects = on_timeout(tx, tx.deadline + 3, P)
        out += [tx, effects]
        tx, effects = apply(tx, end(COMMIT, from_check=True, check_times=1), T0 + 9000, P)
        return [*out, tx, effects]

    assert run() == run()
