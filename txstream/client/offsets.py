"""Which offset of a partition may be committed while its records finish out of order.

Shared by the push consumer (messages consumed on its thread pool) and the producer's check
responder (back-checks answered on the check executor). The polling thread takes records in
offset order; other threads finish them, in any order. The commit point is the lowest offset
still in flight, or past the last record taken when none is, so an offset is never committed
before every record below it was handled. A failed record pins the commit point at its offset
until the polling thread rewinds the partition to it.
"""

from __future__ import annotations

import itertools
import threading

from txstream.kafka import TopicPartition

__all__ = ["OffsetTracker"]


class OffsetTracker:
    """Per partition: the records in flight and what may be committed. Thread-safe.

    ``forget`` starts a partition afresh (it was revoked or assigned again) and changes its
    ``epoch``: a record finished later with the old epoch, or for a partition no longer
    tracked, changes nothing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._failed: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._epochs: dict[TopicPartition, int] = {}
        self._epoch_counter = itertools.count(1)

    def take(self, tp: TopicPartition, offset: int, inflight: bool = True) -> bool:
        """Take the record at ``offset``: in flight until finished, else handled already.
        False (nothing taken) while a failed record of the partition waits to be rewound."""
        with self._lock:
            if tp in self._failed:
                return False  # rewind first, or later offsets would be committed past it
            if inflight:
                self._inflight.setdefault(tp, set()).add(offset)
            self._next[tp] = offset + 1
            return True

    def finish(self, tp: TopicPartition, offset: int, ok: bool, epoch: int | None = None) -> None:
        with self._lock:
            if tp not in self._next or (epoch is not None and epoch != self._epochs.get(tp, 0)):
                return  # the partition was revoked since: its next owner handles the record
            self._inflight.get(tp, set()).discard(offset)
            if not ok:
                self._failed[tp] = min(offset, self._failed.get(tp, offset))
                self._next[tp] = min(self._next.get(tp, offset), offset)

    def epoch(self, tp: TopicPartition) -> int:
        with self._lock:
            return self._epochs.get(tp, 0)

    def rewind(self, tp: TopicPartition, offset: int) -> None:
        """The partition is read again from ``offset`` (also: where a new reader starts)."""
        with self._lock:
            self._next[tp] = offset

    def pop_failed(self) -> dict[TopicPartition, int]:
        with self._lock:
            failed, self._failed = self._failed, {}
            return failed

    def busy(self, tps: set[TopicPartition]) -> bool:
        with self._lock:
            return any(self._inflight.get(tp) for tp in tps)

    def pending(self, tp: TopicPartition) -> tuple[int, int | None, int | None]:
        """(records in flight, the lowest offset in flight, the next offset to take)."""
        with self._lock:
            inflight = self._inflight.get(tp)
            return (len(inflight or ()), min(inflight) if inflight else None,
                    self._next.get(tp))

    def to_commit(self, tps: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        """The commit point of every partition (of ``tps``) whose point moved since its last
        commit."""
        with self._lock:
            out = {}
            for tp, nxt in self._next.items():
                if tps is not None and tp not in tps:
                    continue
                point = min([nxt, *self._inflight.get(tp, ())])
                if self._committed.get(tp) != point:
                    out[tp] = point
            return out

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        with self._lock:
            self._committed.update(offsets)

    def forget(self, tps: set[TopicPartition]) -> None:
        with self._lock:
            for d in (self._inflight, self._next, self._failed, self._committed):
                for tp in tps:
                    d.pop(tp, None)
            for tp in tps:
                self._epochs[tp] = next(self._epoch_counter)
