"""Many transactions under one state key, each with its own timer.

Which transactions share a key is :mod:`txstream.state.keys`' business (a time window of their ids).
A bucket keeps its transactions and their deadlines; the Spark timeout of the key is armed at
the earliest of them, and every call runs the timers that are due, so each transaction keeps
its own timer semantics.

A pending half message is kept without its body, as RocketMQ keeps an offset into its half
queue: the message read from the half topic knows where it lies (``queue_id``, ``queue_offset``),
and whoever writes its release, checks or discard reads the body back from there
(``txstream.readback.bodies``). Within the call that reads the half message the body is still at
hand, so a commit in the same micro-batch needs no read (docs/decisions/0021-bodies-read-back.md).

A bucket also numbers the records it asks to write (:meth:`Bucket.take_numbers`). The numbers
live in the state, so a micro-batch replayed after a crash numbers its records exactly as its
first run did: the sink recognises what that run already wrote and does not write it twice.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from txstream.state.codec import (
    FORMAT_VERSION,
    MSG_BORN,
    OUTCOME_STATUS_BITS,
    TX_DEADLINE,
    TX_GROUP,
    TX_HALF,
    TX_ID,
    TX_STATUS,
    decode_state,
    encode_state,
    row_of,
    sharer,
    transaction_of,
)
from txstream.state.effects import Effect
from txstream.state.lifecycle import apply, on_timeout
from txstream.state.outcomes import IN_DOUBT, Outcomes
from txstream.state.policy import Policy
from txstream.state.timing import sends_check, waits_for_ends
from txstream.state.transaction import Event, Status, Transaction

__all__ = ["Bucket"]

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
        if tx is None and (outcome := self.known_outcome(txid, now)) is not None:
            # Resolved and left the state: a repeat is a duplicate, a contradiction is told
            # the outcome. Nothing changes a resolved transaction, so nothing is stored.
            status, until = outcome
            remembered = Transaction(txid, Status(status), until)
            new, effects = apply(remembered, event, now, policy)
            if new is not remembered:  # a lost release's half message sent again: released
                self._store(txid, new)
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
                self.outcomes.remember(txid, tx.status.value, tx.remember_until or 0)
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

    def known_outcome(self, transaction_id: str, now: int) -> tuple[str, int] | None:
        """The status and until of a transaction that left the state, if remembered."""
        known = self.outcomes.recall(transaction_id, now)
        return None if known is None or known[0] == IN_DOUBT else known

    def in_doubt(self, transaction_id: str, now: int) -> bool:
        """Whether a coordinator before this state may have released ``transaction_id``
        unnoted: its half message is to be looked for on its real topic before it is applied."""
        known = self.outcomes.recall(transaction_id, now)
        return known is not None and known[0] == IN_DOUBT

    def recall_outcome(self, transaction_id: str, status: str, until: int, now: int) -> bool:
        """Remember an outcome decided before this state existed (recovered from the history
        topic by a new checkpoint), or IN_DOUBT; False if the transaction is held or already
        remembered. A lost release released again since (its half message sent again) is
        committed, whichever of the two notes is read first; any outcome replaces IN_DOUBT,
        which replaces none."""
        known = self.outcomes.recall(transaction_id, now)
        replaces = known is None or known[0] == IN_DOUBT or (
            known[0] == Status.LOST.value and status == Status.COMMITTED.value)
        if transaction_id in self._held or not replaces:
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
            else:  # a row of the current layout
                status, group, half = held[TX_STATUS], held[TX_GROUP], held[TX_HALF]
                born = half[MSG_BORN] if half is not None else None
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
        tx = transaction_of(held)
        self._held[txid] = tx
        return tx

    def _store(self, txid: str, tx: Transaction | None) -> None:
        if tx is None:
            self._held.pop(txid, None)
        else:
            self._held[txid] = tx

    # --- encoding: txstream.state.codec's layouts -------------------------------------------------

    def encode(self) -> bytes:
        share = sharer()
        rows = [held if isinstance(held, tuple) else row_of(held, share)
                for held in self._held.values()]
        return encode_state(rows, self.epoch, self.next_number, self.outcomes.encode())

    @classmethod
    def decode(cls, blob: bytes | None) -> Bucket:
        if not blob:
            return cls()
        state = decode_state(blob)
        bits = OUTCOME_STATUS_BITS[state.layout.version]
        bucket = cls(None, state.epoch, state.next_number, Outcomes.decode(state.outcomes, bits))
        if state.layout.version == FORMAT_VERSION:  # decoded when touched
            bucket._held = {row[TX_ID]: row for row in state.rows}
        else:  # an older layout is converted on the way in
            bucket._held = {tx.transaction_id: tx for tx in
                            (transaction_of(row, state.layout) for row in state.rows)}
        return bucket


def _body_at(tx: Transaction, wanted: dict[str, tuple[int, int]]) -> None:
    half = tx.half
    if (tx.status is Status.PENDING and half is not None and half.body is None
            and half.queue_id is not None and half.queue_offset is not None
            and tx.body_gone is None):
        wanted[tx.transaction_id] = (half.queue_id, half.queue_offset)


def _deadline(held: _Held) -> int:
    deadline: int = held.deadline if isinstance(held, Transaction) else held[TX_DEADLINE]
    return deadline
