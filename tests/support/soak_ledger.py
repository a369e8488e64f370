"""The soak's "database": every producer process's durable record of its local transactions.

One append-only file of JSON lines per producer slot (``ledger-<name>.jsonl`` in one folder),
each line written and fsynced before the producer goes on. A local transaction's decision is
recorded before its end event is sent, as an application commits in its database before it
tells the coordinator; a restarted producer appends to its slot's file. Every producer of the
group answers back-checks from all the files, so a check about a transaction of a producer that
was killed is answered by the other one (tests/support/soak_producer.py). The test reads the same
files to know what each transaction should have become (tests/support/soak_verdict.py).

Kinds of line (``ev``):

* ``started``: a producer process is ready (``pid``);
* ``decision``: the local transaction of ``txid`` ended with ``decision`` (COMMIT_MESSAGE or
  ROLLBACK_MESSAGE); ``first`` is what it told the producer (UNKNOW: "ask me later");
* ``sent``: ``send_message_in_transaction`` returned: the half message was acknowledged;
  ``end_ack`` says whether the end event was too;
* ``half_failed``: the half message's send raised (it may or may not be stored);
* ``hung``: the local transaction of ``txid`` hangs (``mode``: before or after its decision
  was recorded) so that the test kills the process there;
* ``idle``: the producer stopped sending (it still answers checks).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["Ledger", "append", "ledger_path", "STARTED", "DECISION", "SENT", "HALF_FAILED",
           "HUNG", "IDLE"]

STARTED, DECISION, SENT, HALF_FAILED, HUNG, IDLE = (
    "started", "decision", "sent", "half_failed", "hung", "idle")


def ledger_path(folder: Path, name: str) -> Path:
    return folder / f"ledger-{name}.jsonl"


def append(path: Path, ev: str, **fields: Any) -> None:
    """One line, on disk (fsynced) when this returns."""
    line = json.dumps({"ev": ev, "pid": os.getpid(), **fields}, separators=(",", ":")) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


class Ledger:
    """Every ledger file of a folder, read as they grow (whole lines only: a process killed
    mid-write leaves at most a partial last line, which is not an entry)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entries: list[dict[str, Any]] = []
        self.decisions: dict[str, str] = {}
        self.first: dict[tuple[int, str], dict[str, Any]] = {}  # (pid, ev) -> its first entry
        self._read_to: dict[Path, int] = {}
        self._lock = threading.Lock()

    def refresh(self) -> list[dict[str, Any]]:
        """The entries added since the last call."""
        with self._lock:
            new: list[dict[str, Any]] = []
            for path in sorted(self.folder.glob("ledger-*.jsonl")):
                start = self._read_to.get(path, 0)
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
                whole = data[: data.rfind(b"\n") + 1]
                self._read_to[path] = start + len(whole)
                for line in whole.splitlines():
                    entry = json.loads(line)
                    entry["slot"] = path.stem.removeprefix("ledger-")
                    new.append(entry)
                    self.first.setdefault((entry["pid"], entry["ev"]), entry)
                    if entry["ev"] == DECISION:
                        self.decisions[entry["txid"]] = entry["decision"]
            self.entries.extend(new)
            return new

    def decision(self, txid: str) -> str | None:
        """The recorded decision of ``txid``'s local transaction, if it ran to its end."""
        found = self.decisions.get(txid)
        if found is None:
            self.refresh()
            found = self.decisions.get(txid)
        return found
