"""The operator's side of parking (:mod:`state.parking`): load, unpark what a call needs, park.

Per call: transactions that this call's events name, and those whose deadline has come, are
restored from their records (their half messages read back from the half topic) into the
bucket before anything is applied; after the events and timers ran, every pending transaction
whose next deadline is at least ``park_after`` away is parked again. The core sees whole
transactions only, so timers and transitions are exactly those of an unparked bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from state.bucket import Bucket
from state.lifecycle import Transaction
from state.parking import Parked, join, park, positions, restore, split
from streaming.half_reader import read_halves
from txstream.kafka import KafkaSettings
from txstream.message import Message

__all__ = ["ParkingLot", "HalfSource"]

# Reads half messages by (partition, offset): the half topic, or a test's dictionary.
HalfSource = Callable[[Sequence[tuple[int, int]]], dict[tuple[int, int], Message]]


class ParkingLot:
    """``park_after`` ms: 0 turns parking off (transactions already parked still come back)."""

    def __init__(self, kafka: KafkaSettings | None, half_topic: str, park_after: int,
                 halves: HalfSource | None = None) -> None:
        self.kafka = kafka
        self.half_topic = half_topic
        self.halves = halves
        self.park_after = park_after if (kafka is not None or halves is not None) else 0

    def load(self, blob: bytes | None) -> tuple[Bucket, Parked]:
        own, parked = split(blob)
        return Bucket.decode(own), parked

    def unpark(self, bucket: Bucket, parked: Parked, transaction_ids: Iterable[str],
               now: int) -> int:
        """Restore the parked transactions named by an event or due at ``now``; how many."""
        if not len(parked):
            return 0
        import numpy as np

        indices = np.union1d(parked.find(transaction_ids), parked.due(now)).astype(np.int64)
        restored = self._restore(parked.take(indices))
        for tx in restored:
            bucket.transactions[tx.transaction_id] = tx
        return len(restored)

    def everything(self, blob: bytes | None) -> list[Transaction]:
        """Every transaction of a state value, the parked ones read back (for admin tools)."""
        import numpy as np

        bucket, parked = self.load(blob)
        parked_ones = self._restore(parked.take(np.arange(len(parked))))
        return [*bucket.transactions.values(), *parked_ones]

    def _restore(self, records: Any) -> list[Transaction]:
        if not len(records):
            return []
        wanted = positions(records)
        if self.halves is not None:
            halves = self.halves(wanted)
        elif self.kafka is not None:
            halves = read_halves(self.kafka, self.half_topic, wanted)
        else:
            raise RuntimeError("parked transactions need Kafka settings to read their halves")
        return [restore(r, halves[at]) for r, at in zip(records, wanted, strict=True)]

    def store(self, bucket: Bucket, parked: Parked, now: int) -> tuple[bytes | None, int | None]:
        """(state value, earliest deadline); (None, None) when nothing is left to keep."""
        if self.park_after > 0:
            park(bucket, parked, now, self.park_after)
        deadlines = [d for d in (bucket.next_deadline(), parked.min_deadline()) if d is not None]
        if not deadlines:
            return None, None
        return join(bucket.encode(), parked), min(deadlines)
