"""The promise, checked against the ground truth after every step and at the end.

1. A committed transaction's message is on its real topic, and is delivered once through the
   consumer (at most once at any time; once by the end, unless its body was gone or it was
   discarded before its commit was written).
2. A rolled-back one never is: nothing is released without a commit its producer wrote.
3. Every transaction ends (by the end, once faults stop and its group answers), within the
   reserved time plus one interval of when it was registered, unless the coordinator or its
   group was away meanwhile.
4. A discard happens only after ``check_max`` answered checks or past the reserved time on the
   coordinator's clock, and never for a transaction whose commit was written before the
   discard was due.
5. The history, the metrics and the console say "released" only for a message on its real
   topic.
6. A dead letter carries the refused record as the wire format promises (byte for byte where
   it came from an input topic; a lost body's keyed by its transaction id).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from tests.sim.actors import Ledger
from txstream.console.record_entries import Entry, Source, entries_of
from txstream.console.transaction_rows import TxRow, fold
from txstream.headers import header_dict
from txstream.message import Decision
from txstream.outputs import decode_history
from txstream.refusals import Code
from txstream.schema import Kind
from txstream.state.transaction import Status
from txstream.streaming.engine.key_metrics import Counted, decode_summary
from txstream.wire import H

__all__ = ["Violation", "is_release", "Observed", "Observer", "observe", "check_step", "check_end",
           "check_metrics", "check_dead_letters", "check_requests_answered", "lost_copy_owed",
           "unknowable"]

COMMIT = Decision.COMMIT_MESSAGE
_ENDINGS = ("released", "rolled_back", "discarded", "release_lost")


class Violation(AssertionError):
    """An invariant that does not hold; its text names the invariant and the transaction."""


@dataclass
class Observed:
    """What the coordinator wrote, read back from its topics."""

    changed: set[str] = field(default_factory=set)  # transactions with news since last asked
    released: dict[str, list[Any]] = field(default_factory=dict)  # txid -> real records
    notes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # txid -> history
    discards: dict[str, list[Any]] = field(default_factory=dict)
    dead_letters: list[Any] = field(default_factory=list)
    entries: dict[str, list[Entry]] = field(default_factory=dict)

    def ended(self, txid: str) -> dict[str, Any] | None:
        """The note that ended it (the last such)."""
        ending = [n for n in self.notes.get(txid, ()) if n.get("event") in _ENDINGS]
        return ending[-1] if ending else None

    def seen_at(self, txid: str) -> int | None:
        halves = [int(n["at"]) for n in self.notes.get(txid, ()) if n.get("event") == "half"]
        return min(halves) if halves else None



def is_release(headers: Any) -> bool:
    """A release carries its transaction's id, or at least the coordinator's record id:
    another writer's records on a real topic carry neither."""
    return any(name in (H.TRANSACTION_ID, H.UNIQ_KEY, H.RECORD_ID) for name, _ in headers)

class Observer:
    """Reads what the coordinator wrote as it comes (each record once)."""

    def __init__(self, world: Any, real_topics: Iterable[str]) -> None:
        self.world = world
        self.real_topics = list(real_topics)
        self.seen = Observed()
        self._positions: dict[tuple[str, int], int] = {}

    def update(self) -> Observed:
        seen, topics = self.seen, self.world.topics
        for topic in self.real_topics:
            for rec in self._new(topic):
                h = header_dict(rec.headers)
                txid = h.get(H.TRANSACTION_ID) or h.get(H.UNIQ_KEY)
                if not is_release(rec.headers):
                    continue  # another writer's record (the fault "foreign")
                seen.released.setdefault(txid or "", []).append(rec)
                seen.changed.add(txid or "")
        for rec in self._new(topics.history):
            for note in decode_history(rec.value, rec.key):
                seen.notes.setdefault(str(note["transaction_id"]), []).append(note)
                seen.changed.add(str(note["transaction_id"]))
            _index(seen, Source.HISTORY, rec)
        for rec in self._new(topics.discard):
            seen.discards.setdefault(bytes(rec.key).decode(), []).append(rec)
            _index(seen, Source.DISCARD, rec)
        for rec in self._new(topics.dead_letter):
            seen.dead_letters.append(rec)
            _index(seen, Source.DEAD_LETTER, rec)
        return seen

    def _new(self, topic: str) -> list[Any]:
        return [r for records in self.world.read_new(topic, self._positions).values()
                for r in records]


