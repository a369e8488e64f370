"""Reading the index: transactions by status, group and text, a timeline, the refused records.

Every query is one SQL statement over the indexes of :mod:`txstream.console.index` (by transaction
id, message id, business key, status and group), so an answer takes milliseconds however much
history the index holds.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from txstream.console.record_entries import Source
from txstream.console.release_lookup import ReleaseLocation
from txstream.console.transaction_rows import COLUMNS, IndexStatus, TxRow

__all__ = ["TimelineRow", "TxQuery", "Queries", "Liveness", "SORTS", "REFUSED_SOURCES"]

REFUSED_SOURCES = (Source.DISCARD, Source.DEAD_LETTER)
_MAX_LIMIT = 1000


class TimelineRow(NamedTuple):
    """One row of the ``events`` table: an entry of a transaction's timeline."""

    seq: int
    transaction_id: str | None
    at_ms: int
    kind: str
    source: str
    detail: dict[str, Any]
    origin: str


class TxQuery(NamedTuple):
    """Which transactions, in which order. ``statuses`` empty: all; ``text``: a transaction
    id, message id or business key, else a piece of an id, key, topic, group or reason."""

    statuses: tuple[str, ...] = ()
    group: str | None = None
    text: str | None = None
    sort: str = "age"
    descending: bool = True
    limit: int = 200
    offset: int = 0


_ALL = TxQuery()


class Liveness(NamedTuple):
    """What the index tells of the coordinator's life: its newest history note (it writes
    notes in the micro-batches where something happens), and the pending transactions whose
    next check is overdue (a running coordinator sends each within a trigger or two)."""

    last_note_ms: int | None
    overdue: int  # checks due before the grace began
    oldest_due_ms: int | None  # the earliest of them

# Sort key -> (SQL expression, whether "descending" means ascending in SQL). Age descending
# is the oldest first: the earliest born time.
SORTS: dict[str, tuple[str, bool]] = {
    "age": ("COALESCE(born_ms, first_seen_ms)", True),
    "born": ("born_ms", False),
    "id": ("transaction_id", False),
    "status": ("status", False),
    "group": ("producer_group", False),
    "topic": ("real_topic", False),
    "checks_sent": ("checks_sent", False),
    "checks_answered": ("checks_answered", False),
    "next_check": ("next_check_ms", False),
    "updated": ("updated_ms", False),
}

_EVENT_COLUMNS = "seq, transaction_id, at_ms, kind, source, detail, origin"


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _event(values: Sequence[Any]) -> TimelineRow:
    seq, txid, at, kind, source, detail, origin = values
    return TimelineRow(seq, txid, at, kind, source, json.loads(detail), origin)


def _text_filter(text: str) -> tuple[str, list[Any]]:
    like = _like(text)
    sql = ("(transaction_id = ? OR msg_id = ? OR transaction_id IN "
           "(SELECT transaction_id FROM message_keys WHERE key = ?) OR "
           + " OR ".join(f"{c} LIKE ? ESCAPE '\\'" for c in
                         ("transaction_id", "msg_id", "keys", "real_topic", "producer_group",
                          "reason")) + ")")
    return sql, [text, text, text, *([like] * 6)]


def _where(query: TxQuery) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if query.statuses:
        clauses.append(f"status IN ({', '.join('?' * len(query.statuses))})")
        params += query.statuses
    if query.group:
        clauses.append("producer_group = ?")
        params.append(query.group)
    if query.text:
        sql, more = _text_filter(query.text)
        clauses.append(sql)
        params += more
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


