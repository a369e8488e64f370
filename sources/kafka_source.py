"""The coordinator's input: the half and end topics as a Spark stream of ``EVENT_SCHEMA`` rows.

A Python data source (Spark's Kafka connector cannot be fetched here), ``txstream-events``::

    register(spark)
    events = (spark.readStream.format("txstream-events")
              .option("kafka", json.dumps(settings.as_dict()))
              .option("half_topic", topics.half).option("end_topic", topics.end)
              .load())

Options (strings, as Spark passes them):

- ``kafka`` (required): JSON of ``KafkaSettings.as_dict()``.
- ``half_topic`` / ``end_topic``: default RocketMQ's names; created with ``topic_partitions``
  partitions (default 2) if missing and the broker creates topics (txstream.kafka.provision).
- ``max_offsets_per_trigger``: records per micro-batch, spread fairly over the partitions.
- ``key_layout``: JSON of ``state.keys.KeyLayout.as_dict()``: how records map to state keys.
- ``read_timeout_ms`` (30000): a partition that delivers nothing for this long fails the task.
- ``fail_on_data_loss`` (true): fail when a partition ends below the checkpoint (the broker lost
  records); false reads such a partition again from offset 0.
- ``read_tasks`` (2): Spark tasks per micro-batch; the topic-partitions are grouped into them.
- ``check_crcs`` (true): kafka-python's record CRC check, pure Python unless ``crc32c`` is
  installed.
- ``timer_file``: the coordinator's timer schedule (:mod:`txstream.timer_schedule`). With it
  the offset also holds a tick, ``"_tick": {"at": ms, "known": 1}``, moved when a timer is due,
  so that Spark runs a batch for it with its no-data batches off.

The stream offset is ``{topic: {str(partition): next_offset}}``, so a restart from the
checkpoint reads exactly the records after the last committed batch. End offsets come from
the fetch high watermark: tansu answers ``ListOffsets`` wrongly.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sources.event_rows import arrow_schema, record_row, rows_to_batch, unreadable_row
from sources.kafka_io import (
    ROWS_PER_BATCH,
    SliceGroup,
    SourceOptions,
    SourceReadError,
    TopicSlice,
    Unreadable,
    consumer_for,
    drop_consumer,
    group_slices,
    high_watermarks,
    read_slice,
)
from txstream.kafka.provision import create_command, ensure_topics, topic_spec
from txstream.schema import EVENT_SCHEMA, EventRow
from txstream.spark_worker import quiet_hang_up, settle
from txstream.timer_schedule import TICK, Schedule, next_tick
from txstream.topics import HALF_TOPIC, Topics

__all__ = [
    "SOURCE_NAME",
    "Offsets",
    "SourceOptions",
    "SourceReadError",
    "TopicSlice",
    "SliceGroup",
    "KafkaEventSource",
    "KafkaEventReader",
    "spread_budget",
    "register",
]

log = logging.getLogger(__name__)

SOURCE_NAME = "txstream-events"

# {topic: {str(partition): next offset to read}}: JSON-able, as Spark stores it in the checkpoint.
Offsets = dict[str, dict[str, int]]


# --- offsets ---------------------------------------------------------------------------------


def spread_budget(available: Sequence[int], budget: int) -> list[int]:
    """Split ``budget`` rows over partitions with ``available`` rows each, max-min fairly.

    Every partition gets an equal share, a partition needing less gives the rest back to the
    others; rows left over after the even split go to the partitions furthest behind, so a
    budget smaller than the number of partitions still reaches every partition in turn.
    """
    take = [0] * len(available)
    left = max(0, budget)
    active = [i for i, a in enumerate(available) if a > 0]
    while left > 0 and active:
        share = left // len(active)
        if share == 0:
            behind = sorted(active, key=lambda i: (take[i] - available[i], i))
            for i in behind[:left]:
                take[i] += 1
            break
        for i in active:
            add = min(share, available[i] - take[i])
            take[i] += add
            left -= add
        active = [i for i in active if take[i] < available[i]]
    return take


def _canonical(offsets: Mapping[str, Mapping[str, int]], topics: Sequence[str],
               tick: Mapping[str, int] | None = None) -> Offsets:
    # Spark compares offsets as JSON text: one key order, always, or "no new data" looks new.
    out: Offsets = {}
    for topic in topics:
        parts = offsets.get(topic, {})
        out[topic] = {p: int(parts[p]) for p in sorted(parts, key=int)}
    if tick is not None:
        out[TICK] = {"at": int(tick["at"]), "known": int(tick["known"])}
    return out


def _records(offsets: Mapping[str, Mapping[str, int]]) -> dict[str, Mapping[str, int]]:
    """The topic-partition offsets, without the tick."""
    return {topic: parts for topic, parts in offsets.items() if topic != TICK}


class KafkaEventReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from high watermarks (driver side) and reads them (workers)."""

    # How often the partition lists are re-read, to pick up partitions added to a topic.
    PARTITION_REFRESH_S = 10.0

    def __init__(self, options: SourceOptions, schema: Any) -> None:
        # Workers construct a reader just to call read(): nothing here may touch Kafka.
        self.options = options
        self.schema = schema
        self._partitions: dict[str, list[int]] = {}
        self._partitions_at = 0.0
        self._known_end: dict[tuple[str, int], int] = {}
        self._target: Offsets | None = None  # Trigger.AvailableNow: do not read past this
        self._schedule: tuple[Any, Schedule] | None = None  # (the file's identity, schedule)

    # --- driver side ---------------------------------------------------------------------

    def _create_topics(self, missing: Sequence[str]) -> None:
        """Create the missing half/end topics by the coordinator's rule (the provisioning
        module's, which ``Coordinator.start`` applied already; here for queries started
        without it)."""
        kinds = {self.options.half_topic: "half", self.options.end_topic: "end"}
        half = self.options.half_topic
        prefix = half[:-len(HALF_TOPIC)] if half.endswith(HALF_TOPIC) else ""
        specs = [topic_spec(kinds[t], t, readers=("coordinator",),
                            partitions=self.options.topic_partitions) for t in missing]
        ensure_topics(self.options.kafka, specs,
                      create_command(self.options.kafka, Topics.with_prefix(prefix)))

    def _topic_partitions(self) -> dict[str, list[int]]:
        """The partitions of both topics (created if missing), re-read every few seconds."""
        now = time.monotonic()
        if self._partitions and now - self._partitions_at < self.PARTITION_REFRESH_S:
            return self._partitions
        consumer = consumer_for(self.options, "offsets")
        consumer.topics()  # a fresh metadata request: the cached one may predate new partitions
        missing = [t for t in self.options.topics if not consumer.partitions_for_topic(t)]
        if missing:
            self._create_topics(missing)
        deadline = now + self.options.read_timeout_ms / 1000
        found: dict[str, list[int]] = {}
        for topic in self.options.topics:
            parts = consumer.partitions_for_topic(topic)
            while not parts and time.monotonic() < deadline:
                time.sleep(0.05)  # a topic just created may take a moment to show in metadata
                consumer.topics()
                parts = consumer.partitions_for_topic(topic)
            if not parts:
                raise SourceReadError(f"topic {topic} has no partitions in the broker metadata")
            found[topic] = sorted(parts)
        self._partitions, self._partitions_at = found, now
        return found

    def _high_watermarks(self, start: Mapping[str, Mapping[str, int]]) -> Offsets:
        parts = self._topic_partitions()
        hints = {
            (t, p): max(int(start.get(t, {}).get(str(p), 0)), self._known_end.get((t, p), 0))
            for t, ps in parts.items() for p in ps
        }
        self._known_end = high_watermarks(self.options, parts, hints)
        out: Offsets = {t: {} for t in parts}
        for (topic, partition), hw in self._known_end.items():
            out[topic][str(partition)] = hw
        return _canonical(out, self.options.topics)

    def initialOffset(self) -> dict:
        parts = self._topic_partitions()
        tick = {"at": 0, "known": 1} if self.options.timer_file else None
        return _canonical({t: {str(p): 0 for p in ps} for t, ps in parts.items()},
                          self.options.topics, tick)

    def _timers(self) -> Schedule:
        """The schedule file, parsed again only when it changed (Spark asks every 10 ms)."""
        assert self.options.timer_file
        try:
            stat = os.stat(self.options.timer_file)
        except FileNotFoundError:
            return Schedule()  # no batch committed yet
        # Each save is a new file (an atomic replace): a new inode, whatever the clock's grain.
        identity = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if self._schedule is None or self._schedule[0] != identity:
            self._schedule = (identity, Schedule.load(Path(self.options.timer_file)))
        return self._schedule[1]

    def _tick(self, start: Mapping[str, Any]) -> Mapping[str, int] | None:
        """The tick of the next offset: moved when a timer is due, else the start's."""
        if not self.options.timer_file:
            return None
        last = start.get(TICK)
        if self._target is not None:  # Trigger.AvailableNow ends once the input is read
            return last
        now = int(time.time() * 1000)
        due = next_tick(last, self._timers() if last is not None else None, now)
        return due if due is not None else last

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._high_watermarks(_canonical({}, self.options.topics))

    def _lost(
        self, start: Mapping[str, Mapping[str, int]], latest: Offsets
    ) -> set[tuple[str, str]]:
        """Partitions whose end is below the checkpoint: the broker lost records."""
        lost = {(t, p) for t, ps in latest.items() for p, end in ps.items()
                if end < int(start.get(t, {}).get(p, 0))}
        if lost and self.options.fail_on_data_loss:
            where = ", ".join(f"{t}/{p} (end {latest[t][p]}, checkpoint {start[t][p]})"
                              for t, p in sorted(lost))
            raise SourceReadError(
                f"the broker has fewer records than the checkpoint has read: {where}. Records "
                "were lost (a broker with memory storage restarted?). Use a new checkpoint, or "
                "set fail_on_data_loss=false to read these partitions again from the start."
            )
        for t, p in sorted(lost):
            log.warning("%s/%s: end offset %d is below the checkpoint's %s; reading it again "
                        "from offset 0", t, p, latest[t][p], start[t][p])
        return lost

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        tick = self._tick(start)
        start = _records(start)
        latest = self._high_watermarks(start)
        lost = self._lost(start, latest)
        if self._target is not None:
            latest = {t: {p: min(o, self._target.get(t, {}).get(p, 0)) for p, o in ps.items()}
                      for t, ps in latest.items()}
        keys: list[tuple[str, str]] = []
        begin: list[int] = []
        avail: list[int] = []
        for topic, parts in latest.items():
            for p, end in parts.items():
                # A partition the checkpoint does not know is new: read it from its start.
                s = int(start.get(topic, {}).get(p, 0))
                keys.append((topic, p))
                begin.append(s)
                avail.append(max(0, end - s))
        if isinstance(limit, ReadMaxRows):
            avail = spread_budget(avail, limit.max_rows)
        out: dict[str, dict[str, int]] = {t: dict(ps) for t, ps in start.items()}
        for (topic, p), s, n in zip(keys, begin, avail, strict=True):
            # A lost partition ends this batch at 0, so the next one reads the new log whole.
            out.setdefault(topic, {})[p] = 0 if (topic, p) in lost else s + n
        return _canonical(out, list(dict.fromkeys([*self.options.topics, *out])), tick)

    def reportLatestOffset(self) -> dict | None:
        if not self._known_end:
            return None
        out: Offsets = {}
        for (topic, partition), hw in self._known_end.items():
            out.setdefault(topic, {})[str(partition)] = hw
        return _canonical(out, self.options.topics)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        slices = []
        for topic, parts in _records(end).items():
            for p, stop in parts.items():
                begin = int(start.get(topic, {}).get(p, 0))
                if stop > begin:
                    slices.append(TopicSlice(topic, int(p), begin, int(stop),
                                             topic == self.options.half_topic))
        return group_slices(slices, self.options.read_tasks)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        """The query stopped: pyspark's planner process, which this reader runs in, ends now.
        Its runner then reports the closed socket it was reading (an EOFError, then a
        BrokenPipeError writing that to the JVM that is gone) as tracebacks on its stderr, the
        terminal of whoever stopped the coordinator. A stop is no error: say nothing."""
        drop_consumer(self.options, "offsets")
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    # --- worker side ---------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        settle()
        parts = partition.slices if isinstance(partition, SliceGroup) else (partition,)
        schema = arrow_schema(self.schema)
        layout = self.options.key_layout
        rows: list[EventRow] = []
        for part in parts:
            assert isinstance(part, TopicSlice)
            for rec in read_slice(self.options, part):
                if isinstance(rec, Unreadable):
                    row = unreadable_row(part.is_half, rec.partition, rec.offset, rec.error)
                else:
                    row = record_row(part.is_half, rec.key, rec.value, rec.headers,
                                     rec.partition, rec.offset, layout, rec.timestamp)
                rows.append(row)
                if len(rows) >= ROWS_PER_BATCH:
                    yield rows_to_batch(rows, schema)
                    rows = []
        if rows:
            yield rows_to_batch(rows, schema)


class KafkaEventSource(DataSource):
    """``txstream-events``: the half and end topics as ``EVENT_SCHEMA`` rows."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return EVENT_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        settle()
        quiet_hang_up()  # called in the planner's own process, which a query's stop ends
        return KafkaEventReader(SourceOptions.parse(self.options), schema)


def register(spark: Any) -> None:
    """Register ``txstream-events`` and ``txstream-records`` on ``spark`` (per session)."""
    from sinks.kafka_sink import KafkaRecordSink

    spark.dataSource.register(KafkaEventSource)
    spark.dataSource.register(KafkaRecordSink)