def observe(world: Any, real_topics: Iterable[str]) -> Observed:
    """Everything written so far, read at once."""
    return Observer(world, real_topics).update()


def _index(seen: Observed, source: str, rec: Any) -> None:
    for entry in entries_of(source, rec):
        if entry.transaction_id:
            seen.entries.setdefault(entry.transaction_id, []).append(entry)
            seen.changed.add(entry.transaction_id)


def _fail(invariant: int, txid: str, what: str) -> None:
    raise Violation(f"invariant {invariant} ({txid}): {what}")


def check_step(ledger: Ledger, seen: Observed, settled: bool, policy: Any,
               fresh_at: list[float] | None = None, everything: bool = False) -> None:
    """What must hold at any moment; ``settled``: no batch is half written (the last one
    committed), so what a batch writes together is all there. Only the transactions with
    news since the last check, unless ``everything``."""
    changed = set(seen.notes) | set(seen.released) if everything else seen.changed
    seen.changed = set()
    for txid in changed & set(seen.released):
        records = seen.released[txid]
        truth = ledger.tx.get(txid)
        if truth is None or not any(d is COMMIT for _, d, _ in truth.ends):
            _fail(2, txid, "released without a commit written by its producer")
        assert truth is not None
        notes = seen.notes.get(txid, [])
        lives = _id_lives(notes, policy, fresh_at or [], truth.halves)
        noted = sum(1 for life in lives if any(n["event"] == "released" for n in life))
        unnoted = _unnoted_lives(records, notes, policy, fresh_at or [], truth.halves)
        if len(records) > max(1, noted + unnoted):
            _fail(1, txid, f"released {len(records)} times")
    for key, txids in ledger.by_key.items():
        if sum(1 for t in txids if t in seen.released) > 1:
            _fail(1, key, f"one business operation released twice: {txids}")
    for txid in changed & set(seen.notes):
        notes = seen.notes[txid]
        for life in _lives(notes, policy, fresh_at or []):
            for note in life:
                if note.get("event") == "discarded":
                    _check_discard(ledger, life, txid, note, policy)
        _check_answers_counted(txid, notes)
        _check_ends_once(txid, notes, policy, fresh_at or [])
    if settled:
        for txid in changed & set(seen.notes):
            notes = seen.notes[txid]
            if any(n.get("event") == "released" for n in notes) and txid not in seen.released:
                _fail(5, txid, "the history says released; it is not on its real topic")
            found = {n["found_on"] for n in notes if n.get("found_on")}
            if found - {rec.topic for rec in seen.released.get(txid, ())}:
                _fail(5, txid, f"the history says found released on {sorted(found)}; it is not")
            row = TxRow(txid)
            for entry in sorted(seen.entries.get(txid, ()), key=lambda e: (e.at_ms, e.offset)):
                fold(row, entry)
            if row.status == Status.COMMITTED and txid not in seen.released:
                _fail(5, txid, "the console says COMMITTED; nothing is on its real topic")


def _check_discard(ledger: Ledger, life: list[dict[str, Any]], txid: str,
                   note: dict[str, Any], policy: Any) -> None:
    """``life``: the notes of the transaction's life the discard ended."""
    truth = ledger.tx[txid]
    due = int(note.get("due", note["at"]))
    halves = [int(n["at"]) for n in life if n.get("event") == "half"]
    seen_at = min(halves) if halves else None
    if truth.committed_before(due, since=-1 if life is None else _life_start(life)):
        _fail(4, txid, f"discarded (due {due}) although its commit was written before")
    cause = note.get("cause")
    if cause == "reserved_time":
        if seen_at is None or due < seen_at + policy.reserved_time:
            _fail(4, txid, f"discarded for age, due {due}, registered at {seen_at}")
    elif cause == "check_max" and int(note.get("checks_answered", -1)) < policy.check_max:
        _fail(4, txid, f"discarded after {note.get('checks_answered')} answered checks")


