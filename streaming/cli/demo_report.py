"""What the demo shows: the example's transactions followed through the history topic.

The history topic says, per transaction, what the coordinator did (half registered, checks
sent, released, rolled back, discarded), so the same view serves the all-in-one demo and the
demo producer of ``docker compose`` whose coordinator runs in another container.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from txstream.errors import MalformedRecord
from txstream.kafka import KafkaSettings, TopicReader
from txstream.outputs import decode_history
from txstream.state.effects import NoteKind
from txstream.streaming.cli.demo_clients import SeedListener
from txstream.topics import Topics

__all__ = ["Outcomes", "HistoryWatch", "format_progress", "format_summary",
           "OUTCOMES"]

# history event -> summary label, in the order the summary lists them
OUTCOMES = {NoteKind.RELEASED: "released", NoteKind.ROLLED_BACK: "rolled back",
            NoteKind.DISCARDED: "discarded"}


@dataclass
class Outcomes:
    """Per transaction id: the checks the coordinator sent and how it ended (if it did)."""

    checks: dict[str, int] = field(default_factory=dict)
    final: dict[str, str] = field(default_factory=dict)
    registered: set[str] = field(default_factory=set)

    def add(self, txid: str, note: dict[str, object]) -> None:
        event = str(note.get("event"))
        if event == NoteKind.HALF:
            self.registered.add(txid)
        elif event == NoteKind.CHECK_SENT:
            self.checks[txid] = max(self.checks.get(txid, 0), int(str(note.get("check") or 0)))
        elif event in OUTCOMES:
            self.final.setdefault(txid, event)

    def count(self, event: str, txids: Iterable[str]) -> int:
        return sum(1 for t in txids if self.final.get(t) == event)

    def checks_sent(self, txids: Iterable[str]) -> int:
        return sum(self.checks.get(t, 0) for t in txids)


class HistoryWatch:
    """Reads the coordinator's history topic as it grows (call :meth:`poll` from one thread)."""

    def __init__(self, settings: KafkaSettings, topics: Topics) -> None:
        self.outcomes = Outcomes()
        self._topic = topics.history
        self._reader = TopicReader(settings, [topics.history])

    def poll(self) -> Outcomes:
        for rec in self._reader.read_new(timeout_s=5.0):
            try:
                notes = decode_history(rec.value, rec.key)
            except MalformedRecord:
                continue
            for note in notes:
                self.outcomes.add(str(note.get("transaction_id")), note)
        return self.outcomes

    def close(self) -> None:
        self._reader.close()


def format_progress(listener: SeedListener, outcomes: Outcomes, received: int) -> str:
    txids = list(listener.bodies)
    done = sum(1 for t in txids if t in outcomes.final)
    return (
        f"half messages sent {len(txids)} | local transactions {listener.executed} | checks "
        f"asked {outcomes.checks_sent(txids)}, answered {listener.checks_answered} | released "
        f"{outcomes.count('released', txids)} | rolled back "
        f"{outcomes.count('rolled_back', txids)} | discarded "
        f"{outcomes.count('discarded', txids)} | pending {len(txids) - done} | consumer "
        f"received {received}"
    )


def _bodies(texts: list[str]) -> str:
    """'Hello RocketMQ 1, 4, 7': the shared prefix once, then what differs."""
    if not texts:
        return "-"
    words = [t.rsplit(" ", 1) for t in texts]
    if all(len(w) == 2 for w in words) and len({w[0] for w in words}) == 1:
        return f"{words[0][0]} " + ", ".join(w[1] for w in words)
    return ", ".join(texts)


def _order(text: str) -> tuple[int, str]:
    tail = text.rsplit(" ", 1)[-1]
    return (int(tail) if tail.isdigit() else 1 << 30, text)


def format_summary(listener: SeedListener, outcomes: Outcomes, received: list[str] | None,
                   seconds: float) -> str:
    """The table the demo ends with; ``received`` is None when no consumer ran here."""
    bodies = listener.bodies
    rows: list[tuple[str, int, str]] = []
    for event, label in OUTCOMES.items():
        texts = sorted((b for t, b in bodies.items() if outcomes.final.get(t) == event),
                       key=_order)
        rows.append((label, len(texts), _bodies(texts)))
    pending = sorted((b for t, b in bodies.items() if t not in outcomes.final), key=_order)
    rows.append(("still pending", len(pending), _bodies(pending)))
    if received is not None:
        rows.append(("consumer received", len(received),
                     _bodies(sorted(received, key=_order))))
    width = max(len(r[0]) for r in rows)
    lines = [f"summary after {seconds:.1f}s ({len(bodies)} transactions, "
             f"{outcomes.checks_sent(bodies)} back-checks asked, {listener.checks_answered} "
             "answered)",
             f"  {'outcome'.ljust(width)}  count  messages"]
    lines += [f"  {label.ljust(width)}  {count:>5}  {text}" for label, count, text in rows]
    return "\n".join(lines)
