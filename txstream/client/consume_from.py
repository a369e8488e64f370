"""Where a consumer group starts reading a partition it has no committed offset for: RocketMQ's
``ConsumeFromWhere``.

As in Java, it applies only to such partitions; a group resumes at its committed offsets.
Where it started is committed at once, so a consumer restarted before it consumed anything
resumes there too. The group's own retry topic is always read from its beginning (Java starts
``%RETRY%`` queues at 0 too): every record there is one of the group's unfinished messages.
Every assigned partition is positioned explicitly, at its committed offset too: kafka-python
keeps the position of a partition assigned again after a rebalance, past messages it fetched
that were never consumed.

A partition's last offset is its high watermark from a fetch (:class:`txstream.kafka.EndProbe`),
not ``ListOffsets``, which tansu answers wrongly for "latest". A timestamp is looked up with
the broker's ``offsets_for_times``, which Kafka answers by the records' timestamps. tansu
answers by when it stored them (the same for records sent as they were made, not for records
given an older timestamp), and answers a timestamp later than every record with offset 0 and
timestamp -1 instead of "none": an answer without a timestamp counts as none, and the
partition starts at its end, as Java's does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import NamedTuple

from txstream.errors import ConfigError
from txstream.kafka import Consumer, EndProbe, KafkaSettings, OffsetAndTimestamp, TopicPartition

__all__ = ["ConsumeFromWhere", "StartPositions", "Starts", "start_offsets"]


class ConsumeFromWhere(str, Enum):
    """RocketMQ's ``ConsumeFromWhere`` (its deprecated values left out)."""

    CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
    CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
    CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"

    @classmethod
    def of(cls, value: ConsumeFromWhere | str) -> ConsumeFromWhere:
        """``value`` (a member or its name); ConfigError if it is neither."""
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(w.value for w in cls)
            raise ConfigError(f"consume_from_where must be one of {names}, got {value!r}"
                              ) from None


def start_offsets(where: ConsumeFromWhere, tps: Iterable[TopicPartition],
                  ends: Mapping[TopicPartition, int],
                  found: Mapping[TopicPartition, OffsetAndTimestamp | None] | None = None
                  ) -> dict[TopicPartition, int]:
    """The offset each partition of ``tps`` (none committed) starts at. ``ends``: their last
    offsets; ``found``: ``offsets_for_times``' answers (timestamp mode). Empty for the first
    offset: the consumer reads from the beginning by itself."""
    if where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET:
        return {}
    out = {}
    for tp in tps:
        hit = (found or {}).get(tp) if where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP else None
        if hit is not None and hit.offset is not None and (hit.timestamp or 0) >= 0:
            out[tp] = min(hit.offset, ends[tp])
        else:
            out[tp] = ends[tp]
    return out


class Starts(NamedTuple):
    """Where newly assigned partitions start."""

    committed: dict[TopicPartition, int]  # the group's committed offsets: resume there
    chosen: dict[TopicPartition, int]  # none committed: start there (and commit it)
    beginning: list[TopicPartition]  # none committed: read from the beginning


class StartPositions:
    """Finds where newly assigned partitions start, on the consumer's polling thread (the
    lookups block). The last offsets come from a consumer of its own, outside the group."""

    def __init__(self, settings: KafkaSettings, where: ConsumeFromWhere, timestamp_ms: int,
                 *, role: str, timeout_s: float) -> None:
        self.where = where
        self.timestamp_ms = timestamp_ms
        self._timeout_s = timeout_s
        self._probe = EndProbe(settings, role=role)

    def starts(self, consumer: Consumer, tps: Iterable[TopicPartition], retry_topic: str
               ) -> Starts:
        """Where each of ``consumer``'s partitions ``tps`` starts."""
        committed = {tp: consumer.committed(tp) for tp in tps}
        fresh = [tp for tp, offset in committed.items() if offset is None]
        beginning = [tp for tp in fresh if tp.topic == retry_topic
                     or self.where is ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET]
        rest = [tp for tp in fresh if tp not in beginning]
        chosen = {}
        if rest:
            found = None
            if self.where is ConsumeFromWhere.CONSUME_FROM_TIMESTAMP:
                found = consumer.offsets_for_times({tp: self.timestamp_ms for tp in rest})
            chosen = start_offsets(self.where, rest, self._ends(rest), found)
        return Starts({tp: o for tp, o in committed.items() if o is not None}, chosen,
                      beginning)

    def _ends(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        ends = self._probe.ends(tps, {}, self._timeout_s)
        return {tp: ends[(tp.topic, tp.partition)] for tp in tps}

    def close(self) -> None:
        self._probe.close()
