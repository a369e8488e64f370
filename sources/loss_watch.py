"""Which partitions the broker lost records of, confirmed over time: the reader's side of
:mod:`txstream.sources.data_loss`.

A partition seen ending below the checkpoint is taken for records lost only once it has stayed
below for ``loss_confirm_ms`` (a new leader's high watermark catching up looks the same for a
moment), and never while its leader is short of in-sync replicas (its high watermark then
stays where it was, however long). Meanwhile it is not read. Lost partitions fail the query,
or, with ``fail_on_data_loss=false``, are read again from offset 0.

A task reading a planned batch judges by the same rule (:func:`read_past_loss`): records the
broker answers are not there are skipped only once it has said so for ``loss_confirm_ms``, or
at once if their topic was created again. A held high watermark (a stall after a leader
election) otherwise skipped half messages stored below it, for good: the checkpoint moved on
past them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from txstream.kafka import ConsumerRecord
from txstream.kafka.partition_health import troubles_of
from txstream.sources.data_loss import TOPIC_IDS, Loss, find_loss
from txstream.sources.kafka_io import (
    RecordsGone,
    SourceOptions,
    SourceReadError,
    TopicSlice,
    Unreadable,
    read_slice,
)
from txstream.sources.offsets import Offsets

__all__ = ["LossWatch", "read_past_loss"]

log = logging.getLogger(__name__)


class LossWatch:
    """The partitions seen ending below the checkpoint, since when, and those told of."""

    def __init__(self, options: SourceOptions, clock: Callable[[], int]) -> None:
        self.options = options
        self._clock = clock
        self._below_since: dict[tuple[str, str], int] = {}
        self._told_below: frozenset[tuple[str, str]] = frozenset()

    def confirmed(self, loss: Loss) -> Loss:
        """``loss`` less the partitions seen ending below the checkpoint for less than
        ``loss_confirm_ms`` (a new leader's high watermark catching up): those are not read
        meanwhile, as their end is below where they were read to."""
        now = self._clock()
        # A leader short of in-sync replicas keeps its high watermark where it was: its
        # partition waits, however long, until they are back.
        troubled = troubles_of(self.options.kafka, sorted({t for t, _ in loss.below})) \
            if loss.below else {}
        self._below_since = {p: now if (p[0], int(p[1])) in troubled
                             else self._below_since.get(p, now) for p in loss.below}
        waiting = frozenset(p for p, since in self._below_since.items()
                            if now - since < self.options.loss_confirm_ms)
        for p in sorted(waiting - self._told_below):
            log.warning("%s: waiting up to %d ms for it to come back (a leader election) "
                        "before taking it for records lost", loss.below[p],
                        self.options.loss_confirm_ms)
        self._told_below = waiting
        return loss.without(waiting)

    def lost(self, start: Mapping[str, Any], records: Mapping[str, Mapping[str, int]],
             latest: Offsets, ids: Mapping[str, str]) -> set[tuple[str, str]]:
        """The partitions whose records the broker lost, as of the topics' ``ids`` now."""
        loss = self.confirmed(find_loss(records, latest, start.get(TOPIC_IDS, {}), ids))
        if loss.why and self.options.fail_on_data_loss:
            raise SourceReadError(
                f"the broker no longer has records the checkpoint has read: "
                f"{'; '.join(loss.why)}. Start on a new checkpoint (txstream run "
                "--checkpoint-dir), or read these partitions again from the start (txstream "
                "run --no-fail-on-data-loss, the source's option fail_on_data_loss=false); "
                "either way the outcomes in the history topic are read back first."
            )
        for why in loss.why:
            log.warning("%s: reading it again from offset 0", why)
        return set(loss.partitions)


def read_past_loss(options: SourceOptions, part: TopicSlice
                   ) -> Iterator[ConsumerRecord | Unreadable]:
    """The records of ``part`` (:func:`~txstream.sources.kafka_io.read_slice`), skipping the
    rest of it only once the broker's answer that they are gone is confirmed: at once for a
    topic created again, else after ``loss_confirm_ms`` of asking (each read waits
    ``read_timeout_ms`` before it gives up), never while the leader is short of replicas."""
    waited = [0]
    watch = LossWatch(options, lambda: waited[0])
    key = (part.topic, str(part.partition))
    while True:
        try:
            for rec in read_slice(options, part):
                part = replace(part, start=rec.offset + 1)
                yield rec
            return
        except RecordsGone as gone:
            part = replace(part, start=gone.at)
            why = str(gone)
            loss = Loss(frozenset({key}), (why,), {} if gone.recreated else {key: why})
            if watch.confirmed(loss).partitions:
                log.warning("%s: records [%d, %d) are gone (fail_on_data_loss=false): skipped",
                            why, gone.at, part.end)
                return
            waited[0] += options.read_timeout_ms
