"""How far the half and end topics have been read, on the coordinator's clock: the source's
progress time.

A discard for age must not come before a commit that was written in time, and an end event
held for its half message must not expire before the half topic has been read past when the
end event came (docs/decisions/0022-trusted-time.md). Record timestamps cannot say when a
record was written (a topic left at CreateTime keeps the producer's clock, and tansu keeps it
even at LogAppendTime), so the source measures it itself: each time it plans a micro-batch it
learns every half and end partition's end offset (high watermark), and so knows that every
record written before then lies below it. Once a planned batch reaches those offsets on every
partition, every record written before that time has been read: that time is the progress
time. (The half topic read behind the end topic, a backlog under ``maxOffsetsPerTrigger``,
holds it back: a discard then waits for that too, which costs nothing but the wait.)

It travels in the stream offset (``"_ends_read": {"at": ms}``), so a replayed batch carries the
same one, and in a PROGRESS row of each batch; Spark's event-time watermark (the maximum of the
column, kept in the checkpoint) hands it to every state key's call in the next batch.

A high watermark is vouched for as of the *start of the previous planning*, not this one: a
kept consumer may hand back a fetch response sent during the previous planning (kafka-python
pipelines fetches and buffers their responses). The first planning of a process has no
previous one and a new consumer, so its own start time is safe. Pure: times are given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

__all__ = ["ENDS_READ", "ProgressClock"]

# The stream offset's entry for the progress time.
ENDS_READ = "_ends_read"
# Observations kept while a backlog is read: a longer one only makes the progress time lag.
_KEPT = 512

Ends = Mapping[tuple[str, int], int]  # (topic, partition) -> end offset


class ProgressClock:
    """The observations of end offsets, and the progress time they prove for a planned batch."""

    def __init__(self) -> None:
        self._seen: deque[tuple[int, dict[tuple[str, int], int]]] = deque(maxlen=_KEPT)
        self._last_start: int | None = None

    def observed(self, started: int, ends: Ends) -> None:
        """A planning that started at ``started`` (ms) found these end offsets."""
        vouched = started if self._last_start is None else self._last_start
        self._last_start = started
        if not self._seen or self._seen[-1][1] != ends:
            self._seen.append((vouched, dict(ends)))
        else:  # the same ends seen again: the newer time proves more
            self._seen[-1] = (max(self._seen[-1][0], vouched), self._seen[-1][1])

    def progress(self, planned: Ends, previous: int) -> int:
        """The progress time of a batch that reads every end partition up to ``planned``:
        the latest observation it covers, never below ``previous``."""
        best = previous
        for at, ends in self._seen:
            if at > best and all(planned.get(tp, 0) >= end for tp, end in ends.items()):
                best = at
        return best

    def planned(self, progress: int) -> None:
        """A batch with this progress time was planned: what it covers is proven for good."""
        while self._seen and self._seen[0][0] <= progress:
            self._seen.popleft()
