"""Producer groups, admin decisions and end events that come before their half message."""

from __future__ import annotations

import dataclasses

import pytest

from tests.support.tx_helpers import (
    COMMIT,
    ROLLBACK,
    T0,
    UNKNOWN,
    P,
    end,
    half,
    kinds,
    only,
    reach,
    registered,
)
from txstream.message import Decision, EndEvent
from txstream.state.effects import DeadLetter, Note, Release
from txstream.state.lifecycle import apply, on_timeout
from txstream.state.transaction import Status

# --- producer groups --------------------------------------------------------------------------


@pytest.mark.parametrize("status", [Status.PENDING, Status.COMMITTED, Status.ROLLED_BACK,
                                    Status.DISCARDED])
@pytest.mark.parametrize("decision", [COMMIT, ROLLBACK, UNKNOWN])
def test_end_from_another_group_is_dead_lettered(status: Status, decision: Decision) -> None:
    tx = reach(status)
    intruder = end(decision, group="OTHER", from_check=True, check_times=1)
    new, effects = apply(tx, intruder, T0 + 1, P)
    assert new is tx
    assert kinds(effects) == [DeadLetter, Note]
    dead = effects[0]
    assert isinstance(dead, DeadLetter) and dead.event is intruder
    assert "'OTHER'" in dead.reason and "'G'" in dead.reason


@pytest.mark.parametrize(("decision", "status"), [(COMMIT, Status.COMMITTED),
                                                  (ROLLBACK, Status.ROLLED_BACK)])
def test_admin_end_bypasses_the_group_check(decision: Decision, status: Status) -> None:
    new, effects = apply(registered(), end(decision, group="ops", operator="alice"), T0, P)
    assert new is not None and new.status is status
    assert only(effects, DeadLetter) == []
    notes = only(effects, Note)
    assert notes and notes[-1].detail["operator"] == "alice"


def test_empty_operator_is_not_an_admin() -> None:
    new, effects = apply(registered(), end(COMMIT, group="ops", operator=""), T0, P)
    assert new is not None and new.status is Status.PENDING
    assert kinds(effects) == [DeadLetter, Note]


# --- end events before their half message -----------------------------------------------------


@pytest.mark.parametrize(("decision", "status", "released"), [
    (COMMIT, Status.COMMITTED, True),
    (ROLLBACK, Status.ROLLED_BACK, False),
    (UNKNOWN, Status.PENDING, False),
])
def test_held_end_is_applied_when_the_half_arrives(
    decision: Decision, status: Status, released: bool
) -> None:
    held, effects = apply(None, end(decision), T0, P)
    assert held is not None and held.status is Status.EARLY_END
    assert held.deadline == T0 + P.orphan_end_timeout and kinds(effects) == [Note]
    new, effects = apply(held, half(), T0 + 10, P)
    assert new is not None and new.status is status
    assert len(only(effects, Release)) == int(released)
    if status is Status.PENDING:
        assert new.deadline == T0 + P.transaction_timeout and new.half == half()


def test_held_end_of_another_group_is_dead_lettered_when_the_half_arrives() -> None:
    held = apply(None, end(COMMIT, group="OTHER"), T0, P)[0]
    new, effects = apply(held, half(group="G"), T0 + 10, P)
    assert new is not None and new.status is Status.PENDING
    assert only(effects, Release) == []
    dead = only(effects, DeadLetter)
    assert len(dead) == 1 and isinstance(dead[0], DeadLetter)
    assert dead[0].event == end(COMMIT, group="OTHER") and "'OTHER'" in dead[0].reason


def test_held_admin_end_of_another_group_applies() -> None:
    held = apply(None, end(ROLLBACK, group="ops", operator="bob"), T0, P)[0]
    new, effects = apply(held, half(group="G"), T0 + 10, P)
    assert new is not None and new.status is Status.ROLLED_BACK
    assert only(effects, DeadLetter) == []


@pytest.mark.parametrize(("first", "then"), [(UNKNOWN, COMMIT), (COMMIT, UNKNOWN),
                                             (COMMIT, COMMIT)])
def test_merged_early_ends_release_once(first: Decision, then: Decision) -> None:
    tx = apply(None, end(first), T0, P)[0]
    tx, effects = apply(tx, end(then), T0 + 5, P)
    assert tx is not None and tx.status is Status.EARLY_END
    assert tx.deadline == T0 + P.orphan_end_timeout  # a second end does not extend the wait
    assert only(effects, DeadLetter) == []
    new, effects = apply(tx, half(), T0 + 10, P)
    assert new is not None and new.status is Status.COMMITTED
    assert len(only(effects, Release)) == 1


def test_conflicting_early_ends_keep_the_first() -> None:
    tx = apply(None, end(COMMIT), T0, P)[0]
    tx, effects = apply(tx, end(ROLLBACK), T0 + 5, P)
    assert kinds(effects) == [DeadLetter, Note]
    dead = effects[0]
    assert isinstance(dead, DeadLetter) and dead.event == end(ROLLBACK)
    assert "contradicts" in dead.reason
    new, effects = apply(tx, half(), T0 + 10, P)
    assert new is not None and new.status is Status.COMMITTED
    assert len(only(effects, Release)) == 1 and only(effects, DeadLetter) == []


