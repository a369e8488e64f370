"""Retry records read before they are due, held until they are
(docs/decisions/0024-retry-records-held-until-due.md).

The records of one retry partition are not in due order: a message retried for the 16th time
(due in 2 h) may lie before one retried for the first time (due in 10 s). So the polling thread
reads on past a record not yet due and holds it here, and consumes each held record when its
time comes. A held record stays in flight in the :class:`~client.offsets.OffsetTracker`: the
partition's commit point stays at or below it, and a consumer restarted (or a partition's next
owner) reads it again, from its headers, with the same due time.

Only the polling thread uses it (and the rebalance callbacks, which run while it waits inside
``poll``), as :class:`~client.consume_partitions.Partitions`.
"""

from __future__ import annotations

import heapq

from txstream.kafka import ConsumerRecord, TopicPartition
from txstream.message import Message

__all__ = ["HeldRetries"]

Held = tuple[int, ConsumerRecord, Message]  # (due, epoch ms; ConsumerRecord; its decoded message)


class HeldRetries:
    """Per partition: the records held, by offset, and a heap of (due, offset)."""

    def __init__(self) -> None:
        self._held: dict[TopicPartition, dict[int, Held]] = {}
        self._heap: list[tuple[int, TopicPartition, int]] = []

    def hold(self, tp: TopicPartition, due_ms: int, rec: ConsumerRecord, msg: Message) -> None:
        self._held.setdefault(tp, {})[rec.offset] = (due_ms, rec, msg)
        heapq.heappush(self._heap, (due_ms, tp, rec.offset))

    def count(self, tp: TopicPartition) -> int:
        return len(self._held.get(tp, ()))

    def holds(self, tp: TopicPartition, offset: int) -> bool:
        return offset in self._held.get(tp, ())

    def next_due(self) -> int | None:
        """When the earliest record held is due (epoch ms), or None when none is held."""
        self._prune()
        return self._heap[0][0] if self._heap else None

    def wait_ms(self, timeout_ms: int, now_ms: int) -> int:
        """``timeout_ms``, or less: until the earliest record held is due."""
        due = self.next_due()
        return timeout_ms if due is None else max(0, min(timeout_ms, due - now_ms))

    def pop_due(self, now_ms: int
                ) -> dict[TopicPartition, list[tuple[ConsumerRecord, Message]]]:
        """The records due by ``now_ms``, per partition in due order; no longer held."""
        out: dict[TopicPartition, list[tuple[ConsumerRecord, Message]]] = {}
        while self._heap and self._heap[0][0] <= now_ms:
            _, tp, offset = heapq.heappop(self._heap)
            held = self._held.get(tp, {})
            entry = held.get(offset)
            if entry is not None and entry[0] <= now_ms:
                del held[offset]
                out.setdefault(tp, []).append(entry[1:])
        return out

    def pop(self, tp: TopicPartition, offset: int) -> Held | None:
        """The record held at ``offset``, no longer held (None if it is not)."""
        entry = self._held.get(tp, {}).pop(offset, None)
        self._prune()
        return entry

    def drop_from(self, tp: TopicPartition, offset: int) -> list[int]:
        """Let go of the records at ``offset`` and after (the partition is read again from
        there); their offsets."""
        held = self._held.get(tp, {})
        dropped = [o for o in held if o >= offset]
        for o in dropped:
            del held[o]
        self._prune()
        return dropped

    def forget(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            self._held.pop(tp, None)
        self._prune()

    def _live(self, due: int, tp: TopicPartition, offset: int) -> bool:
        """Whether a heap entry still stands for a record held: a record let go and held
        again at the same offset has a new entry, and the old one says nothing."""
        held = self._held.get(tp, {}).get(offset)
        return held is not None and held[0] == due

    def _prune(self) -> None:
        """Drop heap entries of records no longer held: from the top, and all of them once
        they outnumber the records held, so the heap stays bounded as the records are."""
        while self._heap and not self._live(*self._heap[0]):
            heapq.heappop(self._heap)
        if len(self._heap) > 2 * sum(len(h) for h in self._held.values()) + 16:
            self._heap = [e for e in self._heap if self._live(*e)]
            heapq.heapify(self._heap)
