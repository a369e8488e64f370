"""The console's index: an embedded SQLite database of what the coordinator wrote.

Tables: ``transactions`` (one row per transaction,
:class:`~txstream.console.transaction_rows.TxRow`), ``events`` (the timeline: every history
note, discard, dead letter and half message, with its time and details), ``message_keys``
(each business key of a transaction's KEYS), ``offsets`` (the next offset to read of every topic
partition) and ``meta``.

A chunk of records is applied in one SQLite transaction together with its partition's next
offset (:meth:`Index.apply`): a restart resumes exactly where the last chunk ended, and a
chunk is applied whole or not at all. Two processes may feed one file (the console and
``txstream history --index``): each chunk re-reads the stored offset under the write lock and
keeps only what lies past it.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from txstream.console.queries import Queries
from txstream.console.record_entries import Entry
from txstream.console.release_lookup import ReleaseLocation
from txstream.console.transaction_rows import COLUMNS, TxRow, fold, keys_of
from txstream.errors import ConfigError

__all__ = ["Index", "SCHEMA_VERSION", "MEMORY"]

log = logging.getLogger(__name__)

MEMORY = ":memory:"
# 2: a dead letter refused from the half topic makes its transaction REFUSED, and where
# releases lie is kept; a file of version 1 is read again from the topics to fold them so.
SCHEMA_VERSION = 2
_IN_CHUNK = 500  # values per "IN (...)": far under SQLite's limit on bound parameters

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS transactions (
    transaction_id TEXT PRIMARY KEY, status TEXT, producer_group TEXT, real_topic TEXT,
    msg_id TEXT, keys TEXT, tags TEXT, born_ms INTEGER, first_seen_ms INTEGER,
    checks_sent INTEGER NOT NULL DEFAULT 0, checks_answered INTEGER NOT NULL DEFAULT 0,
    next_check_ms INTEGER, outcome TEXT, reason TEXT, operator TEXT, updated_ms INTEGER);
CREATE INDEX IF NOT EXISTS transactions_status ON transactions (status, producer_group);
CREATE INDEX IF NOT EXISTS transactions_group ON transactions (producer_group);
CREATE INDEX IF NOT EXISTS transactions_msg_id ON transactions (msg_id);
CREATE TABLE IF NOT EXISTS message_keys (
    key TEXT NOT NULL, transaction_id TEXT NOT NULL,
    PRIMARY KEY (key, transaction_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY, transaction_id TEXT, at_ms INTEGER NOT NULL, kind TEXT NOT NULL,
    source TEXT NOT NULL, detail TEXT NOT NULL, origin TEXT NOT NULL,
    fingerprint BLOB NOT NULL UNIQUE);
CREATE INDEX IF NOT EXISTS events_transaction ON events (transaction_id, at_ms, seq);
CREATE INDEX IF NOT EXISTS events_source ON events (source, at_ms);
CREATE TABLE IF NOT EXISTS release_lookups (
    transaction_id TEXT PRIMARY KEY, released_ms INTEGER NOT NULL, locations TEXT NOT NULL);
"""
_TABLES = ("meta", "offsets", "transactions", "message_keys", "events", "release_lookups")

_UPSERT_TX = (
    f"INSERT INTO transactions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    "ON CONFLICT (transaction_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS[1:])
)


def _chunks(values: Sequence[Any], size: int = _IN_CHUNK) -> Iterator[Sequence[Any]]:
    for start in range(0, len(values), size):
        yield values[start:start + size]


