"""Properties of the transaction core over random interleavings, applied to a ``Bucket``.

A scenario is a list of operations on a few transactions: half messages (and their duplicates),
end events from the owning group, another group or an admin, answers to the checks the
coordinator asked, and clock advances that run the due timers (as the streaming operator does:
events of a batch first, then the timers). Times are in milliseconds with tiny policies, so a
short scenario crosses every timer.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txstream.message import Decision, EndEvent, Message
from txstream.state.bucket import Bucket
from txstream.state.effects import DeadLetter, Discard, Effect, Note, Release, RequestCheck
from txstream.state.lifecycle import on_timeout
from txstream.state.policy import Policy
from txstream.state.transaction import Status, Transaction

T0 = 1_000_000
NEVER = 10**12  # a duration no scenario reaches
TXIDS = ("t0", "t1", "t2", "t3")
OWNER = {txid: f"G{i % 2}" for i, txid in enumerate(TXIDS)}
COMMIT, ROLLBACK, UNKNOWN = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW
SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

Op = tuple[Any, ...]

# --- scenarios --------------------------------------------------------------------------------

decisions = st.sampled_from([COMMIT, ROLLBACK, UNKNOWN])


def ops(txs: int) -> st.SearchStrategy[Op]:
    tx_index = st.integers(0, txs - 1)
    return st.one_of(
        st.tuples(st.just("half"), tx_index),
        st.tuples(st.just("end"), tx_index, decisions,
                  st.sampled_from(["owner", "other", "admin"]), st.booleans(),
                  st.none() | st.integers(0, 4)),
        st.tuples(st.just("answer"), tx_index, decisions),
        st.tuples(st.just("tick"), st.integers(0, 20)),
    )


@st.composite
def halves(draw: st.DrawFn) -> dict[str, Message]:
    """One half message per transaction; born before or after it arrives, maybe immune."""
    return {
        txid: Message(
            topic="orders", body=txid.encode(), transaction_id=txid, msg_id=txid,
            producer_group=OWNER[txid], born_timestamp=T0 + draw(st.integers(-40, 40)),
            check_immunity_time_s=draw(st.none() | st.just(0)),
        )
        for txid in TXIDS
    }


# Fewer transactions make a scenario dense: early ends of several senders, duplicates and
# contradictions meet on one transaction more often.
scenarios = st.tuples(
    halves(),
    st.integers(1, len(TXIDS)).flatmap(lambda n: st.lists(ops(n), min_size=8, max_size=60)),
)


def end_event(op: Op, bucket: Bucket) -> EndEvent:
    """The end event an ``end`` or ``answer`` operation stands for."""
    txid = TXIDS[op[1]]
    if op[0] == "answer":  # the owner answers the latest check it was asked, if any
        tx = bucket.get(txid)
        asked = tx.checks_sent if tx is not None and tx.checks_sent else None
        return EndEvent(txid, OWNER[txid], op[2], from_check=True, check_times=asked)
    _, _, decision, who, from_check, times = op
    group = {"owner": OWNER[txid], "other": "INTRUDER", "admin": "ops"}[who]
    return EndEvent(txid, group, decision, from_check=from_check,
                    check_times=times if from_check else None,
                    operator="root" if who == "admin" else None)


def authorized(e: EndEvent) -> bool:
    return e.by_admin or e.producer_group == OWNER[e.transaction_id]


@dataclasses.dataclass
class Step:
    op: Op
    event: Message | EndEvent | None
    now: int
    effects: list[Effect]
    bucket: Bucket
    before: dict[str, Transaction]  # the transactions as they were before the step


def play(half_of: dict[str, Message], script: list[Op], policy: Policy,
         bucket: Bucket | None = None, now: int = T0) -> Iterator[Step]:
    """Run ``script`` on ``bucket``; the bucket is live (the caller may inspect it per step)."""
    bucket = bucket if bucket is not None else Bucket()
    for op in script:
        before = dict(bucket.transactions)
        event: Message | EndEvent | None = None
        if op[0] == "tick":
            now += op[1]
            effects = bucket.fire_due(now, policy)
        else:
            event = half_of[TXIDS[op[1]]] if op[0] == "half" else end_event(op, bucket)
            effects = bucket.apply(event, now, policy)
        yield Step(op, event, now, effects, bucket, before)


def txid_of(effect: Effect) -> str:
    if isinstance(effect, Release | RequestCheck | Discard):
        return effect.message.transaction_id or ""
    if isinstance(effect, DeadLetter):
        return effect.event.transaction_id or ""
    return effect.transaction_id


def check_structure(step: Step, policy: Policy) -> None:
    """What holds after every step, whatever the policy."""
    b = step.bucket
    assert Bucket.decode(b.encode()) == b
    deadlines = [tx.deadline for tx in b]
    assert b.next_deadline() == (min(deadlines) if deadlines else None)
    if step.op[0] == "tick":  # every due timer ran
        assert all(d > step.now for d in deadlines)
    for e in step.effects:
        if isinstance(e, Discard | DeadLetter):
            assert e.reason.strip()
        if isinstance(e, Discard):
            assert e.check_times >= 0
    for tx in b:
        assert tx.status is not Status.EARLY_END or tx.held
        if tx.status is Status.PENDING:
            assert tx.half is not None and tx.half.born_timestamp is not None
            assert tx.next_check is not None and tx.deadline <= tx.next_check
            assert tx.seen_at is not None
            assert tx.deadline <= tx.seen_at + policy.reserved_time
            assert tx.checks_answered <= tx.checks_sent
    for tx in b:  # the timing rules: first check, then one every check_interval, backing off
        # while checks go unanswered
        old_tx = step.before.get(tx.transaction_id)
        if tx.status is not Status.PENDING or tx.half is None:
            continue
        if old_tx is None or old_tx.status is Status.EARLY_END:  # registered just now
            assert tx.half.born_timestamp is not None
            born = min(tx.half.born_timestamp, step.now)
            immunity = tx.half.check_immunity_time_s
            delay = policy.transaction_timeout if immunity is None else immunity * 1000
            assert tx.next_check == born + delay and tx.checks_sent == 0
        elif tx.checks_sent > old_tx.checks_sent:
            spacing, interval = tx.next_check - step.now, policy.check_interval
            if tx.checks_sent - tx.last_answered == 1:  # the check before was answered
                assert spacing == interval
            else:
                assert min(2, policy.check_backoff_max) * interval <= spacing
                assert spacing <= policy.check_backoff_max * interval
        elif tx.checks_answered > old_tx.checks_answered:  # an answer restores the interval
            assert old_tx.next_check is not None
            after = max(step.now, old_tx.check_due or step.now)
            assert tx.next_check == min(old_tx.next_check, after + policy.check_interval)
        else:
            assert tx.next_check == old_tx.next_check
    for e in step.effects:  # a discard exactly when a check is due and the rules say so
        if isinstance(e, Discard | RequestCheck):
            old = step.before[txid_of(e)]
            assert old.status is Status.PENDING and old.deadline <= step.now
            assert old.seen_at is not None  # the reserved time counts from registration
            give_up = (step.now - old.seen_at >= policy.reserved_time
                       or old.checks_answered >= policy.check_max)
            assert isinstance(e, Discard) == give_up


def dead_letter_expected(step: Step) -> bool | None:
    """Whether applying this end event must dead-letter it (``None``: not decided here)."""
    e = step.event
    if not isinstance(e, EndEvent) or e.transaction_id not in step.before:
        return None
    old = step.before[e.transaction_id]
    if old.status is Status.EARLY_END:
        return None
    if not authorized(e):
        return True
    return (old.status is Status.COMMITTED and e.decision is ROLLBACK) or (
        old.status in (Status.ROLLED_BACK, Status.DISCARDED) and e.decision is COMMIT)


# --- decisions are honoured -------------------------------------------------------------------


def honoured(half_of: dict[str, Message], script: list[Op], policy: Policy) -> None:
    """The exact outcome, for policies where nothing is forgotten and held ends wait forever."""
    assert policy.orphan_end_timeout >= NEVER and policy.resolved_retention >= NEVER
    first_final: dict[str, Decision] = {}
    half_seen: set[str] = set()
    released: Counter[str] = Counter()
    discarded: set[str] = set()
    checks: dict[str, list[int]] = {t: [] for t in TXIDS}
    bucket = Bucket()
    for step in play(half_of, script, policy, bucket):
        check_structure(step, policy)
        expected = dead_letter_expected(step)
        if expected is not None:
            assert any(isinstance(x, DeadLetter) for x in step.effects) == expected
        e = step.event
        if isinstance(e, Message):
            half_seen.add(e.transaction_id or "")
        elif isinstance(e, EndEvent) and e.decision.is_final and authorized(e):
            first_final.setdefault(e.transaction_id, e.decision)
        for effect in step.effects:
            txid = txid_of(effect)
            if isinstance(effect, Release):
                released[txid] += 1
                assert effect.message == half_of[txid]
            elif isinstance(effect, Discard):
                # Only a transaction nobody decided is given up on.
                assert txid in half_seen and txid not in first_final
                assert effect.message == half_of[txid]
                discarded.add(txid)
            elif isinstance(effect, RequestCheck):
                assert effect.message == half_of[txid] and txid not in first_final
                checks[txid].append(effect.check_times)
    for txid in TXIDS:
        assert released[txid] <= 1 and not (released[txid] and txid in discarded)
        assert checks[txid] == list(range(1, len(checks[txid]) + 1))
        decided = first_final.get(txid)
        expect_release = txid in half_seen and decided is COMMIT and txid not in discarded
        assert released[txid] == int(expect_release), (txid, decided, released)
        tx = bucket.get(txid)
        if txid in discarded:
            assert tx is not None and tx.status is Status.DISCARDED
        elif txid in half_seen and decided is not None:
            want = Status.COMMITTED if decided is COMMIT else Status.ROLLED_BACK
            assert tx is not None and tx.status is want


@SETTINGS
@given(scenarios)
def test_decisions_honoured_while_checks_run(scenario: tuple[dict[str, Message], list[Op]]
                                            ) -> None:
    # Checks go out and are answered, but nothing is ever given up on.
    policy = Policy(transaction_timeout=5, check_interval=7, check_max=10**6,
                    reserved_time=NEVER, orphan_end_timeout=NEVER, resolved_retention=NEVER)
    honoured(*scenario, policy)


@SETTINGS
@given(scenarios, st.integers(0, 3), st.sampled_from([25, 60, NEVER]))
def test_decisions_honoured_with_discards(scenario: tuple[dict[str, Message], list[Op]],
                                          check_max: int, reserved: int) -> None:
    policy = Policy(transaction_timeout=5, check_interval=7, check_max=check_max,
                    reserved_time=reserved, orphan_end_timeout=NEVER, resolved_retention=NEVER)
    honoured(*scenario, policy)


# --- every timer at once: structure, and replays --------------------------------------------

small_policies = st.builds(
    Policy,
    transaction_timeout=st.integers(1, 10),
    check_interval=st.integers(1, 10),
    check_max=st.integers(0, 3),
    reserved_time=st.integers(11, 80),
    orphan_end_timeout=st.integers(1, 30),
    resolved_retention=st.integers(1, 30),
)


def checkpoint_after(steps: list[Step]) -> tuple[int, bytes]:
    """The clock and the encoded bucket after ``steps`` (the start, if there are none)."""
    if not steps:
        return T0, Bucket().encode()
    return steps[-1].now, steps[-1].bucket.encode()


def trace(half_of: dict[str, Message], script: list[Op], policy: Policy,
          bucket: Bucket | None = None, now: int = T0) -> tuple[list[list[Effect]], Bucket]:
    steps = list(play(half_of, script, policy, bucket, now))
    final = steps[-1].bucket if steps else (bucket if bucket is not None else Bucket())
    return [s.effects for s in steps], final


@SETTINGS
@given(scenarios, small_policies)
def test_structure_holds_with_every_timer(scenario: tuple[dict[str, Message], list[Op]],
                                          policy: Policy) -> None:
    half_of, script = scenario
    released_in_life: Counter[str] = Counter()
    for step in play(half_of, script, policy):
        check_structure(step, policy)
        expected = dead_letter_expected(step)
        if expected is not None:
            assert any(isinstance(x, DeadLetter) for x in step.effects) == expected
        for effect in step.effects:
            txid = txid_of(effect)
            if isinstance(effect, Release):
                released_in_life[txid] += 1
                assert released_in_life[txid] == 1  # never twice while remembered
            if isinstance(effect, Release | Discard):
                tx = step.bucket.get(txid)
                want = Status.COMMITTED if isinstance(effect, Release) else Status.DISCARDED
                assert tx is not None and tx.status is want
        for txid in TXIDS:
            if step.bucket.get(txid) is None:  # forgotten: a new life may release again
                released_in_life[txid] = 0
        notes = [e for e in step.effects if isinstance(e, Note)]
        assert all(n.at == step.now for n in notes)


@SETTINGS
@given(scenarios, small_policies, st.data())
def test_replaying_from_a_checkpoint_emits_the_same(
    scenario: tuple[dict[str, Message], list[Op]], policy: Policy, data: st.DataObject
) -> None:
    half_of, script = scenario
    split = data.draw(st.integers(0, len(script)))
    head = list(play(half_of, script[:split], policy))
    now, checkpoint = checkpoint_after(head)
    first_effects, first_final = trace(half_of, script[split:], policy,
                                       Bucket.decode(checkpoint), now)
    # A replayed micro-batch restarts from the checkpointed state with the same clock.
    again_effects, again_final = trace(half_of, script[split:], policy,
                                       Bucket.decode(checkpoint), now)
    assert first_effects == again_effects
    assert first_final == again_final
    # And the whole run, from scratch, agrees with the split one.
    whole_effects, whole_final = trace(half_of, script, policy)
    assert whole_effects == [s.effects for s in head] + first_effects
    assert whole_final == first_final


@SETTINGS
@given(scenarios, small_policies, st.data())
def test_timers_run_ahead_do_what_they_would_do_at_their_deadlines(
    scenario: tuple[dict[str, Message], list[Op]], policy: Policy, data: st.DataObject
) -> None:
    # Policy.timer_lead: a batch runs the checks due within the lead, each as of its deadline,
    # exactly as it would have run at that deadline. A timer that decides an outcome (a
    # discard, an expiry) never runs ahead: an end event before its deadline must still win.
    half_of, script = scenario
    now, blob = checkpoint_after(list(play(half_of, script, policy)))
    lead = data.draw(st.integers(0, 100))
    ahead = Bucket.decode(blob)
    fired = ahead.run_timers(now, lead, policy)
    assert all(at >= now for at, _ in fired)
    assert [at for at, _ in fired] == sorted(at for at, _ in fired)
    for at, effects in fired:
        assert all(n.at == at for n in effects if isinstance(n, Note))
        if at > now:
            assert {type(e) for e in effects} <= {RequestCheck, Note}, effects
    # Each timer did what that transaction's timer does at that time, on its own.
    state = Bucket.decode(blob).transactions
    for at, effects in fired:
        txid = next(n.transaction_id for n in effects if isinstance(n, Note))
        new, expected = on_timeout(state[txid], at, policy)
        assert expected == effects
        if new is None:
            del state[txid]
        else:
            state[txid] = new
    wakeup = ahead.next_wakeup(lead, policy)
    assert wakeup is None or wakeup > now  # nothing left that this batch should have run
