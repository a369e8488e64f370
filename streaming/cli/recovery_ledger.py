"""The recovery demo's producers' own records: what each local transaction did, kept durably.

Every producer of the demo's group writes here (an SQLite file in the demo's folder, standing in
for the application's database) when its local transaction runs, before it answers; a
back-check is answered from here by transaction id, by whichever producer of the group is
asked. The verdict reads the same file: what the producers committed and rolled back is theirs
to say, not the coordinator's.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from txstream.client import LocalTransactionState, Message, TransactionListener

__all__ = ["Ledger", "LedgerListener", "Plan", "PLANS", "Counts"]

State = LocalTransactionState
_BY_NAME = {s.name: s for s in LocalTransactionState}


@dataclass(frozen=True)
class Plan:
    """What a local transaction does: its first answer, and how it really ended."""

    name: str
    first: LocalTransactionState
    outcome: LocalTransactionState


PLANS = {p.name: p for p in (
    Plan("commit", State.COMMIT_MESSAGE, State.COMMIT_MESSAGE),
    Plan("rollback", State.ROLLBACK_MESSAGE, State.ROLLBACK_MESSAGE),
    # UNKNOW first: the coordinator back-checks and the ledger answers.
    Plan("unknown-commit", State.UNKNOW, State.COMMIT_MESSAGE),
    Plan("unknown-rollback", State.UNKNOW, State.ROLLBACK_MESSAGE),
)}

_SCHEMA = """
create table if not exists tx (
    txid text primary key, plan text not null, outcome text not null,
    ran_at real not null,   -- when the local transaction ran (epoch seconds)
    told_at real,           -- when the coordinator was first told its outcome
    checks integer not null default 0);
create table if not exists in_doubt (txid text primary key, at real not null);
"""


@dataclass(frozen=True)
class Counts:
    sent: int = 0
    committed: int = 0
    rolled_back: int = 0
    unknown_first: int = 0
    checks_answered: int = 0
    in_doubt: int = 0


class Ledger:
    """The local transactions of every producer of the group, in one SQLite file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.executescript(_SCHEMA)

    def ran(self, txid: str, plan: Plan) -> None:
        """The local transaction of ``txid`` ran and ended as ``plan`` says (stored before the
        producer answers)."""
        with self._lock:
            self._db.execute("insert or replace into tx (txid, plan, outcome, ran_at) "
                             "values (?, ?, ?, ?)",
                             (txid, plan.name, plan.outcome.name, time.time()))

    def told(self, txid: str) -> None:
        """The coordinator was told the outcome of ``txid`` (its end event acknowledged)."""
        with self._lock:
            self._db.execute("update tx set told_at = ? where txid = ? and told_at is null",
                             (time.time(), txid))

    def in_doubt(self, txid: str) -> None:
        """A half message sent without an acknowledgement: maybe stored, never run."""
        with self._lock:
            self._db.execute("insert or ignore into in_doubt values (?, ?)", (txid, time.time()))

    def answer(self, txid: str) -> LocalTransactionState:
        """A back-check's answer, by transaction id: one whose local transaction never ran
        (its send raised) is rolled back."""
        with self._lock:
            row = self._db.execute("select outcome from tx where txid = ?", (txid,)).fetchone()
            if row is None:
                return State.ROLLBACK_MESSAGE
            self._db.execute("update tx set checks = checks + 1, told_at = coalesce(told_at, ?)"
                             " where txid = ?", (time.time(), txid))
        return _BY_NAME[row[0]]

    def counts(self) -> Counts:
        with self._lock:
            row = self._db.execute(
                "select count(*), coalesce(sum(outcome = 'COMMIT_MESSAGE'), 0), "
                "coalesce(sum(outcome = 'ROLLBACK_MESSAGE'), 0), "
                "coalesce(sum(plan like 'unknown%'), 0), coalesce(sum(checks), 0) "
                "from tx").fetchone()
            doubt = self._db.execute("select count(*) from in_doubt").fetchone()[0]
        sent, committed, rolled_back, unknown, checks = row
        return Counts(sent, committed, rolled_back, unknown, checks, doubt)

    def _ids(self, sql: str, *params: object) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute(sql, params)}

    def sent(self) -> set[str]:
        return self._ids("select txid from tx")

    def committed(self) -> set[str]:
        return self._ids("select txid from tx where outcome = 'COMMIT_MESSAGE'")

    def rolled_back(self) -> set[str]:
        return self._ids("select txid from tx where outcome = 'ROLLBACK_MESSAGE'")

    def unknown_first(self) -> set[str]:
        return self._ids("select txid from tx where plan like 'unknown%'")

    def doubtful(self) -> set[str]:
        return self._ids("select txid from in_doubt")

    def told_commits_before(self, at: float) -> set[str]:
        """Commits the coordinator was told of before ``at``: what it owes by then."""
        return self._ids("select txid from tx where outcome = 'COMMIT_MESSAGE' and "
                         "told_at is not null and told_at < ?", at)

    def commit_times(self) -> list[float]:
        """When each commit was told, for the picture."""
        with self._lock:
            return [r[0] for r in self._db.execute(
                "select told_at from tx where outcome = 'COMMIT_MESSAGE' and told_at is not null"
                " order by told_at")]

    def close(self) -> None:
        with self._lock:
            self._db.close()


class LedgerListener(TransactionListener):
    """A producer's listener: runs the planned local transaction (``arg``, a :class:`Plan`),
    records it in the ledger, then answers; a back-check is answered from the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        assert isinstance(arg, Plan)
        self.ledger.ran(msg.transaction_id or "", arg)
        return arg.first

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return self.ledger.answer(msg.transaction_id or "")
