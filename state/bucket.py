"""Many transactions under one state key, each with its own timer.

Which transactions share a key is :mod:`state.keys`' business (a time window of their ids).
A bucket keeps its transactions and their deadlines; the Spark timeout of the key is armed at
the earliest of them, and every call runs the timers that are due, so each transaction keeps
its own timer semantics.

The half message itself is kept in the state (not only its offset, as RocketMQ does): a commit
then releases without a random read of the half topic, which with kafka-python costs a fetch
round trip per message.

A bucket also numbers the records it asks to write (:meth:`Bucket.take_numbers`). The numbers
live in the state, so a micro-batch replayed after a crash numbers its records exactly as its
first run did: the sink recognises what that run already wrote and does not write it twice.
"""

from __future__ import annotations

import heapq
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from state.effects import Effect
from state.lifecycle import Event, Status, Transaction, apply, on_timeout
from state.policy import Policy
from txstream.message import Decision, EndEvent, Message

__all__ = ["Bucket", "FORMAT_VERSION"]

# 2: several held end events per transaction, and the message's queue position.
# 3: the record numbering (epoch, next number). Formats 1 and 2 are still read so that a
# checkpoint survives the upgrade; their buckets start a new numbering epoch.
FORMAT_VERSION = 3
_READABLE = (1, 2, FORMAT_VERSION)


# A transaction as the state holds it: decoded, or still the tuple it was encoded as.
_Held = Transaction | tuple[Any, ...]


class Bucket:
    """The transactions of one state key, with their timers.

    Decoding keeps every transaction as the tuple it was encoded as, and builds the
    ``Transaction`` (and its ``Message``) only when an event or a timer touches it: a key is
    decoded and encoded whole whenever a batch touches it, and most of its transactions are not
    touched by that batch (~6 us each to build, ~1 us to carry along as a tuple).
    """

    __slots__ = ("_held", "epoch", "next_number")

    def __init__(
        self,
        transactions: dict[str, Transaction] | None = None,
        epoch: int | None = None,
        next_number: int = 0,
    ) -> None:
        # One dict in timer-tie order (insertion), values decoded or not.
        self._held: dict[str, _Held] = dict(transactions or {})
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
        return (self.transactions, self.epoch, self.next_number) == (
            other.transactions, other.epoch, other.next_number)

    __hash__ = None  # type: ignore[assignment]  # mutable: equal buckets may differ later

    def __repr__(self) -> str:
        return f"Bucket({self.transactions!r}, epoch={self.epoch!r}, next={self.next_number})"

    def get(self, transaction_id: str) -> Transaction | None:
        return self._decoded(transaction_id) if transaction_id in self._held else None

    def apply(self, event: Event, now: int, policy: Policy) -> list[Effect]:
        txid = event.transaction_id
        assert txid is not None
        new, effects = apply(self.get(txid), event, now, policy)
        self._store(txid, new)
        return effects

    def fire_due(self, now: int, policy: Policy) -> list[Effect]:
        """Run every timer that is due at ``now``."""
        return [effect for _, effects in self.run_timers(now, 0, policy) for effect in effects]

    def run_timers(self, now: int, lead: int, policy: Policy) -> list[tuple[int, list[Effect]]]:
        """Run every timer due by ``now + lead``, in deadline order, each as of
        ``max(now, deadline)``: returns that time with each timer's effects, which must not
        take effect before it (``Policy.timer_lead``). A timer that sets another one within
        the window (a check near the reserved time) runs that one too, in its turn."""
        fired: list[tuple[int, list[Effect]]] = []
        horizon = now + lead
        due = [(_deadline(held), txid) for txid, held in self._held.items()
               if _deadline(held) <= horizon]
        heapq.heapify(due)
        while due:
            deadline, txid = heapq.heappop(due)
            at = max(now, deadline)
            new, effects = on_timeout(self._decoded(txid), at, policy)
            self._store(txid, new)
            fired.append((at, effects))
            if new is not None and at < new.deadline <= horizon:
                heapq.heappush(due, (new.deadline, txid))
        return fired

    def next_deadline(self) -> int | None:
        return min((_deadline(held) for held in self._held.values()), default=None)

    def pending(self) -> Iterable[Transaction]:
        return (tx for tx in self if not tx.status.resolved)

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
        return pickle.dumps((FORMAT_VERSION, rows, self.epoch, self.next_number), protocol=5)

    @classmethod
    def decode(cls, blob: bytes | None) -> Bucket:
        if not blob:
            return cls()
        version, rows, *numbering = pickle.loads(blob)
        if version not in _READABLE:
            raise ValueError(f"state format {version} is not one of {_READABLE}")
        bucket = cls(None, *(numbering if version >= 3 else (None, 0)))
        if version == FORMAT_VERSION:
            bucket._held = {row[0]: row for row in rows}
        else:  # older layouts are converted on the way in
            bucket._held = {row[0]: _tx_from_tuple(row, version) for row in rows}
        return bucket


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
    return (share(m.topic), m.body, share(m.tags), share(m.keys), properties,
            share(m.transaction_id), share(m.msg_id), share(m.producer_group),
            m.born_timestamp, m.check_immunity_time_s, m.queue_id, m.queue_offset,
            m.reconsume_times)


def _msg_from_tuple(t: tuple[Any, ...] | None) -> Message | None:
    if t is None:
        return None
    return Message(*t)  # format 1 has the first ten fields only: the rest keep their defaults


def _end_to_tuple(e: EndEvent, share: _Share) -> tuple[object, ...]:
    return (share(e.transaction_id), share(e.producer_group), e.decision.value, e.from_check,
            e.check_times, share(e.operator), e.remark, e.born_timestamp)


def _end_from_tuple(t: tuple[Any, ...]) -> EndEvent:
    return EndEvent(t[0], t[1], Decision(t[2]), t[3], t[4], t[5], t[6], t[7])


def _tx_to_tuple(tx: Transaction, share: _Share) -> tuple[object, ...]:
    return (share(tx.transaction_id), tx.status.value, tx.deadline, share(tx.producer_group),
            _msg_to_tuple(tx.half, share), tuple(_end_to_tuple(e, share) for e in tx.held),
            tx.checks_sent, tx.checks_answered, tx.next_check)


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
    )