class Index(Queries):
    """The index in one SQLite file (or in memory: ``":memory:"``), safe to share between
    threads (one connection, one lock)."""

    def __init__(self, path: str | Path = MEMORY) -> None:
        self.path = str(path)
        try:
            if self.path != MEMORY:
                Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(Path(self.path).expanduser() if self.path != MEMORY
                                 else MEMORY, timeout=30, isolation_level=None,
                                 check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"cannot open the index {self.path}: {exc}") from None
        super().__init__(db, threading.RLock())
        with self._lock:
            try:
                self._prepare()
            except sqlite3.DatabaseError as exc:
                db.close()
                raise ConfigError(f"{self.path} is not a txstream index: {exc}") from None

    def _prepare(self) -> None:
        db = self._db
        if self.path != MEMORY:
            # Readers do not block the writer, nor it them; NORMAL: a commit survives a crash
            # of the process (a power cut may lose the last ones: they are read again).
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            # Only a cache of the topics: rebuilt from them rather than migrated.
            log.warning("index %s has schema version %s, not %s: rebuilding it from the topics",
                        self.path, version, SCHEMA_VERSION)
            for table in _TABLES:
                db.execute(f"DROP TABLE IF EXISTS {table}")
        db.executescript(_SCHEMA)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE): what it reads stays true."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    # --- meta and offsets ------------------------------------------------------------------

    def bind(self, name: str, value: str) -> None:
        """Remember ``name`` = ``value`` (which coordinator's topics this index holds); raise
        ConfigError if the index already holds another."""
        with self._write() as db:
            row = db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
            if row is None:
                db.execute("INSERT INTO meta (name, value) VALUES (?, ?)", (name, value))
            elif row[0] != value:
                raise ConfigError(f"the index {self.path} holds {name} {row[0]}, not {value}: "
                                  "give each coordinator (topic prefix) an index of its own")

    def offsets(self) -> dict[tuple[str, int], int]:
        """{(topic, partition): the next offset to read}."""
        with self._lock:
            rows = self._db.execute("SELECT topic, partition, next_offset FROM offsets")
            return {(t, p): o for t, p, o in rows}

    def reset(self, reason: str) -> None:
        """Forget everything read (the topics were recreated, another broker): read again."""
        log.warning("index %s: %s; rebuilding it from the topics", self.path, reason)
        with self._write() as db:
            for table in _TABLES[1:]:
                db.execute(f"DELETE FROM {table}")

    # --- feeding ---------------------------------------------------------------------------

    def apply(self, topic: str, partition: int, entries: Sequence[Entry], next_offset: int
              ) -> int:
        """Add the entries read from ``topic``/``partition`` up to ``next_offset`` (exclusive),
        and store ``next_offset``, in one transaction. Entries this index already holds (read
        by another process, or a note written twice by a replayed micro-batch) are left out.
        Returns how many entries were new."""
        with self._write() as db:
            row = db.execute("SELECT next_offset FROM offsets WHERE topic = ? AND partition = ?",
                             (topic, partition)).fetchone()
            stored = row[0] if row else 0
            if next_offset <= stored:
                return 0
            fresh = self._unseen([e for e in entries if e.offset >= stored])
            self._store(db, fresh)
            db.execute("INSERT INTO offsets (topic, partition, next_offset) VALUES (?, ?, ?) "
                       "ON CONFLICT (topic, partition) DO UPDATE SET next_offset = "
                       "excluded.next_offset", (topic, partition, next_offset))
            return len(fresh)

    def _unseen(self, entries: Sequence[Entry]) -> list[Entry]:
        seen: set[bytes] = set()
        prints = list({e.fingerprint for e in entries})
        for chunk in _chunks(prints):
            marks = ", ".join("?" * len(chunk))
            seen.update(fp for (fp,) in self._db.execute(
                f"SELECT fingerprint FROM events WHERE fingerprint IN ({marks})", chunk))
        out = []
        for entry in entries:
            if entry.fingerprint not in seen:
                seen.add(entry.fingerprint)
                out.append(entry)
        return out

    def _rows(self, txids: Iterable[str]) -> dict[str, TxRow]:
        wanted = sorted(set(txids))
        rows: dict[str, TxRow] = {}
        for chunk in _chunks(wanted):
            marks = ", ".join("?" * len(chunk))
            for values in self._db.execute(
                    f"SELECT {', '.join(COLUMNS)} FROM transactions "
                    f"WHERE transaction_id IN ({marks})", chunk):
                rows[values[0]] = TxRow(*values)
        return rows

    def _store(self, db: sqlite3.Connection, entries: Sequence[Entry]) -> None:
        rows = self._rows(e.transaction_id for e in entries if e.transaction_id)
        keys_before = {txid: row.keys for txid, row in rows.items()}
        for entry in entries:
            if entry.transaction_id:
                fold(rows.setdefault(entry.transaction_id, TxRow(entry.transaction_id)), entry)
        db.executemany(
            "INSERT INTO events (transaction_id, at_ms, kind, source, detail, origin, "
            "fingerprint) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(e.transaction_id, e.at_ms, e.kind, e.source,
              json.dumps(e.detail, separators=(",", ":")), e.origin, e.fingerprint)
             for e in entries])
        db.executemany(_UPSERT_TX, [tuple(getattr(row, c) for c in COLUMNS)
                                    for row in rows.values()])
        db.executemany("INSERT OR IGNORE INTO message_keys (key, transaction_id) VALUES (?, ?)",
                       [(key, txid) for txid, row in rows.items()
                        if row.keys != keys_before.get(txid) for key in keys_of(row.keys)])

    def store_releases(self, txid: str, released_ms: int,
                       locations: Sequence[ReleaseLocation]) -> None:
        """Keep where the release of ``txid`` noted at ``released_ms`` was found."""
        text = json.dumps([list(location) for location in locations])
        with self._write() as db:
            db.execute("INSERT INTO release_lookups (transaction_id, released_ms, locations) "
                       "VALUES (?, ?, ?) ON CONFLICT (transaction_id) DO UPDATE SET "
                       "released_ms = excluded.released_ms, locations = excluded.locations",
                       (txid, released_ms, text))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