class Queries:
    """The index's read side; :class:`txstream.console.index.Index` adds the write side."""

    def __init__(self, db: sqlite3.Connection, lock: threading.RLock) -> None:
        self._db = db
        self._lock = lock

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def transactions(self, query: TxQuery = _ALL) -> tuple[list[TxRow], int]:
        """The transactions ``query`` asks for (at most its limit), and how many match."""
        where, params = _where(query)
        expression, inverted = SORTS.get(query.sort, SORTS["age"])
        direction = "DESC" if query.descending != inverted else "ASC"
        limit = max(1, min(int(query.limit), _MAX_LIMIT))
        rows = self._all(
            f"SELECT {', '.join(COLUMNS)} FROM transactions{where} "
            f"ORDER BY {expression} {direction}, transaction_id LIMIT ? OFFSET ?",
            [*params, limit, max(0, int(query.offset))])
        [(total,)] = self._all(f"SELECT COUNT(*) FROM transactions{where}", params)
        return [TxRow(*values) for values in rows], int(total)

    def transaction(self, txid: str) -> TxRow | None:
        rows = self._all(f"SELECT {', '.join(COLUMNS)} FROM transactions "
                         "WHERE transaction_id = ?", (txid,))
        return TxRow(*rows[0]) if rows else None

    def events(self, txid: str, sources: Sequence[str] = ()) -> list[TimelineRow]:
        """A transaction's timeline, oldest first (``sources``: only those)."""
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE transaction_id = ?"
        params: list[Any] = [txid]
        if sources:
            sql += f" AND source IN ({', '.join('?' * len(sources))})"
            params += sources
        return [_event(v) for v in self._all(sql + " ORDER BY at_ms, seq", params)]

    def refused(self, sources: Sequence[str] = REFUSED_SOURCES, limit: int = 200,
                offset: int = 0) -> tuple[list[TimelineRow], int]:
        """Discards and dead letters, newest first, and how many there are."""
        marks = ", ".join("?" * len(sources))
        rows = self._all(f"SELECT {_EVENT_COLUMNS} FROM events WHERE source IN ({marks}) "
                         "ORDER BY at_ms DESC, seq DESC LIMIT ? OFFSET ?",
                         [*sources, max(1, min(limit, _MAX_LIMIT)), max(0, offset)])
        [(total,)] = self._all(f"SELECT COUNT(*) FROM events WHERE source IN ({marks})",
                               list(sources))
        return [_event(v) for v in rows], int(total)

    def search(self, text: str, limit: int = 50) -> list[TxRow]:
        """Transactions whose id, message id (UNIQ_KEY) or one of whose business keys (KEYS)
        is ``text``; if none, those where it is part of one of them, a topic or a group."""
        text = text.strip()
        if not text:
            return []
        exact = self._all(
            f"SELECT {', '.join(COLUMNS)} FROM transactions WHERE transaction_id = ? "
            "OR msg_id = ? OR transaction_id IN "
            "(SELECT transaction_id FROM message_keys WHERE key = ?) "
            "ORDER BY COALESCE(born_ms, first_seen_ms) DESC LIMIT ?",
            (text, text, text, limit))
        if exact:
            return [TxRow(*values) for values in exact]
        rows, _ = self.transactions(TxQuery(text=text, sort="updated", limit=limit))
        return rows

    def counts(self) -> dict[str, int]:
        """Transactions by status, and the number of events."""
        out = {status: 0 for status in IndexStatus.ALL}
        out.update({s or "": n for s, n in self._all(
            "SELECT status, COUNT(*) FROM transactions GROUP BY status")})
        [(events,)] = self._all("SELECT COUNT(*) FROM events")
        out["events"] = int(events)
        return out

    def liveness(self, overdue_before_ms: int) -> Liveness:
        """The newest history note, and the pending checks due before ``overdue_before_ms``."""
        [(last,)] = self._all("SELECT MAX(at_ms) FROM events WHERE source = ?",
                              (Source.HISTORY,))
        [(overdue, oldest)] = self._all(
            "SELECT COUNT(*), MIN(next_check_ms) FROM transactions "
            "WHERE status = ? AND next_check_ms < ?", (IndexStatus.PENDING, overdue_before_ms))
        return Liveness(last, int(overdue), oldest)

    def releases(self, txid: str, released_ms: int) -> list[ReleaseLocation] | None:
        """Where the release of ``txid`` noted at ``released_ms`` was found; None if it was
        not looked up yet (or was for an earlier release)."""
        rows = self._all("SELECT locations FROM release_lookups WHERE transaction_id = ? AND "
                         "released_ms = ?", (txid, released_ms))
        return [ReleaseLocation(*values) for values in json.loads(rows[0][0])] if rows else None

    def groups(self) -> list[str]:
        """Every producer group the index knows, for a filter's choices."""
        return [g for (g,) in self._all(
            "SELECT DISTINCT producer_group FROM transactions "
            "WHERE producer_group IS NOT NULL ORDER BY producer_group")]
