"""Many transactions under one state key, each with its own timer.

Which transactions share a key is :mod:`txstream.state.keys`' business (a time window of their ids).
A bucket keeps its transactions and their deadlines; the Spark timeout of the key is armed at
the earliest of them, and every call runs the timers that are due, so each transaction keeps
its own timer semantics.

A pending half message is kept without its body, as RocketMQ keeps an offset into its half
queue: the message read from the half topic knows where it lies (``queue_id``, ``queue_offset``),
and whoever writes its release, checks or discard reads the body back from there
(``txstream.sources.bodies``). Within the call that reads the half message the body is still at
hand, so a commit in the same micro-batch needs no read (docs/decisions/0021-bodies-read-back.md).

A bucket also numbers the records it asks to write (:meth:`Bucket.take_numbers`). The numbers
live in the state, so a micro-batch replayed after a crash numbers its records exactly as its
first run did: the sink recognises what that run already wrote and does not write it twice.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from txstream.message import Decision, EndEvent, Message, RawRecord
from txstream.state.effects import Effect
from txstream.state.lifecycle import apply, on_timeout
from txstream.state.outcomes import Outcomes
from txstream.state.policy import Policy
from txstream.state.timing import sends_check, waits_for_ends
from txstream.state.transaction import Event, Status, Transaction

__all__ = ["Bucket", "FORMAT_VERSION"]

# 2: several held end events per transaction, and the message's queue position.
# 3: the record numbering (epoch, next number).
# 4: a held end event keeps the record it was read from (a dead letter byte for byte); a
#    message its broker timestamp; a transaction the number of the check last answered and
#    until when its outcome is remembered; the bucket the outcomes it remembers.
# 5: a half message read from the half topic is kept without its body (its coordinates say
#    where to read it back).
# 6: a transaction when it was registered, when its latest check was due, and why its body
#    is gone (if it is).
# Older formats are still read so that a checkpoint survives the upgrade; buckets of formats 1
# and 2 start a new numbering epoch.
FORMAT_VERSION = 6
_READABLE = (1, 2, 3, 4, 5, FORMAT_VERSION)


# A transaction as the state holds it: decoded, or still the tuple it was encoded as.
_Held = Transaction | tuple[Any, ...]
# The statuses of unresolved transactions, as encoded.
_OPEN = frozenset(s.value for s in Status if not s.resolved)


class Bucket:
    """The transactions of one state key, with their timers.

    Decoding keeps every transaction as the tuple it was encoded as, and builds the
    ``Transaction`` (and its ``Message``) only when an event or a timer touches it: a key is
    decoded and encoded whole whenever a batch touches it, and most of its transactions are not
    touched by that batch (~6 us each to build, ~1 us to carry along as a tuple).
    """

    __slots__ = ("_held", "epoch", "next_number", "outcomes")

    def __init__(
        self,
        transactions: dict[str, Transaction] | None = None,
        epoch: int | None = None,
        next_number: int = 0,
        outcomes: Outcomes | None = None,
    ) -> None:
        # One dict in timer-tie order (insertion), values decoded or not.
        self._held: dict[str, _Held] = dict(transactions or {})
        # Resolved transactions that left ``_held``: their outcomes only.
        self.outcomes = outcomes if outcomes is not None else Outcomes()
        # ``epoch``: the batch time at which this numbering started (None: not yet). A bucket
        # whose state was dropped when it emptied starts again at a later batch time, so
        # (epoch, number) never repeats within a bucket.
        self.epoch = epoch
        self.next_number = next_number

    @property
    def transactions(self) -> dict[str, Transaction]:
        """Every transaction, decoded (admin tools and tests; the operator never needs it)."""
        return {txid: self._decoded(txid) for txid in list(self._held)}

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Transaction]:
        return iter(self.transactions.values())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bucket):
            return NotImplemented
        return (self.transactions, self.epoch, self.next_number, self.outcomes) == (
            other.transactions, other.epoch, other.next_number, other.outcomes)

    __hash__ = None  # type: ignore[assignment]  # mutable: equal buckets may differ later

    def __repr__(self) -> str:
        return (f"Bucket({self.transactions!r}, epoch={self.epoch!r}, next={self.next_number}, "
                f"outcomes={len(self.outcomes)})")

    def get(self, transaction_id: str) -> Transaction | None:
        return self._decoded(transaction_id) if transaction_id in self._held else None

    def apply(self, event: Event, now: int, policy: Policy) -> list[Effect]:
        txid = event.transaction_id
        assert txid is not None
        tx = self.get(txid)
        if tx is None and (outcome := self.outcomes.recall(txid, now)) is not None:
            # Resolved and left the state: a repeat is a duplicate, a contradiction is told
            # the outcome. Nothing changes a resolved transaction, so nothing is stored.
            status, until = outcome
            remembered = Transaction(txid, Status(status), until)
            new, effects = apply(remembered, event, now, policy)
            assert new is remembered
            return effects
        new, effects = apply(tx, event, now, policy)
        self._store(txid, new)
        return effects

    def fire_due(self, now: int, policy: Policy, ends_read: int | None = None) -> list[Effect]:
        """Run every timer that is due at ``now``."""
        return [effect for _, effects in self.run_timers(now, 0, policy, ends_read)
                for effect in effects]

    def run_timers(self, now: int, lead: int, policy: Policy, ends_read: int | None = None
                   ) -> list[tuple[int, list[Effect]]]:
        """Run every timer due by ``now``, and every check due by ``now + lead``, in deadline
        order, each as of ``max(now, deadline)``: returns that time with each timer's effects,
        which must not take effect before it (``Policy.timer_lead``). A timer that would
        decide an outcome runs only once due (:func:`txstream.state.timing.sends_check`). A timer
        that sets another one within the window runs that one too, in its turn.
        ``ends_read``: how far the end topic has been read (default ``now``): a discard for
        age waits until it passes the reserved deadline
        (:func:`txstream.state.timing.waits_for_ends`)."""
        fired: list[tuple[int, list[Effect]]] = []
        self.outcomes.forget_expired(now)
        horizon = now + lead
        due = [(_deadline(held), txid) for txid, held in self._held.items()
               if _deadline(held) <= horizon]
        heapq.heapify(due)
        while due:
            deadline, txid = heapq.heappop(due)
            at = max(now, deadline)
            tx = self._decoded(txid)
            if at > now and not sends_check(tx, at, policy):
                continue  # an outcome waits for its deadline: the key wakes up then
            new, effects = on_timeout(tx, at, policy, ends_read)
            if new is None and tx.status.resolved and (tx.remember_until or 0) > at:
                # A lost release is remembered as committed: its decision was taken.
                status = Status.COMMITTED if tx.status is Status.LOST else tx.status
                self.outcomes.remember(txid, status.value, tx.remember_until or 0)
            self._store(txid, new)
            if effects:
                fired.append((at, effects))
            if new is not None and at < new.deadline <= horizon:
                heapq.heappush(due, (new.deadline, txid))
        return fired

    def bodies_wanted(self, txids: Iterable[str], now: int, lead: int, policy: Policy,
                      ends_read: int | None = None) -> dict[str, tuple[int, int]]:
        """Where the bodies lie (half topic partition, offset) of the held half messages that
        this call may write: those of ``txids`` (the transactions its end events name) and of
        the timers that will send a check or a discard by ``now + lead``."""
        wanted: dict[str, tuple[int, int]] = {}
        reads = now if ends_read is None else ends_read
        for txid in txids:
            if txid in self._held:
                _body_at(self._decoded(txid), wanted)
        for txid, held in self._held.items():
            if _deadline(held) > now + lead or txid in wanted:
                continue
            tx = self._decoded(txid)
            due = _deadline(held) <= now or sends_check(tx, _deadline(held), policy)
            if due and not waits_for_ends(tx, max(now, tx.deadline), policy, reads):
                _body_at(tx, wanted)
        return wanted

    def recall_outcome(self, transaction_id: str, status: str, until: int, now: int) -> bool:
        """Remember an outcome decided before this state existed (recovered from the history
        topic by a new checkpoint); False if the transaction is held or already remembered."""
        if transaction_id in self._held or self.outcomes.recall(transaction_id, now):
            return False
        self.outcomes.remember(transaction_id, status, until)
        return True

    def next_deadline(self) -> int | None:
        return min((_deadline(held) for held in self._held.values()), default=None)

    def next_wakeup(self, lead: int, policy: Policy) -> int | None:
        """When the key must next run: a check's deadline less the lead, any other timer's
        deadline; with no transaction held, when the last remembered outcome expires (None:
        nothing to keep). What :meth:`run_timers` will then find to do."""
        wakeups = []
        for txid, held in self._held.items():
            deadline = _deadline(held)
            early = lead > 0 and sends_check(self._decoded(txid), deadline, policy)
            wakeups.append(deadline - lead if early else deadline)
        return min(wakeups, default=self.outcomes.last_until())

    def pending(self) -> Iterable[Transaction]:
        return (tx for tx in self if not tx.status.resolved)

    def open_counts(self) -> tuple[dict[tuple[str, str], int], int | None]:
        """The unresolved transactions by (status, producer group), and the oldest born time
        of a PENDING one; read from the held tuples without decoding them (the operator asks
        on every call, for the coordinator's metrics)."""
        counts: dict[tuple[str, str], int] = {}
        oldest: int | None = None
        for held in self._held.values():
            if isinstance(held, Transaction):
                status, group = held.status.value, held.producer_group
                born = held.half.born_timestamp if held.half is not None else None
            else:  # _tx_to_tuple's layout; the half message's born time is its 9th field
                status, group = held[1], held[3]
                born = held[4][8] if held[4] is not None else None
            if status not in _OPEN:
                continue
            counts[(status, group or "")] = counts.get((status, group or ""), 0) + 1
            if status == Status.PENDING.value and born is not None:
                oldest = born if oldest is None else min(oldest, born)
        return counts, oldest

    def take_numbers(self, count: int, now: int) -> tuple[int, int]:
        """Reserve ``count`` record numbers; returns (epoch, first number).

        Pure like the rest: the same state and ``now`` give the same numbers, which is what
        makes a replayed batch's records recognisable.
        """
        if count < 0:
            raise ValueError("count must not be negative")
        if self.epoch is None:
            self.epoch = now
        first = self.next_number
        self.next_number += count
        return self.epoch, first

    def _decoded(self, txid: str) -> Transaction:
        held = self._held[txid]
        if isinstance(held, Transaction):
            return held
        tx = _tx_from_tuple(held, FORMAT_VERSION)
        self._held[txid] = tx
        return tx

    def _store(self, txid: str, tx: Transaction | None) -> None:
        if tx is None:
            self._held.pop(txid, None)
        else:
            self._held[txid] = tx

    # --- encoding: plain tuples, so the state does not depend on class paths -----------------

    def encode(self) -> bytes:
        share = _sharer()
        rows = [held if isinstance(held, tuple) else _tx_to_tuple(held, share)
                for held in self._held.values()]
        return pickle.dumps((FORMAT_VERSION, rows, self.epoch, self.next_number,
                             self.outcomes.encode()), protocol=5)

    @classmethod
    def decode(cls, blob: bytes | None) -> Bucket:
        if not blob:
            return cls()
        version, rows, *rest = pickle.loads(blob)
        if version not in _READABLE:
            raise ValueError(f"state format {version} is not one of {_READABLE}")
        epoch, number = rest[:2] if version >= 3 else (None, 0)
        bucket = cls(None, epoch, number, Outcomes.decode(rest[2] if version >= 4 else None))
        if version == FORMAT_VERSION:
            bucket._held = {row[0]: row for row in rows}
        else:  # older layouts are converted on the way in
            bucket._held = {row[0]: _tx_from_tuple(row, version) for row in rows}
        return bucket


def _body_at(tx: Transaction, wanted: dict[str, tuple[int, int]]) -> None:
    half = tx.half
    if (tx.status is Status.PENDING and half is not None and half.body is None
            and half.queue_id is not None and half.queue_offset is not None
            and tx.body_gone is None):
        wanted[tx.transaction_id] = (half.queue_id, half.queue_offset)


def _deadline(held: _Held) -> int:
    deadline: int = held.deadline if isinstance(held, Transaction) else held[2]
    return deadline


_Share = Callable[[Any], Any]


def _sharer() -> _Share:
    """Equal strings as one object, within one encoding. Pickle writes an object it has
    written before as a two-byte reference, but only the same object: a message's id, its
    ``UNIQ_KEY`` and often its keys are equal strings decoded from separate headers, and the
    topic and group repeat across a key's transactions. Shared, a held transaction with a
    200-byte body took 309 bytes of state instead of 390, and a key encoded a third faster;
    Spark copies every key's state on every micro-batch, so this is paid per batch."""
    seen: dict[str, str] = {}

    def share(value: Any) -> Any:
        return seen.setdefault(value, value) if isinstance(value, str) else value

    return share


def _msg_to_tuple(m: Message | None, share: _Share) -> tuple[object, ...] | None:
    if m is None:
        return None
    properties = {share(k): share(v) for k, v in m.properties.items()}
    # A message that knows where it lies in the half topic is read back from there.
    body = None if m.queue_id is not None and m.queue_offset is not None else m.body
    return (share(m.topic), body, share(m.tags), share(m.keys), properties,
            share(m.transaction_id), share(m.msg_id), share(m.producer_group),
            m.born_timestamp, m.check_immunity_time_s, m.queue_id, m.queue_offset,
            m.reconsume_times, m.stored_timestamp)


def _msg_from_tuple(t: tuple[Any, ...] | None) -> Message | None:
    if t is None:
        return None
    return Message(*t)  # format 1 has the first ten fields only: the rest keep their defaults


def _end_to_tuple(e: EndEvent, share: _Share) -> tuple[object, ...]:
    raw = e.raw
    return (share(e.transaction_id), share(e.producer_group), e.decision.value, e.from_check,
            e.check_times, share(e.operator), e.remark, e.born_timestamp,
            None if raw is None else (raw.partition, raw.offset, raw.key, raw.value, raw.headers))


def _end_from_tuple(t: tuple[Any, ...]) -> EndEvent:
    raw = RawRecord(*t[8]) if len(t) > 8 and t[8] is not None else None
    return EndEvent(t[0], t[1], Decision(t[2]), t[3], t[4], t[5], t[6], t[7], raw)


def _tx_to_tuple(tx: Transaction, share: _Share) -> tuple[object, ...]:
    return (share(tx.transaction_id), tx.status.value, tx.deadline, share(tx.producer_group),
            _msg_to_tuple(tx.half, share), tuple(_end_to_tuple(e, share) for e in tx.held),
            tx.checks_sent, tx.checks_answered, tx.next_check, tx.last_answered,
            tx.remember_until, tx.seen_at, tx.check_due, tx.body_gone)


def _tx_from_tuple(t: tuple[Any, ...], version: int) -> Transaction:
    held: tuple[EndEvent, ...]
    if version == 1:  # one held end event or None
        held = (_end_from_tuple(t[5]),) if t[5] is not None else ()
    else:
        held = tuple(_end_from_tuple(e) for e in t[5])
    return Transaction(
        transaction_id=t[0],
        status=Status(t[1]),
        deadline=t[2],
        producer_group=t[3],
        half=_msg_from_tuple(t[4]),
        held=held,
        checks_sent=t[6],
        checks_answered=t[7],
        next_check=t[8],
        # Before format 4 the count was the highest check number answered.
        last_answered=t[9] if len(t) > 9 else t[7],
        remember_until=t[10] if len(t) > 10 else None,
        seen_at=t[11] if len(t) > 11 else None,
        check_due=t[12] if len(t) > 12 else None,
        body_gone=t[13] if len(t) > 13 else None,
    )