def _check_answers_counted(txid: str, notes: list[dict[str, Any]]) -> None:
    """An answer to check n read before check n+1 is due counts (the latest request a producer
    can see stays valid until the next is due), once; no other answer counts."""
    counted, answered, due_after = 0, 0, {}  # due_after[n]: when check n+1 is due
    for note in notes:
        event = note.get("event")
        if event == "half":  # registered (again, by a new checkpoint): counting starts over
            counted, answered, due_after = 0, 0, {}
        elif event == "check_sent":
            due_after[int(note["check"])] = int(note["next_check"])
        elif event == "unknown" and note.get("from_check") and "check" in note:
            n, at = int(note["check"]), int(note["at"])
            valid = n in due_after and n > counted and at < due_after[n]
            now_answered = int(note["checks_answered"])
            if valid and now_answered != answered + 1:
                _fail(4, txid, f"an answer to check {n} read at {at}, before the next was due "
                               f"({due_after[n]}), was not counted")
            if not valid and now_answered != answered and n not in due_after:
                _fail(4, txid, f"an answer to check {n}, never sent, was counted")
            if now_answered != answered:
                counted, answered = n, now_answered
            if "next_check" in note and due_after:  # the answer brought the next check closer
                due_after[max(due_after)] = int(note["next_check"])


def _life_start(life: list[dict[str, Any]]) -> int:
    return int(life[0]["at"]) if life else -1


def _lives(notes: list[dict[str, Any]], policy: Any, fresh_at: list[float]
           ) -> list[list[dict[str, Any]]]:
    """The notes of a transaction id, cut where it starts a new life: registered again once
    its outcome may be forgotten (the reserved time after it ended: the same id sent again
    is a new transaction) or after a new checkpoint lost the state."""
    lives: list[list[dict[str, Any]]] = [[]]
    ended_at: int | None = None
    for note in notes:
        at = int(note["at"])
        if note.get("event") == "half" and ended_at is not None and (
                at >= ended_at + policy.reserved_time or any(ended_at < t <= at
                                                             for t in fresh_at)):
            lives.append([])
            ended_at = None
        lives[-1].append(note)
        if note.get("event") in _ENDINGS:
            ended_at = at
    return lives


def _id_lives(notes: list[dict[str, Any]], policy: Any, fresh_at: list[float],
              copies: list[tuple[int, int, int]]) -> list[list[dict[str, Any]]]:
    """The notes of a transaction id cut where the id starts a new transaction: registered
    again once its outcome may be forgotten, from a copy of its half message written since.
    A new checkpoint is no new life: its recovery remembers every outcome the history holds,
    for the reserved time from then, and a copy that lay below its boundary must meet that
    outcome (decisions 0023, 0029). ``copies``: (written at, partition, offset) of every half
    record of the id."""
    lives: list[list[dict[str, Any]]] = [[]]
    ended_at: int | None = None
    for note in notes:
        at = int(note["at"])
        if note.get("event") == "half" and ended_at is not None and _registered_again(
                at, ended_at, policy, fresh_at, copies):
            lives.append([])
            ended_at = None
        lives[-1].append(note)
        if note.get("event") in _ENDINGS:
            ended_at = at
    return lives


def _registered_again(at: int, ended_at: int, policy: Any, fresh_at: list[float],
                      copies: list[tuple[int, int, int]]) -> bool:
    """Whether an id whose outcome came at ``ended_at`` starts a new transaction at ``at``:
    its outcome forgotten by then (the reserved time after it ended, or after the last
    recovery since, which remembered it again) and a copy of its half message written after
    the last of those boundaries."""
    recovered = [t for t in fresh_at if t <= at]
    remembered = max([ended_at, *(t for t in recovered if t > ended_at)])
    boundary = max([ended_at, *recovered])
    return at >= remembered + policy.reserved_time and any(
        boundary < written <= at for written, _, _ in copies)


def _unnoted_lives(records: list[Any], notes: list[dict[str, Any]], policy: Any,
                   fresh_at: list[float], copies: list[tuple[int, int, int]]) -> int:
    """Releases of a new life whose notes died with their batch (notes follow releases): the
    batch crashed after writing the release and a new checkpoint replaced it before its
    replay. Such a release counts as a life of its own where a half note at its time would
    have started one (:func:`_id_lives`)."""
    noted = {int(n["at"]) for n in notes if n.get("event") == "released"}
    ends = [int(n["at"]) for n in notes if n.get("event") in _ENDINGS]
    lives = 0
    for rec in records:
        at = int(rec.timestamp)
        before = [t for t in ends if t < at]
        if at in noted or not before:
            continue
        if _registered_again(at, max(before), policy, fresh_at, copies):
            lives += 1
    return lives


