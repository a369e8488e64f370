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
- ``key_layout``: JSON of ``txstream.state.keys.KeyLayout.as_dict()``: how records map to state
keys.
- ``read_timeout_ms`` (30000): a partition that delivers nothing for this long fails the task.
- ``fail_on_data_loss`` (true): fail when the broker lost records the checkpoint has read (a
  partition ends below the checkpoint, or its topic was deleted and created again:
  :mod:`txstream.sources.data_loss`); false reads such partitions again from offset 0, after a
  recovery from ``journal_topic``.
- ``read_tasks`` (2): Spark tasks per micro-batch; the topic-partitions are grouped into them.
- ``check_crcs`` (true): kafka-python's record CRC check, pure Python unless ``crc32c`` is
  installed.
- ``timer_file``: the coordinator's timer schedule (:mod:`txstream.timer_schedule`). With it
  the offset also holds a tick, ``"_tick": {"at": ms, "known": 1}``, moved when a timer is due,
  so that Spark runs a batch for it with its no-data batches off.
- ``journal_topic``: the history topic. A new checkpoint over half and end topics that hold
  records reads the outcomes it holds first (:mod:`txstream.sources.journal`).

The stream offset is ``{topic: {str(partition): next_offset}}``
(:mod:`txstream.sources.offsets`), so a restart from the checkpoint reads exactly the records
after the last committed batch; with the tick, the progress time (every batch carries a
PROGRESS row of it: :mod:`txstream.sources.progress`) and a recovery in progress. End offsets
come from the fetch high watermark: tansu answers ``ListOffsets`` wrongly.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from txstream.kafka.partition_health import troubles_of
from txstream.schema import EVENT_SCHEMA, EventKind, EventRow
from txstream.sources.data_loss import TOPIC_IDS
from txstream.sources.event_rows import (
    arrow_schema,
    progress_row,
    record_row,
    rows_to_batch,
    unreadable_row,
)
from txstream.sources.idle import idle_wait_ms
from txstream.sources.journal import JOURNAL, Journal, outcome_rows
from txstream.sources.kafka_io import (
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
    metadata_calls,
)
from txstream.sources.loss_watch import LossWatch, read_past_loss
from txstream.sources.offsets import Offsets, canonical, records_of, spread_budget
from txstream.sources.progress import ENDS_READ, ProgressClock
from txstream.sources.topic_watch import TopicWatch
from txstream.spark_worker import quiet_hang_up, settle
from txstream.timer_schedule import TICK, Schedule, next_tick

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
]

log = logging.getLogger(__name__)

SOURCE_NAME = "txstream-events"



class KafkaEventReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches from high watermarks (driver side) and reads them (workers)."""

    def __init__(self, options: SourceOptions, schema: Any,
                 clock: Callable[[], int] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        # Workers construct a reader just to call read(): nothing here may touch Kafka.
        self.options = options
        self.schema = schema
        # The driver's clock (ms): the tick's and the progress time's (a simulation gives its own).
        self._clock = clock or (lambda: int(time.time() * 1000))
        self._topics = TopicWatch(options, self._clock)
        self._known_end: dict[tuple[str, int], int] = {}
        self._target: Offsets | None = None  # Trigger.AvailableNow: do not read past this
        self._schedule: tuple[Any, Schedule] | None = None  # (the file's identity, schedule)
        self._progress = ProgressClock()
        self._sleep = sleep
        self._quiet_since: int | None = None  # since when latestOffset found nothing new
        self._loss = LossWatch(options, self._clock)

    # --- driver side ---------------------------------------------------------------------

    def _high_watermarks(self, start: Mapping[str, Mapping[str, int]]) -> Offsets:
        started, listed = self._clock(), self._topics.listed_at
        with metadata_calls(self.options):
            parts = self._topics.partitions()
        hints = {
            (t, p): max(int(start.get(t, {}).get(str(p), 0)), self._known_end.get((t, p), 0))
            for t, ps in parts.items() for p in ps
        }
        # A partition gone (its topic re-created with fewer) has no end: nothing moves there.
        known, self._known_end = self._known_end, high_watermarks(self.options, parts, hints)
        if known and known != self._known_end and self._topics.listed_at == listed:
            self._topics.refresh_ids()  # (a listing just now read them already)
        # Both topics: a held end event expires only once the half topic is read past when it
        # was held, as a discard waits for the end topic (sources.progress).
        self._progress.observed(started, dict(self._known_end))
        out: Offsets = {t: {} for t in parts}
        for (topic, partition), hw in self._known_end.items():
            out[topic][str(partition)] = hw
        return canonical(out, self.options.topics)

    def _journal_ends(self) -> dict[int, int]:
        """The history topic's end offsets ({} without one, or when it does not exist)."""
        topic = self.options.journal_topic
        if topic is None:
            return {}
        consumer = consumer_for(self.options, "offsets")
        consumer.topics()
        parts = sorted(consumer.partitions_for_topic(topic) or ())
        if not parts:
            return {}
        ends = high_watermarks(self.options, {topic: parts}, {})
        return {p: end for (_, p), end in ends.items()}

    def _recovery(self, why: str, half_ends: Mapping[int, int]) -> Journal | None:
        """A recovery of what the history topic says was decided, before the half and end
        topics are read again (:mod:`txstream.sources.journal`); ``half_ends``: the half
        topic's partitions read again, and where they end now."""
        journal = Journal.starting(self._journal_ends(), half_ends)
        if journal is not None:
            log.warning("%s: reading back the outcomes in %s (%d records) before the half and "
                        "end topics, so that nothing decided is decided again", why,
                        self.options.journal_topic, sum(journal.to.values()))
        return journal

    def initialOffset(self) -> dict[str, Any]:
        parts = self._topics.partitions()
        # The half messages below the half topic's ends are marked as read again (0029): a
        # partition whose leader is short of in-sync replicas may end short of what it holds
        # (Kafka 4, KIP-966), and those would go unmarked.
        if stalled := troubles_of(self.options.kafka, [self.options.half_topic]):
            raise SourceReadError(
                f"a new checkpoint begins where the half topic ends, and "
                f"{'; '.join(map(str, stalled.values()))}: such a partition may end short of "
                f"records it holds; the query starts once its replicas are back")
        tick = {"at": 0, "known": 1} if self.options.timer_file else None
        ends = records_of(self._high_watermarks({}))
        half_ends = {int(p): hw for p, hw in ends.get(self.options.half_topic, {}).items()}
        # Whatever the half and end topics hold: emptied (retention, a topic created again),
        # an end event still to come must meet the outcome the history remembers.
        journal = self._recovery("a new checkpoint over a history topic that holds records",
                                 half_ends)
        return canonical({t: {str(p): 0 for p in ps} for t, ps in parts.items()},
                         self.options.topics, tick, 0, journal.entry() if journal else None,
                         self._topics.ids)

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
        now = self._clock()
        due = next_tick(last, self._timers() if last is not None else None, now)
        return due if due is not None else last

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._high_watermarks(canonical({}, self.options.topics))

    def _wait_if_quiet(self, start: Mapping[str, Any]) -> None:
        """Wait before asking the broker once the input has been quiet (sources.idle)."""
        if not self.options.idle_wait_ms or self._target is not None:
            return
        last = start.get(TICK)
        due = (self._timers().next_due(last.get("at", 0))
               if self.options.timer_file and last is not None else None)
        wait = idle_wait_ms(self._quiet_since, due, self._clock(), self.options.idle_wait_ms)
        if wait:
            self._sleep(wait / 1000)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._wait_if_quiet(start)
        tick = self._tick(start)
        journal = Journal.of(start.get(JOURNAL))
        ends_read = int(start.get(ENDS_READ, {}).get("at", 0))
        records = records_of(start)
        latest = self._high_watermarks(records)
        lost = self._loss.lost(start, records, latest, self._topics.ids)
        ids = self._topics.ids_of(start)
        if lost and self.options.journal_topic is not None:
            half_ends = {int(p): int(latest[t][p]) for t, p in lost
                         if t == self.options.half_topic and p in latest.get(t, {})}
            journal = (self._recovery("partitions read again from their start", half_ends)
                       or journal)
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if journal is not None and not journal.done:
            # Recovering: the history topic is read first; nothing else moves (a lost
            # partition goes back to 0, to be read whole once the recovery is done).
            held = {t: {p: 0 if (t, p) in lost else o for p, o in ps.items()}
                    for t, ps in records.items()}
            self._quiet_since = None  # each step of the recovery is a batch to run at once
            return canonical(held, self._topic_order(held), tick, ends_read,
                             journal.step(budget).entry(), ids)
        out = self._planned(records, latest, lost, budget)
        moved = records_of(canonical(out, self._topic_order(out))) != records_of(
            canonical(records, self._topic_order(records))) or tick != start.get(TICK)
        if moved:
            self._quiet_since = None
            planned = {(t, int(p)): o for t in self.options.topics
                       for p, o in out.get(t, {}).items()}
            ends_read = self._progress.progress(planned, ends_read)
            self._progress.planned(ends_read)
        elif self._quiet_since is None:
            self._quiet_since = self._clock()
        return canonical(out, self._topic_order(out), tick, ends_read,
                         journal.entry() if journal else None, ids)

    def _topic_order(self, offsets: Mapping[str, Any]) -> list[str]:
        return list(dict.fromkeys([*self.options.topics, *offsets]))

    def _planned(self, start: Mapping[str, Mapping[str, int]], latest: Offsets,
                 lost: set[tuple[str, str]], budget: int | None) -> dict[str, dict[str, int]]:
        """The end offsets of the next batch: everything available, or ``budget`` records
        spread fairly over the partitions."""
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
        if budget is not None:
            avail = spread_budget(avail, budget)
        # A lost partition (one its re-created topic no longer has too) starts over at 0.
        out: dict[str, dict[str, int]] = {t: {p: 0 if (t, p) in lost else o
                                              for p, o in ps.items()}
                                          for t, ps in start.items()}
        for (topic, p), s, n in zip(keys, begin, avail, strict=True):
            # A lost partition ends this batch at 0, so the next one reads the new log whole.
            out.setdefault(topic, {})[p] = 0 if (topic, p) in lost else s + n
        return out

    def reportLatestOffset(self) -> dict[str, Any] | None:
        if not self._known_end:
            return None
        out: Offsets = {}
        for (topic, partition), hw in self._known_end.items():
            out.setdefault(topic, {})[str(partition)] = hw
        return canonical(out, self.options.topics)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]
                   ) -> Sequence[InputPartition]:
        self._topics.same_topics(end)
        slices = []
        journal = Journal.of(end.get(JOURNAL))
        again = journal.again if journal is not None else {}
        planned_ids = end.get(TOPIC_IDS) or {}
        for topic, parts in records_of(end).items():
            half = topic == self.options.half_topic
            kind = EventKind.HALF if half else EventKind.END
            for p, stop in parts.items():
                begin = int(start.get(topic, {}).get(p, 0))
                if stop > begin:
                    slices.append(TopicSlice(topic, int(p), begin, int(stop), kind,
                                             again.get(int(p), 0) if half else 0,
                                             planned_ids.get(topic)))
        if journal is not None and self.options.journal_topic is not None:
            for partition, begin, stop in journal.ranges(Journal.of(start.get(JOURNAL))):
                slices.append(TopicSlice(self.options.journal_topic, partition, begin, stop,
                                         EventKind.OUTCOME))
        groups = group_slices(slices, self.options.read_tasks)
        if ENDS_READ not in end:
            return groups
        # Every batch carries one progress row: the watermark's only source.
        ends_read = int(end[ENDS_READ]["at"])
        first = groups[0].slices if groups else ()
        return [SliceGroup(first, ends_read), *groups[1:]]

    def commit(self, end: dict[str, Any]) -> None:
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
        rows: list[EventRow] = []
        for part in parts:
            assert isinstance(part, TopicSlice)
            for row in self._rows(part):
                rows.append(row)
                if len(rows) >= ROWS_PER_BATCH:
                    yield rows_to_batch(rows, schema)
                    rows = []
        if isinstance(partition, SliceGroup) and partition.ends_read is not None:
            rows.append(progress_row(partition.ends_read))
        if rows:
            yield rows_to_batch(rows, schema)

    def _rows(self, part: TopicSlice) -> Iterator[EventRow]:
        layout = self.options.key_layout
        if part.kind == EventKind.OUTCOME:
            yield from outcome_rows((r for r in read_past_loss(self.options, part)
                                     if not isinstance(r, Unreadable)), layout)
            return
        is_half = part.kind == EventKind.HALF
        for rec in read_past_loss(self.options, part):
            if isinstance(rec, Unreadable):
                yield unreadable_row(is_half, rec.partition, rec.offset, rec.error)
            else:
                yield record_row(is_half, rec.key, rec.value, rec.headers, rec.partition,
                                 rec.offset, layout, rec.timestamp,
                                 read_again=rec.offset < part.again_below)


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

