"""Which back-check requests a producer answers: the rule alone, without clocks or I/O.

A request is superseded, and not answered, when

- it is **expired**: its ``CHECK_VALID_UNTIL`` plus the grace is older than the newest request
  timestamp read so far. Requests are written by the coordinator, so their record timestamps
  are its clock (or the broker's): expiry is judged on that clock, never on the producer's,
  which may be far off;
- a request of the same transaction with a higher number was read in the same fetch;
- its number, or a higher one, was taken for its transaction already.

Numbers are compared within a life of the transaction (``TXSTREAM_CHECK_LIFE``: when the
coordinator registered it): a new checkpoint, or the id sent again as a new transaction,
numbers its checks from 1 again under a later life, and those are answered. A request that
names no life (an older coordinator) is of life 0.

The coordinator would count no answer to it (docs/decisions/0017-check-delivery.md), and a
producer returning after a long absence would otherwise answer a backlog. The producer's clock
decides nothing: it is only compared with the request timestamps, so that a producer whose
clock is off can say so.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from txstream.outputs import CheckRequest

__all__ = ["CheckChoice", "Choice", "Fetched", "Verdict", "REMEMBERED_TRANSACTIONS"]

# The transactions whose latest request number is remembered, to skip older ones read later.
REMEMBERED_TRANSACTIONS = 100_000


class Verdict(str, Enum):
    """What becomes of one fetched record."""

    ANSWER = "answer"
    MALFORMED = "malformed"  # not a request: nothing to answer
    EXPIRED = "expired"  # valid_until + grace is older than the newest request read
    SUPERSEDED = "superseded"  # a higher number of its transaction is in the same fetch
    TAKEN = "taken"  # its number, or a higher one, was taken for its transaction before


class Fetched(NamedTuple):
    """One record of the check topic: its request (None if malformed) and its timestamp (ms;
    None or negative when the record has none)."""

    request: CheckRequest | None
    timestamp_ms: int | None


@dataclass(frozen=True, slots=True)
class Choice:
    """The verdict on each record of a fetch, in order.

    ``clock_difference_ms``: the producer's time minus the newest request timestamp of this
    fetch (positive: the producer's clock is ahead of the coordinator's, or the request waited
    that long unread); None when the fetch had no timestamped request.
    """

    verdicts: tuple[Verdict, ...]
    clock_difference_ms: int | None

    def answered(self) -> list[int]:
        """The positions of the records to answer."""
        return [i for i, v in enumerate(self.verdicts) if v is Verdict.ANSWER]


_Order = tuple[int, int]  # (life, number): CheckRequest.order


class _Latest:
    """Per transaction, the latest check taken (bounded: oldest forgotten first)."""

    def __init__(self, capacity: int) -> None:
        self._numbers: OrderedDict[str, _Order] = OrderedDict()
        self._capacity = capacity

    def take(self, txid: str, number: _Order) -> bool:
        """Record ``number`` as taken; False if it or a later one was taken already."""
        if self._numbers.get(txid, (0, 0)) >= number:
            return False
        self._numbers[txid] = number
        self._numbers.move_to_end(txid)
        if len(self._numbers) > self._capacity:
            self._numbers.popitem(last=False)
        return True


class CheckChoice:
    """The memory of one check consumer: the numbers it took, and the newest request
    timestamp it read (the coordinator's clock, as far as it has seen it)."""

    def __init__(self, grace_ms: int = 10_000,
                 capacity: int = REMEMBERED_TRANSACTIONS) -> None:
        self.grace_ms = grace_ms
        self._capacity = capacity
        self._latest = _Latest(capacity)
        self.coordinator_ms: int | None = None  # the newest request timestamp read

    def reset(self) -> None:
        """Forget the numbers taken: what is read again (after a rebalance, or a rewind to a
        request that was not answered) is answered again. The coordinator's time is kept: it
        only grows, and a request expired on it stays expired."""
        self._latest = _Latest(self._capacity)

    def choose(self, fetched: Sequence[Fetched], now_ms: int) -> Choice:
        """The verdict on each record of one fetch (one partition's records, in offset order).
        ``now_ms`` is the producer's clock: it decides nothing, it is only compared."""
        stamps = [f.timestamp_ms for f in fetched
                  if f.request is not None and f.timestamp_ms is not None
                  and f.timestamp_ms >= 0]
        if stamps and (self.coordinator_ms is None or max(stamps) > self.coordinator_ms):
            self.coordinator_ms = max(stamps)
        newest: dict[str, _Order] = {}
        for f in fetched:
            if f.request is not None and f.request.message.transaction_id:
                txid = f.request.message.transaction_id
                newest[txid] = max(newest.get(txid, (0, 0)), f.request.order)
        verdicts = tuple(self._verdict(f.request, newest) for f in fetched)
        return Choice(verdicts, now_ms - max(stamps) if stamps else None)

    def _verdict(self, req: CheckRequest | None, newest: dict[str, _Order]) -> Verdict:
        if req is None:
            return Verdict.MALFORMED
        if self.expired(req):
            return Verdict.EXPIRED
        txid = req.message.transaction_id or ""
        if req.order < newest.get(txid, (0, 0)):
            return Verdict.SUPERSEDED
        if not self._latest.take(txid, req.order):
            return Verdict.TAKEN
        return Verdict.ANSWER

    def expired(self, req: CheckRequest) -> bool:
        """Whether ``req`` is past its validity on the coordinator's clock as read so far."""
        return (req.valid_until is not None and self.coordinator_ms is not None
                and self.coordinator_ms > req.valid_until + self.grace_ms)