def _check_ends_once(txid: str, notes: list[dict[str, Any]], policy: Any,
                     fresh_at: list[float]) -> None:
    """A transaction ends once in a life (a lost release may be released again, once; a
    release found on its topic, ``found_on``, restates a release), and while its outcome is
    remembered an end event for it is told the outcome, not "no half message"."""
    for life in _lives(notes, policy, fresh_at):
        endings = [n for n in life if n.get("event") in _ENDINGS]
        for first, then in pairwise(endings):
            again = (first["event"], then["event"]) == ("release_lost", "released")
            restated = first["event"] == "released" and bool(then.get("found_on"))
            reset = any(int(first["at"]) < t <= int(then["at"]) for t in fresh_at)
            if not again and not restated and not reset:
                _fail(3, txid, f"ended twice: {first['event']} at {first['at']}, then "
                               f"{then['event']} at {then['at']}")
    endings = [n for n in notes if n.get("event") in _ENDINGS]
    for note in notes:
        if note.get("event") != "expired":
            continue
        at = int(note["at"])
        for end in endings:
            if int(end["at"]) <= at < int(end["at"]) + policy.reserved_time:
                _fail(6, txid, f"an end event was dead-lettered as having no half message "
                               f"at {at}, while its outcome ({end['event']}) is remembered")


def check_requests_answered(producers: Any, seen: Observed, policy: Any,
                            fresh_at: list[float]) -> None:
    """A check request its group read, the latest of its pending transaction, is answered:
    what the client skips is only what the coordinator would not count, in every life of the
    transaction (a new checkpoint, the id sent again: checks numbered from 1 again)."""
    for group, txid, n, at in producers.skipped:
        if (group, txid, n) in producers.answered:
            continue  # a copy read again of one answered already
        if producers.requested.get((group, txid), (0, 0)) > n:
            continue  # a later request of the same transaction came: that one counts
        ended = seen.ended(txid)
        if ended is not None and int(ended["at"]) <= at:
            continue
        _fail(3, txid, f"check {n}, the latest of a pending transaction, read by {group} at "
                       f"{at}, was not answered")


def check_metrics(seen: Observed, summaries: list[bytes], uncounted: int = 0) -> None:
    """The released counter (``commits``) counts what reached a real topic, once: all of it
    but the releases of a batch that died and was never replayed, its checkpoint replaced
    (``uncounted``): the counts are the committed batches'."""
    commits = 0
    for blob in summaries:
        doc = decode_summary(blob.decode("utf-8"))
        for name, *_, n in doc.get("c", ()):
            if name == Counted.COMMITS:
                commits += int(n)
    records = sum(map(len, seen.released.values()))
    if commits != records - uncounted:
        lost = f" ({uncounted} written by batches never committed)" if uncounted else ""
        _fail(5, "-", f"the metrics count {commits} released, the real topics hold "
                      f"{records}{lost}")


def check_dead_letters(world: Any, seen: Observed) -> None:
    for rec in seen.dead_letters:
        h = header_dict(rec.headers)
        code, reason = h.get(H.DLQ_CODE), h.get(H.DLQ_REASON)
        if not code or not reason:
            _fail(6, "-", f"dead letter {rec.partition}@{rec.offset} without code or reason")
        topic = h.get(H.DLQ_ORIGIN_TOPIC)
        partition = int(h.get(H.DLQ_ORIGIN_PARTITION) or -1)
        offset = int(h.get(H.DLQ_ORIGIN_OFFSET) or -1)
        if code == Code.HALF_MESSAGE_LOST:
            txid = (rec.key or b"").decode("utf-8", "replace")
            if h.get(H.UNIQ_KEY) != txid:
                _fail(6, txid, "a lost body's dead letter is not keyed by its transaction id")
            if world.record_at(topic, partition, offset) is not None and not world.recreated:
                _fail(1, txid, "dead-lettered HALF_MESSAGE_LOST while its body is there")
            continue
        if offset < 0 or topic not in (world.topics.half, world.topics.end):
            continue
        original = world.record_at(topic, partition, offset)
        if original is None or (world.recreated and topic == world.topics.half):
            continue  # gone since (retention, a re-created topic: another record there now)
        kept = [(k, v) for k, v in rec.headers if not k.startswith("DLQ_")
                and k != H.RECORD_ID]
        if (rec.key, rec.value, kept) != (original.key, original.value,
                                         [(k, v) for k, v in original.headers]):
            _fail(6, h.get(H.TRANSACTION_ID) or "-",
                  f"dead letter of {topic}/{partition}@{offset} is not the record as read")


def unknowable(world: Any, truth: Any, seen: Observed, fresh_at: list[float]) -> bool:
    """Whether nothing can know of the transaction any more: its half message is gone from
    the half topic, and no state holds it (never registered, or its state lost with a new
    checkpoint)."""
    return _half_gone(world, truth) and (
        seen.seen_at(truth.txid) is None or any(t >= truth.halves[0][0] for t in fresh_at))


