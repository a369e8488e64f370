"""Factories for the transaction-core tests: events, and transactions in a given status."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from txstream.message import Decision, EndEvent, Message
from txstream.state.lifecycle import apply, on_timeout
from txstream.state.policy import Policy
from txstream.state.transaction import BodyGone, Status, Transaction

__all__ = [
    "T0", "P", "COMMIT", "ROLLBACK", "UNKNOWN",
    "half", "end", "answer", "kinds", "only", "registered", "reach",
]

T0 = 1_700_000_000_000  # an arbitrary wall-clock instant, in ms
P = Policy()
COMMIT, ROLLBACK, UNKNOWN = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW


def half(
    txid: str = "tx-1",
    group: str = "G",
    born: int | None = T0,
    immunity: int | None = None,
) -> Message:
    return Message(
        topic="orders",
        body=b"payload",
        tags="TagA",
        keys="K1",
        properties={"p": "v"},
        transaction_id=txid,
        msg_id=f"msg-{txid}",
        producer_group=group,
        born_timestamp=born,
        check_immunity_time_s=immunity,
    )


def end(
    decision: Decision = COMMIT,
    txid: str = "tx-1",
    group: str = "G",
    *,
    from_check: bool = False,
    check_times: int | None = None,
    operator: str | None = None,
    born: int | None = None,
) -> EndEvent:
    return EndEvent(txid, group, decision, from_check, check_times, operator, None, born)


def answer(decision: Decision, check_times: int | None, group: str = "G") -> EndEvent:
    return end(decision, group=group, from_check=True, check_times=check_times)


E = TypeVar("E")


def kinds(effects: Sequence[object]) -> list[type]:
    return [type(e) for e in effects]


def only(effects: Sequence[object], kind: type[E]) -> list[E]:
    return [e for e in effects if isinstance(e, kind)]


def registered(now: int = T0, policy: Policy = P, **kw: object) -> Transaction:
    tx, _ = apply(None, half(**kw), now, policy)  # type: ignore[arg-type]
    assert tx is not None and tx.status is Status.PENDING
    return tx




def reach(status: Status | None) -> Transaction | None:
    """A transaction in ``status``, reached through the public functions only."""
    if status is None:
        return None
    if status is Status.EARLY_END:
        tx, _ = apply(None, end(UNKNOWN), T0, P)
        return tx
    tx = registered()
    if status is Status.PENDING:
        return tx
    if status is Status.DISCARDED:
        tx, _ = on_timeout(tx, T0 + P.reserved_time, P)
        return tx
    if status is Status.LOST:
        tx, _ = apply(tx, BodyGone("tx-1", "is no longer in the topic"), T0, P)
        tx, _ = apply(tx, end(COMMIT), T0, P)
        return tx
    decision = COMMIT if status is Status.COMMITTED else ROLLBACK
    tx, _ = apply(tx, end(decision), T0, P)
    return tx