@pytest.mark.parametrize(("intruder", "owner", "status"), [
    (ROLLBACK, COMMIT, Status.COMMITTED),
    (COMMIT, ROLLBACK, Status.ROLLED_BACK),
    (COMMIT, COMMIT, Status.COMMITTED),
])
def test_early_end_of_another_group_does_not_hide_the_owners(
    intruder: Decision, owner: Decision, status: Status
) -> None:
    # Before the half arrives nobody knows which group owns the transaction: both are held.
    tx = apply(None, end(intruder, group="OTHER"), T0, P)[0]
    tx, effects = apply(tx, end(owner, group="G"), T0 + 5, P)
    assert only(effects, DeadLetter) == []
    new, effects = apply(tx, half(group="G"), T0 + 10, P)
    assert new is not None and new.status is status
    assert len(only(effects, Release)) == int(status is Status.COMMITTED)
    dead = only(effects, DeadLetter)
    assert len(dead) == 1 and isinstance(dead[0], DeadLetter)
    assert dead[0].event == end(intruder, group="OTHER") and "'OTHER'" in dead[0].reason


@pytest.mark.parametrize(("first", "then", "status"), [
    (COMMIT, ROLLBACK, Status.COMMITTED),
    (ROLLBACK, COMMIT, Status.ROLLED_BACK),
])
def test_held_ends_of_several_senders_apply_in_arrival_order(
    first: Decision, then: Decision, status: Status
) -> None:
    tx = apply(None, end(first, group="ops", operator="alice"), T0, P)[0]
    tx = apply(tx, end(then, group="G"), T0 + 1, P)[0]
    new, effects = apply(tx, half(), T0 + 2, P)
    assert new is not None and new.status is status  # the first final decision wins
    dead = only(effects, DeadLetter)
    assert len(dead) == 1 and isinstance(dead[0].event, EndEvent)
    assert dead[0].event.decision is then and "contradicts" not in dead[0].reason
    assert status.value in dead[0].reason


def test_held_final_decision_counts_from_when_it_came_not_its_unknown() -> None:
    tx = apply(None, end(UNKNOWN, group="G"), T0, P)[0]
    tx = apply(tx, end(COMMIT, group="ops", operator="alice"), T0 + 1, P)[0]
    tx = apply(tx, end(ROLLBACK, group="G"), T0 + 2, P)[0]  # replaces G's UNKNOW, after alice
    new, effects = apply(tx, half(), T0 + 3, P)
    assert new is not None and new.status is Status.COMMITTED
    assert len(only(effects, Release)) == 1 and len(only(effects, DeadLetter)) == 1


def test_held_end_expires_after_the_orphan_timeout() -> None:
    tx = apply(None, end(COMMIT), T0, P)[0]
    assert tx is not None
    same, effects = on_timeout(tx, T0 + P.orphan_end_timeout - 1, P)
    assert same is tx and effects == []
    gone, effects = on_timeout(tx, T0 + P.orphan_end_timeout, P)
    assert gone is None
    assert kinds(effects) == [DeadLetter, Note]
    dead = effects[0]
    assert isinstance(dead, DeadLetter) and dead.event == end(COMMIT)
    assert "no half message" in dead.reason and "60s" in dead.reason
    # A half arriving after that starts afresh: the expired end is not applied.
    new, effects = apply(gone, half(), T0 + P.orphan_end_timeout + 1, P)
    assert new is not None and new.status is Status.PENDING and only(effects, Release) == []


def test_a_held_end_waits_for_the_half_topic_to_be_read_past_when_it_was_held() -> None:
    """With the half topic read behind the end topic (a backlog, more end partitions than
    half ones under maxOffsetsPerTrigger) a commit's half message may not have been read
    yet when the orphan timeout ends: it must not be dead-lettered NO_HALF_MESSAGE."""
    tx = apply(None, end(COMMIT), T0, P)[0]
    assert tx is not None
    due = T0 + P.orphan_end_timeout
    same, effects = on_timeout(tx, due + 30_000, P, ends_read=T0 - 1)
    assert same is tx and effects == []
    gone, effects = on_timeout(tx, due + 30_000, P, ends_read=T0)
    assert gone is None and kinds(effects) == [DeadLetter, Note]


def test_every_held_end_is_dead_lettered_on_expiry() -> None:
    tx = apply(None, end(COMMIT, group="OTHER"), T0, P)[0]
    tx = apply(tx, end(UNKNOWN, group="G"), T0 + 1, P)[0]
    assert tx is not None
    gone, effects = on_timeout(tx, tx.deadline, P)
    assert gone is None
    events = [e.event for e in only(effects, DeadLetter)]
    assert events == [end(COMMIT, group="OTHER"), end(UNKNOWN, group="G")]


def test_sub_second_orphan_timeout_reason_is_not_zero_seconds() -> None:
    policy = dataclasses.replace(P, orphan_end_timeout=250)
    tx = apply(None, end(COMMIT), T0, policy)[0]
    assert tx is not None
    _, effects = on_timeout(tx, tx.deadline, policy)
    assert isinstance(effects[0], DeadLetter) and "0.25s" in effects[0].reason