def _half_gone(world: Any, truth: Any) -> bool:
    """Whether none of the transaction's half records is in the half topic any more."""
    return not any(_holds(world.record_at(world.topics.half, partition, offset), truth.txid)
                   for _, partition, offset in truth.halves)


def _holds(rec: Any, txid: str) -> bool:
    """Whether ``rec`` (None: no record there) is a half record of ``txid``."""
    return rec is not None and rec.key == txid.encode()


def check_end(world: Any, ledger: Ledger, seen: Observed, delivered: dict[str, int],
              policy: Any, quiet_since: int, fresh_at: list[float]) -> None:
    """After the faults stopped and everything settled. ``fresh_at``: when a new checkpoint
    replaced the state."""
    check_step(ledger, seen, True, policy, fresh_at, everything=True)
    check_dead_letters(world, seen)
    for txid, truth in ledger.tx.items():
        if not truth.halves:
            continue  # never stored: nothing to end
        # The same id registered again once its outcome may be forgotten is a new transaction:
        # its first life is judged.
        first = _lives(seen.notes.get(txid, []), policy, fresh_at)[0]
        endings = [n for n in first if n.get("event") in _ENDINGS]
        ended = endings[-1] if endings else None
        if ended is None and unknowable(world, truth, seen, fresh_at):
            continue
        if ended is None:
            _fail(3, txid, "never ended (no release, rollback, discard or lost release)")
        assert ended is not None
        event = ended["event"]
        if truth.decision is COMMIT and event != "released":
            gone = event == "release_lost" or (event == "discarded"
                                               and ended.get("cause") == "half_message_lost")
            if not gone and not (event == "discarded"
                                 and not truth.committed_before(int(ended.get("due", 0)))):
                _fail(1, txid, f"committed, but ended {event}: {ended.get('reason')}")
        if event == "released" and delivered.get(txid) != 1:
            _fail(1, txid, f"released, delivered {delivered.get(txid, 0)} times")
        _check_timely(world, truth, seen, ended, policy, quiet_since)
        _check_lost_sent_again(world, truth, seen.notes.get(txid, []), policy)


def _check_lost_sent_again(world: Any, truth: Any, notes: list[dict[str, Any]],
                           policy: Any) -> None:
    """A lost release's half message sent again while the loss is remembered (the reserved
    time) is released, whatever checkpoint reads it (docs/semantics.md); unless that copy is
    gone from the half topic (deleted, or its topic created again: another record may stand
    at its offset)."""
    owed = lost_copy_owed(world, truth, notes, policy)
    if owed is not None:
        _fail(1, truth.txid, f"its release was lost at {owed[0]}; its half message sent again "
                             f"at {owed[1]} was never released")


def lost_copy_owed(world: Any, truth: Any, notes: list[dict[str, Any]], policy: Any
                   ) -> tuple[int, int] | None:
    """(when the release was lost, when its copy was sent again) of a lost release whose
    half message sent again is still owed its release; None when nothing is owed."""
    for lost in (n for n in notes if n.get("event") == "release_lost"):
        at = int(lost["at"])
        copies = [w for w, p, o in truth.halves
                  if at < w < at + policy.reserved_time - world.slack_ms
                  and _holds(world.record_at(world.topics.half, p, o), truth.txid)]
        if copies and not any(n.get("event") == "released" and int(n["at"]) > at
                              for n in notes):
            return at, copies[0]
    return None


def _check_timely(world: Any, truth: Any, seen: Observed, ended: dict[str, Any], policy: Any,
                  quiet_since: int) -> None:
    # Judged from its latest registration before it ended: a new checkpoint registers a
    # pending transaction again, and from then on it is held to the same time.
    registered = [int(n["at"]) for n in seen.notes.get(truth.txid, ())
                  if n.get("event") == "half" and int(n["at"]) <= int(ended["at"])]
    seen_at = max(registered, default=None)
    if seen_at is None or seen_at < quiet_since:
        return  # its life crossed an outage or an absence: it only had to end
    limit = seen_at + policy.reserved_time + policy.check_interval + world.slack_ms
    if int(ended["at"]) > limit:
        _fail(3, truth.txid, f"ended at {ended['at']}, registered {seen_at}: later than the "
                             f"reserved time plus an interval")


def _kinds(outputs: Iterable[Any]) -> set[str]:
    return {o.kind for o in outputs if o.kind != Kind.TIMER}
