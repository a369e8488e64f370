"""Many transactions under one state key, each with its own timer.

Why buckets: ``applyInPandasWithState`` costs one Python call and one pandas frame per key per
micro-batch, which capped a probe keyed by transaction id at ~700 tx/s; keyed by a bounded hash
bucket it ran ~4x faster (``../shared/notes/measurements.md``). A bucket keeps its transactions
and their deadlines; the Spark timeout of the bucket is armed at the earliest of them, and every
call runs the timers that are due, so each transaction keeps its own timer semantics.

The half message itself is kept in the state (not only its offset, as RocketMQ does): a commit
then releases without a random read of the half topic, which with kafka-python costs a fetch
round trip per message.

A bucket also numbers the records it asks to write (:meth:`Bucket.take_numbers`). The numbers
live in the state, so a micro-batch replayed after a crash numbers its records exactly as its
first run did: the sink recognises what that run already wrote and does not write it twice.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from state.effects import Effect
from state.lifecycle import Event, Status, Transaction, apply, on_timeout
from state.policy import Policy
from txstream.message import Decision, EndEvent, Message

__all__ = ["Bucket", "bucket_of", "FORMAT_VERSION"]

# 2: several held end events per transaction, and the message's queue position.
# 3: the record numbering (epoch, next number). Formats 1 and 2 are still read so that a
# checkpoint survives the upgrade; their buckets start a new numbering epoch.
FORMAT_VERSION = 3
_READABLE = (1, 2, FORMAT_VERSION)


def bucket_of(transaction_id: str, buckets: int) -> int:
    """Stable across processes and Python versions (``hash()`` is salted per process)."""
    return zlib.crc32(transaction_id.encode("utf-8")) % buckets


class Bucket:
    """The transactions of one bucket, with their timers."""

    __slots__ = ("epoch", "next_number", "transactions")

    def __init__(
        self,
        transactions: dict[str, Transaction] | None = None,
        epoch: int | None = None,
        next_number: int = 0,
    ) -> None:
        self.transactions: dict[str, Transaction] = transactions or {}
        # ``epoch``: the batch time at which this numbering started (None: not yet). A bucket
        # whose state was dropped when it emptied starts again at a later batch time, so
        # (epoch, number) never repeats within a bucket.
        self.epoch = epoch
        self.next_number = next_number

    def __len__(self) -> int:
        return len(self.transactions)

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
        return self.transactions.get(transaction_id)

    def apply(self, event: Event, now: int, policy: Policy) -> list[Effect]:
        txid = event.transaction_id
        assert txid is not None
        new, effects = apply(self.transactions.get(txid), event, now, policy)
        self._store(txid, new)
        return effects

    def fire_due(self, now: int, policy: Policy) -> list[Effect]:
        """Run every timer that is due at ``now``."""
        effects: list[Effect] = []
        due = [tx for tx in self.transactions.values() if tx.deadline <= now]
        for tx in sorted(due, key=lambda t: (t.deadline, t.transaction_id)):
            new, more = on_timeout(tx, now, policy)
            self._store(tx.transaction_id, new)
            effects.extend(more)
        return effects

    def next_deadline(self) -> int | None:
        return min((tx.deadline for tx in self.transactions.values()), default=None)

    def pending(self) -> Iterable[Transaction]:
        return (tx for tx in self.transactions.values() if not tx.status.resolved)

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

    def _store(self, txid: str, tx: Transaction | None) -> None:
        if tx is None:
            self.transactions.pop(txid, None)
        else:
            self.transactions[txid] = tx

    # --- encoding: plain tuples, so the state does not depend on class paths -----------------

    def encode(self) -> bytes:
        rows = [_tx_to_tuple(tx) for tx in self.transactions.values()]
        return pickle.dumps((FORMAT_VERSION, rows, self.epoch, self.next_number), protocol=5)

    @classmethod
    def decode(cls, blob: bytes | None) -> Bucket:
        if not blob:
            return cls()
        version, rows, *numbering = pickle.loads(blob)
        if version not in _READABLE:
            raise ValueError(f"state format {version} is not one of {_READABLE}")
        txs = (_tx_from_tuple(row, version) for row in rows)
        epoch, next_number = numbering if version >= 3 else (None, 0)
        return cls({tx.transaction_id: tx for tx in txs}, epoch, next_number)


def _msg_to_tuple(m: Message | None) -> tuple[object, ...] | None:
    if m is None:
        return None
    return (m.topic, m.body, m.tags, m.keys, m.properties, m.transaction_id, m.msg_id,
            m.producer_group, m.born_timestamp, m.check_immunity_time_s, m.queue_id,
            m.queue_offset, m.reconsume_times)


def _msg_from_tuple(t: tuple[Any, ...] | None) -> Message | None:
    if t is None:
        return None
    return Message(*t)  # format 1 has the first ten fields only: the rest keep their defaults


def _end_to_tuple(e: EndEvent) -> tuple[object, ...]:
    return (e.transaction_id, e.producer_group, e.decision.value, e.from_check, e.check_times,
            e.operator, e.remark, e.born_timestamp)


def _end_from_tuple(t: tuple[Any, ...]) -> EndEvent:
    return EndEvent(t[0], t[1], Decision(t[2]), t[3], t[4], t[5], t[6], t[7])


def _tx_to_tuple(tx: Transaction) -> tuple[object, ...]:
    return (tx.transaction_id, tx.status.value, tx.deadline, tx.producer_group,
            _msg_to_tuple(tx.half), tuple(_end_to_tuple(e) for e in tx.held), tx.checks_sent,
            tx.checks_answered, tx.next_check)


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
