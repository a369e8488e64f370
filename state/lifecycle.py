"""The life of one transaction, as a pure state machine.

``apply(tx, event, now, policy)`` and ``on_timeout(tx, now, policy, ends_read)`` return the
transaction's new state (``None``: forgotten) and the effects to emit. Nothing here does I/O or
reads a clock: ``now`` (the coordinator's time) and ``ends_read`` (how far the end topic has
been read, on the same clock) are given, so the same inputs always give the same outputs (a
replayed micro-batch re-emits exactly what it emitted the first time).

Two clocks are never trusted for a decision: a producer's (its born time may be off by hours)
and a record's timestamp (a topic left at CreateTime, or a broker that ignores LogAppendTime,
keeps the producer's). The reserved time counts from when the coordinator registered the half
message, and a discard for age waits until the end topic has been read past its deadline, so
that a commit written before it is read first (docs/decisions/0022-trusted-time.md).

Every move is listed in :data:`TRANSITIONS`; ``apply`` refuses anything not listed there.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

from txstream.message import Decision, EndEvent, Message
from txstream.refusals import Code
from txstream.state.effects import (
    BodyLost,
    DeadLetter,
    Discard,
    DiscardCause,
    Effect,
    Note,
    NoteKind,
    Release,
    RequestCheck,
)
from txstream.state.policy import Policy
from txstream.state.timing import (
    check_spacing,
    discard_due,
    first_check,
    latest_visible_check,
    pending_deadline,
    registered_at,
    reserved_deadline,
    waits_for_ends,
)
from txstream.state.transaction import BodyGone, Event, FoundReleased, Status, Transaction

__all__ = ["Trigger", "Action", "TRANSITIONS", "MAY_REACH", "apply", "on_timeout", "trigger_of"]


class Trigger(str, Enum):
    HALF = "HALF"
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"
    TIMEOUT = "TIMEOUT"
    BODY_GONE = "BODY_GONE"
    FOUND_RELEASED = "FOUND_RELEASED"


class Action(str, Enum):
    REGISTER = "register"  # store the half message, arm its first check
    HOLD_END = "hold_end"  # keep an early end event until its half message comes
    MERGE_HELD = "merge_held"  # another early end: held beside the others, or merged with its own
    APPLY_HELD = "apply_held"  # the half message came: register it, then apply the held ends
    RELEASE = "release"  # commit: emit to the real topic, once
    DROP = "drop"  # rollback: never visible
    WAIT = "wait"  # unknown: keep waiting (an answered check counts toward check_max)
    DUPLICATE = "duplicate"  # harmless repeat: nothing changes
    REJECT = "reject"  # contradicts the outcome: dead letter, nothing changes
    CHECK = "check"  # timer: ask a producer of the group, or discard after too many
    EXPIRE = "expire"  # timer: the held end event never met its half message
    FORGET = "forget"  # timer: a resolved transaction leaves the state; its outcome stays
    MARK_GONE = "mark_gone"  # the held body is gone: no release or check can carry it
    RELEASE_AGAIN = "release_again"  # a lost release: the half message sent again is released
    IGNORE = "ignore"  # an observation that changes nothing known: nothing to do
    ADOPT = "adopt"  # a predecessor's release found on its topic: committed, nothing written


_S, _T, _A = Status, Trigger, Action
_END_TRIGGERS = (_T.COMMIT, _T.ROLLBACK, _T.UNKNOWN)

# (status before, trigger) -> (status after, action). ``None`` is "not known / forgotten".
# Where the status after depends on more than the trigger (CHECK may discard, APPLY_HELD
# ends where the held decision leads), the table names the status the action usually reaches;
# ``MAY_REACH`` lists every status such an action may reach, and ``apply`` checks it.
TRANSITIONS: dict[tuple[Status | None, Trigger], tuple[Status | None, Action]] = {
    (None, _T.HALF): (_S.PENDING, _A.REGISTER),
    **{(None, t): (_S.EARLY_END, _A.HOLD_END) for t in _END_TRIGGERS},
    (_S.EARLY_END, _T.HALF): (_S.PENDING, _A.APPLY_HELD),
    **{(_S.EARLY_END, t): (_S.EARLY_END, _A.MERGE_HELD) for t in _END_TRIGGERS},
    (_S.EARLY_END, _T.TIMEOUT): (None, _A.EXPIRE),
    (_S.PENDING, _T.HALF): (_S.PENDING, _A.DUPLICATE),
    (_S.PENDING, _T.COMMIT): (_S.COMMITTED, _A.RELEASE),
    (_S.PENDING, _T.ROLLBACK): (_S.ROLLED_BACK, _A.DROP),
    (_S.PENDING, _T.UNKNOWN): (_S.PENDING, _A.WAIT),
    (_S.PENDING, _T.TIMEOUT): (_S.PENDING, _A.CHECK),
    (_S.COMMITTED, _T.HALF): (_S.COMMITTED, _A.DUPLICATE),
    (_S.COMMITTED, _T.COMMIT): (_S.COMMITTED, _A.DUPLICATE),
    (_S.COMMITTED, _T.ROLLBACK): (_S.COMMITTED, _A.REJECT),
    (_S.COMMITTED, _T.UNKNOWN): (_S.COMMITTED, _A.DUPLICATE),
    (_S.COMMITTED, _T.TIMEOUT): (None, _A.FORGET),
    (_S.ROLLED_BACK, _T.HALF): (_S.ROLLED_BACK, _A.DUPLICATE),
    (_S.ROLLED_BACK, _T.COMMIT): (_S.ROLLED_BACK, _A.REJECT),
    (_S.ROLLED_BACK, _T.ROLLBACK): (_S.ROLLED_BACK, _A.DUPLICATE),
    (_S.ROLLED_BACK, _T.UNKNOWN): (_S.ROLLED_BACK, _A.DUPLICATE),
    (_S.ROLLED_BACK, _T.TIMEOUT): (None, _A.FORGET),
    (_S.DISCARDED, _T.HALF): (_S.DISCARDED, _A.DUPLICATE),
    (_S.DISCARDED, _T.COMMIT): (_S.DISCARDED, _A.REJECT),
    (_S.DISCARDED, _T.ROLLBACK): (_S.DISCARDED, _A.DUPLICATE),
    (_S.DISCARDED, _T.UNKNOWN): (_S.DISCARDED, _A.DUPLICATE),
    (_S.DISCARDED, _T.TIMEOUT): (None, _A.FORGET),
    (_S.LOST, _T.HALF): (_S.COMMITTED, _A.RELEASE_AGAIN),
    (_S.LOST, _T.COMMIT): (_S.LOST, _A.DUPLICATE),
    (_S.LOST, _T.ROLLBACK): (_S.LOST, _A.REJECT),
    (_S.LOST, _T.UNKNOWN): (_S.LOST, _A.DUPLICATE),
    (_S.LOST, _T.TIMEOUT): (None, _A.FORGET),
    (_S.PENDING, _T.BODY_GONE): (_S.PENDING, _A.MARK_GONE),
    **{(s, _T.BODY_GONE): (s, _A.IGNORE)
       for s in (None, _S.EARLY_END, _S.COMMITTED, _S.ROLLED_BACK, _S.DISCARDED, _S.LOST)},
    # LOST too: a coordinator before this checkpoint released the half message sent again,
    # and died before its note said so (docs/decisions/0029-releases-found.md).
    **{(s, _T.FOUND_RELEASED): (_S.COMMITTED, _A.ADOPT)
       for s in (None, _S.EARLY_END, _S.PENDING, _S.LOST)},
    **{(s, _T.FOUND_RELEASED): (s, _A.IGNORE)
       for s in (_S.COMMITTED, _S.ROLLED_BACK, _S.DISCARDED)},
}

MAY_REACH: dict[Action, frozenset[Status | None]] = {
    _A.APPLY_HELD: frozenset({_S.PENDING, _S.COMMITTED, _S.ROLLED_BACK}),
    _A.CHECK: frozenset({_S.PENDING, _S.DISCARDED}),
    _A.RELEASE: frozenset({_S.COMMITTED, _S.LOST}),
}


_Result = tuple[Transaction | None, list[Effect]]


def trigger_of(event: Event) -> Trigger:
    if isinstance(event, Message):
        return Trigger.HALF
    if isinstance(event, BodyGone):
        return Trigger.BODY_GONE
    if isinstance(event, FoundReleased):
        return Trigger.FOUND_RELEASED
    return {
        Decision.COMMIT_MESSAGE: Trigger.COMMIT,
        Decision.ROLLBACK_MESSAGE: Trigger.ROLLBACK,
        Decision.UNKNOW: Trigger.UNKNOWN,
    }[event.decision]


def _txid(event: Event) -> str:
    txid = event.transaction_id
    if not txid:
        raise ValueError("event has no transaction id")
    return txid


def _note(txid: str, event: NoteKind, now: int, **detail: object) -> Note:
    return Note(txid, event, now, detail)


def _resolved(tx: Transaction, status: Status, now: int, policy: Policy) -> Transaction:
    """Keep only what recognising duplicates needs: no body, no timers but forgetting. The
    outcome is remembered for the reserved time after it was decided: a late end event is
    told it, and a half message read again is a duplicate, however the transaction ended.
    A lost release keeps its half message (without body) for its group and topic, and waits
    the reserved time for the message to be sent again."""
    lost = status is Status.LOST
    return Transaction(
        transaction_id=tx.transaction_id,
        status=status,
        deadline=now + (policy.reserved_time if lost else policy.resolved_retention),
        producer_group=tx.producer_group,
        half=tx.half if lost else None,
        checks_sent=tx.checks_sent,
        checks_answered=tx.checks_answered,
        last_answered=tx.last_answered,
        remember_until=now + policy.reserved_time,
        seen_at=tx.seen_at,
    )


def apply(
    tx: Transaction | None, event: Event, now: int, policy: Policy
) -> tuple[Transaction | None, list[Effect]]:
    """Apply a half message or an end event to the transaction it names."""
    txid = _txid(event)
    if tx is not None and tx.transaction_id != txid:
        raise ValueError(f"event for {txid} applied to transaction {tx.transaction_id}")
    trigger = trigger_of(event)
    if trigger is Trigger.TIMEOUT:  # pragma: no cover - trigger_of never returns it
        raise ValueError("timeouts go through on_timeout")
    status = tx.status if tx is not None else None
    after, action = TRANSITIONS[(status, trigger)]

    # While the end events are held the owner is not known yet: _apply_held checks them later.
    # A remembered outcome (``txstream.state.outcomes``) keeps no owner: any end event is told it.
    if (
        isinstance(event, EndEvent)
        and tx is not None
        and tx.status is not Status.EARLY_END
        and tx.producer_group is not None
        and not event.by_admin
        and event.producer_group != tx.producer_group
    ):
        reason = (
            f"producer group {event.producer_group!r} does not own transaction {txid} "
            f"(owned by {tx.producer_group!r})"
        )
        return tx, [DeadLetter(event, reason, Code.WRONG_GROUP),
                    _note(txid, NoteKind.REJECTED, now, reason=reason)]

    new, effects = _ACTIONS[action](tx, event, now, policy)
    expected = MAY_REACH.get(action, frozenset({after}))
    if (new.status if new else None) not in expected:  # pragma: no cover - a bug, not input
        raise AssertionError(f"{action} led {status}->{new and new.status}, not {expected}")
    return new, effects


def on_timeout(tx: Transaction, now: int, policy: Policy, ends_read: int | None = None
               ) -> _Result:
    """Run the transaction's timer if it is due; otherwise change nothing. ``ends_read``: the
    end topic has been read up to this time (default ``now``: a caller that reads none)."""
    if now < tx.deadline:
        return tx, []
    _, action = TRANSITIONS[(tx.status, Trigger.TIMEOUT)]
    if action is Action.CHECK:
        if waits_for_ends(tx, now, policy, now if ends_read is None else ends_read):
            return tx, []
        return _check_or_discard(tx, now, policy)
    if action is Action.EXPIRE:
        assert tx.held
        if waits_for_ends(tx, now, policy, now if ends_read is None else ends_read):
            return tx, []
        waited = policy.orphan_end_timeout / 1000
        reason = f"no half message for transaction {tx.transaction_id} within {waited:g}s"
        effects: list[Effect] = [DeadLetter(end, reason, Code.NO_HALF_MESSAGE)
                                 for end in tx.held]
        return None, [*effects, _note(tx.transaction_id, NoteKind.EXPIRED, now, reason=reason)]
    # FORGET: the bucket keeps its outcome alone until remember_until (state.outcomes).
    return None, []


# --- actions (tx, event, now, policy) -> (new tx, effects) -----------------------------------


def _register(tx: Transaction | None, half: Event, now: int, policy: Policy) -> _Result:
    assert isinstance(half, Message)
    txid = _txid(half)
    next_check = first_check(half, now, policy)
    new = Transaction(
        transaction_id=txid,
        status=Status.PENDING,
        deadline=pending_deadline(now, next_check, policy),
        producer_group=half.producer_group,
        half=half,
        next_check=next_check,
        seen_at=now,
    )
    # What an operator searches by (txstream console): the message id, keys, tags, born time.
    return new, [_note(txid, NoteKind.HALF, now, group=half.producer_group, topic=half.topic,
                       first_check=next_check, msg_id=half.msg_id, keys=half.keys,
                       tags=half.tags, born=half.born_timestamp)]


def _hold_end(tx: Transaction | None, end: Event, now: int, policy: Policy) -> _Result:
    assert isinstance(end, EndEvent)
    new = Transaction(
        transaction_id=end.transaction_id,
        status=Status.EARLY_END,
        deadline=now + policy.orphan_end_timeout,
        producer_group=end.producer_group,
        held=(end,),
    )
    return new, [_note(end.transaction_id, NoteKind.END_BEFORE_HALF, now,
                       decision=end.decision.value)]


def _sender(end: EndEvent) -> str | None:
    """Whose decision an end event carries: the admins (``None``) or one producer group."""
    return None if end.by_admin else end.producer_group


def _merge_held(tx: Transaction | None, end: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and tx.held and isinstance(end, EndEvent)
    txid = tx.transaction_id
    own = next((h for h in tx.held if _sender(h) == _sender(end)), None)
    if own is None:  # another sender: hold it too, the half message will tell who owns it
        return replace(tx, held=(*tx.held, end)), [
            _note(txid, NoteKind.END_BEFORE_HALF, now, decision=end.decision.value)
        ]
    if end.decision.is_final and own.decision.is_final and end.decision != own.decision:
        reason = f"{end.decision.value} contradicts the earlier {own.decision.value}"
        return tx, [DeadLetter(end, reason, Code.CONTRADICTS_OUTCOME),
                    _note(txid, NoteKind.REJECTED, now, reason=reason)]
    if end.decision.is_final and not own.decision.is_final:
        # The final decision replaces UNKNOW and goes last: held ends are applied in the order
        # their decisions came, so that the first final decision wins.
        others = tuple(h for h in tx.held if h is not own)
        return replace(tx, held=(*others, end)), [
            _note(txid, NoteKind.END_BEFORE_HALF, now, decision=end.decision.value)
        ]
    return tx, [_note(txid, NoteKind.DUPLICATE, now, decision=end.decision.value)]


def _apply_held(tx: Transaction | None, half: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and tx.held and isinstance(half, Message)
    new, effects = _register(None, half, now, policy)
    # Through apply: a held end of another group is dead-lettered by the group check, and a
    # later contradicting one by the table, exactly as if it had come after the half message.
    for end in tx.held:
        assert new is not None
        new, more = apply(new, end, now, policy)
        effects += more
    return new, effects


def _release(tx: Transaction | None, end: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and tx.half is not None and isinstance(end, EndEvent)
    detail = _decision_detail(end)
    if tx.body_gone is not None:
        # Nothing to release: the dead letter says so, in the transaction's own story; the
        # half message sent again is released (RELEASE_AGAIN).
        return _resolved(tx, Status.LOST, now, policy), [
            BodyLost(tx.half, "visible", tx.body_gone),
            _note(tx.transaction_id, NoteKind.RELEASE_LOST, now, reason=tx.body_gone, **detail),
        ]
    return _resolved(tx, Status.COMMITTED, now, policy), [
        Release(tx.half, end.born_timestamp),
        _note(tx.transaction_id, NoteKind.RELEASED, now, **detail),
    ]


def _release_again(tx: Transaction | None, half: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and isinstance(half, Message)
    return _resolved(tx, Status.COMMITTED, now, policy), [
        Release(half),
        _note(tx.transaction_id, NoteKind.RELEASED, now, again=True, msg_id=half.msg_id),
    ]


def _mark_gone(tx: Transaction | None, event: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and isinstance(event, BodyGone)
    if tx.body_gone is not None:
        return tx, []
    return replace(tx, body_gone=event.reason), [
        _note(tx.transaction_id, NoteKind.BODY_GONE, now, reason=event.reason)
    ]


def _ignore(tx: Transaction | None, event: Event, now: int, policy: Policy) -> _Result:
    return tx, []


def _adopt(tx: Transaction | None, found: Event, now: int, policy: Policy) -> _Result:
    """Committed without a release of its own: the message is on its topic already. Held end
    events then meet the outcome, as they would have after the release."""
    assert isinstance(found, FoundReleased)
    txid = found.transaction_id
    # Held end events name no owner yet: like a recovered outcome, the result keeps none.
    base = tx if tx is not None and tx.status is Status.PENDING else Transaction(
        txid, Status.PENDING, now)
    new: Transaction | None = _resolved(base, Status.COMMITTED, now, policy)
    effects: list[Effect] = [_note(txid, NoteKind.RELEASED, now, found_on=found.topic)]
    for end in tx.held if tx is not None else ():
        new, more = apply(new, end, now, policy)
        effects += more
    return new, effects


def _drop(tx: Transaction | None, end: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and isinstance(end, EndEvent)
    return _resolved(tx, Status.ROLLED_BACK, now, policy), [
        _note(tx.transaction_id, NoteKind.ROLLED_BACK, now, **_decision_detail(end))
    ]


def _wait(tx: Transaction | None, end: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and isinstance(end, EndEvent)
    new = tx
    if end.from_check:
        # Only an answer to the latest check a producer can see counts, once: an answer to an
        # older one (a backlog answered after the group was away) or a repeat changes nothing.
        # An answer without a number answers the latest check.
        latest = latest_visible_check(tx, now)
        answered = end.check_times if end.check_times is not None else latest
        if latest <= answered <= tx.checks_sent and answered > tx.last_answered:
            new = _restore_interval(replace(tx, checks_answered=tx.checks_answered + 1,
                                            last_answered=answered), now, policy)
        detail = {"check": answered, **_decision_detail(end)}
        if new.next_check != tx.next_check:
            detail["next_check"] = new.next_check
    else:
        detail = _decision_detail(end)
    return new, [_note(tx.transaction_id, NoteKind.UNKNOWN, now,
                       checks_answered=new.checks_answered, **detail)]


def _restore_interval(tx: Transaction, now: int, policy: Policy) -> Transaction:
    """A producer answered: the check after the latest one made comes one interval after it
    is due (or after now), as RocketMQ's next scan would ask, not after the back-off that the
    unanswered checks before had earned."""
    assert tx.next_check is not None
    after = max(now, tx.check_due if tx.check_due is not None else now)
    next_check = min(tx.next_check, after + policy.check_interval)
    if next_check == tx.next_check:
        return tx
    return replace(tx, next_check=next_check,
                   deadline=pending_deadline(registered_at(tx, policy), next_check, policy))


def _duplicate(tx: Transaction | None, event: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and isinstance(event, Message | EndEvent)
    what = "half" if isinstance(event, Message) else event.decision.value
    return tx, [_note(tx.transaction_id, NoteKind.DUPLICATE, now, of=what, status=tx.status.value)]


def _reject(tx: Transaction | None, end: Event, now: int, policy: Policy) -> _Result:
    assert tx is not None and isinstance(end, EndEvent)
    reason = (
        f"{end.decision.value} for transaction {tx.transaction_id} which is already "
        f"{tx.status.value}"
    )
    return tx, [DeadLetter(end, reason, Code.CONTRADICTS_OUTCOME),
                _note(tx.transaction_id, NoteKind.REJECTED, now, reason=reason)]


def _check_or_discard(tx: Transaction, now: int, policy: Policy) -> _Result:
    half = tx.half
    assert half is not None and tx.next_check is not None
    due = discard_due(tx, now, policy)
    if due is not None:
        return _discard(tx, half, now, due, policy)
    number = tx.checks_sent + 1
    next_check = now + check_spacing(number - tx.last_answered, policy)
    new = replace(
        tx,
        checks_sent=number,
        next_check=next_check,
        deadline=pending_deadline(registered_at(tx, policy), next_check, policy),
        check_due=now,
    )
    late = now - tx.next_check
    return new, [
        RequestCheck(half, number, late, valid_until=next_check,
                     life=registered_at(tx, policy)),
        _note(tx.transaction_id, NoteKind.CHECK_SENT, now, check=number, late_ms=late,
              next_check=next_check),
    ]


def _discard(tx: Transaction, half: Message, now: int, due: int, policy: Policy) -> _Result:
    """Give the transaction up, with why and since when (``due``)."""
    if now >= reserved_deadline(tx, policy):
        hours = policy.reserved_time / 3_600_000
        reason = f"half message older than the reserved time of {hours:g} h"
        cause = DiscardCause.RESERVED_TIME
    elif tx.body_gone is not None:
        reason, cause = f"the body of its half message {tx.body_gone}", \
            DiscardCause.HALF_MESSAGE_LOST
    else:
        reason = (f"still unknown after {tx.checks_answered} answered checks "
                  f"(check_max={policy.check_max})")
        cause = DiscardCause.CHECK_MAX
    # A message whose body is gone cannot go to the discard topic: a dead letter says why.
    effect: Effect = (BodyLost(half, "discard", tx.body_gone) if tx.body_gone is not None
                      else Discard(half, reason, tx.checks_answered, cause))
    return _resolved(tx, Status.DISCARDED, now, policy), [
        effect,
        _note(tx.transaction_id, NoteKind.DISCARDED, now, reason=reason, cause=cause, due=due,
              checks_sent=tx.checks_sent, checks_answered=tx.checks_answered),
    ]


def _decision_detail(end: EndEvent) -> dict[str, object]:
    detail: dict[str, object] = {"decision": end.decision.value, "from_check": end.from_check}
    if end.operator:
        detail["operator"] = end.operator
    if end.remark:
        detail["remark"] = end.remark
    return detail


_ACTIONS = {
    Action.REGISTER: _register,
    Action.HOLD_END: _hold_end,
    Action.MERGE_HELD: _merge_held,
    Action.APPLY_HELD: _apply_held,
    Action.RELEASE: _release,
    Action.DROP: _drop,
    Action.WAIT: _wait,
    Action.DUPLICATE: _duplicate,
    Action.REJECT: _reject,
    Action.MARK_GONE: _mark_gone,
    Action.RELEASE_AGAIN: _release_again,
    Action.IGNORE: _ignore,
    Action.ADOPT: _adopt,
}
