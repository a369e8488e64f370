"""A new checkpoint over topics a coordinator used before: what it decided, read back first.

A checkpoint is where the coordinator remembers what it decided. A new one (a lost or deleted
checkpoint directory, a new deployment over the same topics) or a partition read again from
its start (``fail_on_data_loss=false``) makes the source read half messages and end events it
has read before: without what was decided about them, a committed message would be released
a second time. So before any half or end record is read again, the source reads the history
topic (the coordinator's own journal of every decision) up to where it ended when the reset
began, and hands each outcome to the transaction's state key as an OUTCOME row: a half message
or end event read again then meets its outcome, as a duplicate (docs/decisions/0023-recovery.md).
A transaction the history registered without an outcome is handed as IN_DOUBT: a half message
of it, even one sent again after the reset began, is first looked for on its real topic.

The recovery also remembers where the half topic ended when it began (``again``): a half
message below that end may have been read by the coordinator before, whose last batch may have
died after releasing it and before noting so. The source marks such a row (``HALF_AGAIN``) and
the operator looks for the release on its real topic (docs/decisions/0029-releases-found.md).

The stream offset carries the recovery: ``"_journal": {"at": {partition: next offset},
"to": {partition: end}, "half": {partition: end}}``; it is done when ``at`` reaches ``to``.
Pure, but for the records it is handed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from txstream.errors import MalformedRecord
from txstream.kafka import ConsumerRecord
from txstream.outputs import decode_history
from txstream.schema import EventRow
from txstream.sources.event_rows import outcome_row
from txstream.state.effects import NoteKind
from txstream.state.keys import KeyLayout
from txstream.state.outcomes import IN_DOUBT
from txstream.state.transaction import Status

__all__ = ["JOURNAL", "OUTCOME_OF", "Journal", "outcome_rows"]

# The stream offset's entry for a recovery from the history topic.
JOURNAL = "_journal"

# The history events that end a transaction, and the outcome each one leaves. A lost release
# stays LOST: its commit read again is a duplicate, its half message sent again is released.
# Keyed by NoteKind, a StrEnum: looked up by the event's text as read.
OUTCOME_OF: dict[str, str] = {
    NoteKind.RELEASED: Status.COMMITTED.value,
    NoteKind.ROLLED_BACK: Status.ROLLED_BACK.value,
    NoteKind.DISCARDED: Status.DISCARDED.value,
    NoteKind.RELEASE_LOST: Status.LOST.value,
    # Refused by the broker: decided, waiting on the dead-letter topic to be released
    # again (txstream dead-letters release), never again from the half message.
    NoteKind.RELEASE_REFUSED: Status.COMMITTED.value}


class Journal:
    """The recovery entry of a stream offset: how far the history topic has been read back,
    up to where it must be before half and end records are read again, and where the half
    topic's partitions ended when it began (``again``)."""

    def __init__(self, at: Mapping[int, int], to: Mapping[int, int],
                 again: Mapping[int, int] | None = None) -> None:
        self.at = {p: int(o) for p, o in at.items()}
        self.to = {p: int(o) for p, o in to.items()}
        self.again = {p: int(o) for p, o in (again or {}).items()}

    @classmethod
    def starting(cls, ends: Mapping[int, int], half_ends: Mapping[int, int]) -> Journal | None:
        """A recovery of the history topic as it ends now, before the half topic's partitions
        ``half_ends`` are read again below those ends (None: the history holds nothing)."""
        to = {p: end for p, end in ends.items() if end > 0}
        return cls({p: 0 for p in to}, to, half_ends) if to else None

    @classmethod
    def of(cls, entry: Any) -> Journal | None:
        if not entry:
            return None
        return cls({int(p): o for p, o in entry["at"].items()},
                   {int(p): o for p, o in entry["to"].items()},
                   {int(p): o for p, o in entry.get("half", {}).items()})

    def entry(self) -> dict[str, dict[str, int]]:
        out = {"at": {str(p): self.at[p] for p in sorted(self.at)},
               "to": {str(p): self.to[p] for p in sorted(self.to)}}
        if self.again:
            out["half"] = {str(p): self.again[p] for p in sorted(self.again)}
        return out

    @property
    def done(self) -> bool:
        return all(self.at.get(p, 0) >= end for p, end in self.to.items())

    def step(self, budget: int | None) -> Journal:
        """The next part to read: everything left, or ``budget`` records spread over the
        partitions left (at least one each)."""
        left = {p: end - self.at.get(p, 0) for p, end in self.to.items()
                if self.at.get(p, 0) < end}
        at = dict(self.at)
        share = None if budget is None else max(1, budget // max(1, len(left)))
        for p, n in left.items():
            at[p] = at.get(p, 0) + (n if share is None else min(n, share))
        return Journal(at, self.to, self.again)

    def ranges(self, before: Journal | None) -> Iterator[tuple[int, int, int]]:
        """(partition, start, end) of what this entry read since ``before``."""
        for p, end in sorted(self.at.items()):
            start = before.at.get(p, 0) if before is not None else 0
            if end > start:
                yield p, start, end


def outcome_rows(records: Iterable[ConsumerRecord], layout: KeyLayout) -> Iterator[EventRow]:
    """The outcomes the history records tell, one row per transaction and record; then
    IN_DOUBT for each transaction registered (its half note) with no outcome among these
    records: its release may have been written by a batch that died before noting it. A
    later part of the history may still tell its outcome, which replaces IN_DOUBT. A record
    that is not history (another writer's) tells nothing."""
    registered: dict[str, tuple[int, int]] = {}
    ended: set[str] = set()
    for rec in records:
        try:
            notes = decode_history(rec.value, rec.key)
        except MalformedRecord:
            continue
        for note in notes:
            event, txid = str(note.get("event")), note.get("transaction_id")
            if not isinstance(txid, str) or not txid:
                continue
            if event == NoteKind.HALF:
                registered.setdefault(txid, (rec.partition, rec.offset))
            elif (status := OUTCOME_OF.get(event)) is not None:
                ended.add(txid)
                yield outcome_row(txid, status, rec.partition, rec.offset, layout)
    for txid, (partition, offset) in registered.items():
        if txid not in ended:
            yield outcome_row(txid, IN_DOUBT, partition, offset, layout)
