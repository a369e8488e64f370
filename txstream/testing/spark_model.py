"""What Spark does around the coordinator's code, reduced to the contract the code relies on.

Structured Streaming's micro-batch loop, as :mod:`txstream.streaming.engine.query` uses it:

- **planning**: the source's ``latestOffset(start, limit)`` on the driver; no batch when the
  offset did not move (no-data batches are off). The planned offsets, the batch's time and the
  watermark it runs with go to the offset log *before* the batch runs;
- **reading**: ``partitions(start, end)``, then ``read`` per partition by a fresh reader (as a
  worker does), Arrow batches in;
- **the watermark**: the maximum of the ``ends_read`` column of a batch becomes the watermark
  of the next one (never lower); it is kept with the batch, so a replay runs with the same;
- **the stateful operator**: rows grouped by ``state_key``; the function is called per key with
  data (rows in shuffle order, several frames), then per key whose processing-time timeout is
  before the batch's time (``T < batch_ms``) with none; each call gets a ``GroupState`` of the
  key's last committed state, with no timeout set (it must set one to keep one). With
  ``through_pandas=False`` the model calls the operator's step with the rows the pandas
  adapter would give it (the same columns, the same order) and takes its rows as they are,
  without a frame per key: what the simulation's long runs can afford; a test keeps both
  ways playing alike (``tests/sim/test_sim.py``);
- **the sink**: the outputs of each shuffle partition are one task of ``send_batches``, under a
  task context naming the run and the batch (the replay check reads them); the driver-side
  commit folds the timers; then the state and the batch commit together;
- **failure**: a crash anywhere loses the batch's state and leaves whatever its tasks wrote;
  the next run (a new run id, a new planner, empty client caches) replays the uncommitted
  batch with its logged offsets, time and watermark first.

A new checkpoint forgets everything but the topics.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
from pyspark.sql.types import BinaryType, Row, StructField, StructType
from pyspark.taskcontext import TaskContext

from txstream.schema import EventRow, Kind, OutputRow
from txstream.sinks.kafka_sink import KafkaRecordWriter, SinkCommit, SinkOptions, send_batches
from txstream.sources.event_rows import arrow_schema, event_struct
from txstream.sources.kafka_io import SourceOptions
from txstream.sources.kafka_source import KafkaEventReader
from txstream.state.keys import spark_partition
from txstream.streaming.engine.key_step import INPUT, KeyStep
from txstream.streaming.engine.operator import (
    call_step,
    columns_in_replay_order,
    output_columns,
    pandas_function,
)
from txstream.timer_schedule import Schedule

__all__ = ["SparkModel", "BatchReport", "SimCrash"]

_STATE = StructType([StructField("blob", BinaryType())])
_NO_TIMESTAMP = -1


class SimCrash(BaseException):
    """The simulated process dies here (a BaseException: no ``except Exception`` swallows it)."""


@dataclass
class LoggedBatch:
    """An entry of the offset log: what a batch reads, at what time, with which watermark."""

    start: dict[str, Any]
    end: dict[str, Any]
    batch_ms: int
    watermark: int


@dataclass
class BatchReport:
    """What a committed batch did: its rows in, the keys' metrics out, for the oracle."""

    batch: int
    batch_ms: int
    watermark: int
    replay: bool
    inputs: list[EventRow] = field(default_factory=list)
    timers: list[bytes] = field(default_factory=list)  # the keys' metrics summaries
    commits: list[SinkCommit] = field(default_factory=list)


def _output_schema() -> pa.Schema:
    fields = []
    kinds = {"string": pa.string(), "binary": pa.binary(), "bigint": pa.int64(),
             "int": pa.int32()}
    from txstream.schema import OUTPUT_COLUMNS

    for name, kind in OUTPUT_COLUMNS:
        fields.append(pa.field(name, kinds[kind]))
    return pa.schema(fields)


_OUTPUT_ARROW = _output_schema()


class SparkModel:
    """One coordinator query over a checkpoint, driven a step at a time."""

    def __init__(self, *, source: SourceOptions, sink: SinkOptions,
                 step_of: Callable[[], KeyStep], partitions: int, clock: Callable[[], int],
                 rng: random.Random, timer_file: Path, max_offsets: int | None,
                 through_pandas: bool = True) -> None:
        self.source = source
        self.sink = sink
        self._step_of = step_of
        self.through_pandas = through_pandas
        self.partitions = partitions
        self.clock = clock
        self.rng = rng
        self.timer_file = timer_file
        self.max_offsets = max_offsets
        self.schema = event_struct()
        self.arrow = arrow_schema(self.schema)
        # The checkpoint: the offset log, the last committed batch, the state it left.
        self.log: dict[int, LoggedBatch] = {}
        self.committed: int | None = None
        self.store: dict[int, tuple[bytes, int]] = {}  # key -> (state blob, timeout ms or -1)
        self.watermark = 0  # the watermark of the next batch
        self.runs = 0
        self._start_run()

    # --- runs and checkpoints ------------------------------------------------------------

    def _start_run(self) -> None:
        from txstream.kafka.clients import clear_cached_clients
        from txstream.kafka.patience import forget_patience
        from txstream.readback.release_index import forget_release_indexes

        clear_cached_clients()  # a new process: no client survives
        forget_patience()
        forget_release_indexes()
        self.runs += 1
        # Unique in the process: the replay check remembers runs by id (readback.replay).
        self.run_id = f"{self.source.kafka.bootstrap_servers}-run-{self.runs}"
        self.planner = KafkaEventReader(self.source, self.schema, clock=self.clock)
        self.initial: dict[str, Any] | None = None
        self.step_function = self._step_of()
        self.function = pandas_function(self.step_function)
        self.writer = KafkaRecordWriter(self.sink)
        self._restore_schedule()

    def restart(self) -> None:
        """The driver died and starts again on its checkpoint."""
        self._start_run()

    def fresh_checkpoint(self) -> None:
        """A new checkpoint over the same topics (its directory was lost or replaced)."""
        self.log.clear()
        self.committed = None
        self.store.clear()
        self.watermark = 0
        self.timer_file.unlink(missing_ok=True)
        self._start_run()

    def read_to(self, topic: str) -> dict[int, int]:
        """How far the last committed batch read ``topic``: {partition: next offset}."""
        if self.committed is None:
            return {}
        return {int(p): int(o) for p, o in self.log[self.committed].end.get(topic, {}).items()}

    def _restore_schedule(self) -> None:
        """``txstream.streaming.engine.timers.restore_schedule``: the file is a cache of the state's
        timeouts; one that does not reflect the last committed batch is rebuilt from them."""
        if self.committed is None:
            self.timer_file.unlink(missing_ok=True)
            return
        try:
            if Schedule.load(self.timer_file).batch == self.committed:
                return
        except (ValueError, KeyError, TypeError):
            pass
        Schedule({k: t for k, (_, t) in self.store.items() if t > 0}, self.committed).save(
            self.timer_file)

    # --- one micro-batch -----------------------------------------------------------------

    def step(self, crash_at: str | None = None) -> BatchReport | None:
        """Plan (or replay) the next batch and run it; None when there is nothing to run.
        ``crash_at``: "planned" (after the offset log), "written" (after the sink's tasks,
        before the commit): the process dies there."""
        batch = 0 if self.committed is None else self.committed + 1
        replay = batch in self.log
        if not replay:
            logged = self._plan()
            if logged is None:
                return None
            self.log[batch] = logged
        if crash_at == "planned":
            raise SimCrash("after planning")
        return self._run(batch, self.log[batch], replay, crash_at)

    def _plan(self) -> LoggedBatch | None:
        if self.committed is None:
            if self.initial is None:
                self.initial = self.planner.initialOffset()
            start = self.initial
        else:
            start = self.log[self.committed].end
        limit = ReadMaxRows(self.max_offsets) if self.max_offsets else ReadAllAvailable()
        end = self.planner.latestOffset(json.loads(json.dumps(start)), limit)
        if json.dumps(end, sort_keys=False) == json.dumps(start, sort_keys=False):
            return None
        return LoggedBatch(start, end, self.clock(), self.watermark)

    def _read(self, logged: LoggedBatch) -> pa.Table:
        parts = self.planner.partitions(logged.start, logged.end)
        batches: list[pa.RecordBatch] = []
        for part in parts:
            worker = KafkaEventReader(self.source, self.schema)
            batches.extend(worker.read(part))
        return pa.Table.from_batches(batches, schema=self.arrow)

    def _run(self, batch: int, logged: LoggedBatch, replay: bool,
             crash_at: str | None) -> BatchReport:
        table = self._read(logged)
        report = BatchReport(batch, logged.batch_ms, logged.watermark, replay)
        report.inputs = _event_rows(table)
        store = dict(self.store)
        outputs = self._operate(table, logged, store)
        report.timers = [row.value for row in _rows(outputs)
                         if row.kind == Kind.TIMER and row.value]
        report.commits = self._write(batch, outputs)
        if crash_at == "written":
            raise SimCrash("after the sink's writes")
        self.writer.commit(list(report.commits), batch)
        # The batch and its state commit together.
        self.store = store
        self.committed = batch
        ends = [r.ends_read for r in report.inputs if r.ends_read is not None]
        if ends:
            self.watermark = max(self.watermark, max(ends) // 1000)
        return report

    def _operate(self, table: pa.Table, logged: LoggedBatch,
                 store: dict[int, tuple[bytes, int]]) -> dict[int, _Output]:
        """The stateful operator: every key with rows, then every key timed out."""
        keys = table.column("state_key").to_pylist()
        by_key: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            by_key.setdefault(key, []).append(i)
        out: dict[int, _Output] = {}
        # As Spark converts: Arrow to pandas (the step's columns alone, converted alike).
        frame = table.to_pandas() if by_key and self.through_pandas else None
        columns = ([table.column(name).to_pandas().to_numpy() for name in INPUT]
                   if by_key and not self.through_pandas else [])
        for key in sorted(by_key):
            rows = by_key[key]
            self.rng.shuffle(rows)  # the shuffle's order: the operator must not depend on it
            parts = self._parts(rows)
            if self.through_pandas:
                frames = [frame.iloc[part].reset_index(drop=True) for part in parts]
                out[key] = self._call(key, frames, store, logged, False)
            else:
                taken = np.array(rows)  # the parts in their order, as the adapter joins them
                out[key] = self._call_step(key, columns_in_replay_order(
                    [column[taken] for column in columns]), store, logged, False)
        timed_out = sorted(k for k, (_, t) in store.items()
                           if k not in by_key and t != _NO_TIMESTAMP and t < logged.batch_ms)
        for key in timed_out:
            out[key] = (self._call(key, [], store, logged, True) if self.through_pandas
                        else self._call_step(key, (), store, logged, True))
        return out

    def _parts(self, rows: list[int]) -> list[list[int]]:
        cut = self.rng.randint(1, max(1, len(rows)))  # a key's rows may come in chunks
        parts = [rows[:cut], rows[cut:]] if cut < len(rows) else [rows]
        return [part for part in parts if part]

    def _state(self, key: int, store: dict[int, tuple[bytes, int]], logged: LoggedBatch,
               timed_out: bool) -> GroupState:
        blob = store.get(key, (None, _NO_TIMESTAMP))[0]
        return GroupState(
            optionalValue=Row(blob) if blob is not None else Row(),
            batchProcessingTimeMs=logged.batch_ms, eventTimeWatermarkMs=logged.watermark,
            timeoutConf=GroupStateTimeout.ProcessingTimeTimeout, hasTimedOut=timed_out,
            watermarkPresent=True, defined=blob is not None, updated=False, removed=False,
            timeoutTimestamp=_NO_TIMESTAMP, keyAsUnsafe=b"", valueSchema=_STATE)

    @staticmethod
    def _keep(key: int, state: GroupState, store: dict[int, tuple[bytes, int]]) -> None:
        """What Spark keeps of a call's ``GroupState``."""
        if state._removed:
            store.pop(key, None)
        elif state._updated:
            store[key] = (state._value[0], state._timeout_timestamp)
        elif key in store:
            store[key] = (store[key][0], state._timeout_timestamp)

    def _call(self, key: int, frames: list[pd.DataFrame], store: dict[int, tuple[bytes, int]],
              logged: LoggedBatch, timed_out: bool) -> list[pd.DataFrame]:
        state = self._state(key, store, logged, timed_out)
        frames_out = list(self.function((key,), iter(frames), state))
        self._keep(key, state, store)
        return frames_out

    def _call_step(self, key: int, rows: Iterable[tuple[Any, ...]],
                   store: dict[int, tuple[bytes, int]], logged: LoggedBatch,
                   timed_out: bool) -> list[OutputRow]:
        state = self._state(key, store, logged, timed_out)
        out = call_step(self.step_function, (key,), rows, state)
        self._keep(key, state, store)
        return out.rows

    def _write(self, batch: int, outputs: dict[int, _Output]) -> list[SinkCommit]:
        """Each shuffle partition's rows as one sink task, in Arrow as Spark hands them on."""
        parts: dict[int, list[Any]] = {}
        for key, out in outputs.items():
            parts.setdefault(spark_partition(key, self.partitions), []).extend(out)
        made = _record_batch if self.through_pandas else _record_batch_of_rows
        tasks = {partition: [made(out)] for partition, out in parts.items() if out}
        commits = []
        for partition in range(self.partitions):
            context = TaskContext._getOrCreate()
            context._attemptNumber = 0
            context._partitionId = partition  # each task's transactional id is its own
            context._localProperties = {"spark.jobGroup.id": self.run_id,
                                        "streaming.sql.batchId": str(batch)}
            try:
                commits.append(send_batches(self.sink, iter(tasks.get(partition, []))))
            finally:
                TaskContext._setTaskContext(None)  # type: ignore[arg-type]
        return commits


# A key's output: the frames the pandas function yielded, or the step's rows.
_Output = list[pd.DataFrame] | list[OutputRow]


def _rows(outputs: dict[int, _Output]) -> Iterator[OutputRow]:
    for out in outputs.values():
        for item in out:
            if isinstance(item, pd.DataFrame):
                yield from (OutputRow(*values) for values in item.itertuples(index=False))
            else:
                yield item


def _record_batch_of_rows(rows: list[OutputRow]) -> pa.RecordBatch:
    """A task's output rows as the Arrow batch :func:`_record_batch` makes of their frames."""
    return pa.RecordBatch.from_arrays(
        [pa.Array.from_pandas(column, type=field.type)
         for column, field in zip(output_columns(rows), _OUTPUT_ARROW, strict=True)],
        schema=_OUTPUT_ARROW)


def _record_batch(frames: list[pd.DataFrame]) -> pa.RecordBatch:
    """A task's output frames as one Arrow batch, the same batch PySpark's serializer makes
    (``pa.Array.from_pandas`` with the output schema's type). Each column's arrays are joined
    first and converted once: per frame and column it cost the simulation a tenth of its time."""
    frames = [frame for frame in frames if len(frame)]
    if not frames:
        return pa.RecordBatch.from_pylist([], schema=_OUTPUT_ARROW)
    columns = []
    for i, column in enumerate(_OUTPUT_ARROW):
        # The frame's own column arrays (numpy, or pandas' nullable IntegerArray), unboxed.
        parts = [frame._mgr.iget_values(i) for frame in frames]
        if len(parts) == 1:
            joined = parts[0]
        elif isinstance(parts[0], np.ndarray):
            joined = np.concatenate(parts)
        else:
            joined = type(parts[0])._concat_same_type(parts)
        columns.append(pa.Array.from_pandas(joined, type=column.type))
    return pa.RecordBatch.from_arrays(columns, schema=_OUTPUT_ARROW)


def _event_rows(table: pa.Table) -> list[EventRow]:
    """The batch's input rows, ``ends_read`` in microseconds as the source wrote it."""
    columns = [table.column(name).cast(pa.int64()) if name == "ends_read"
               else table.column(name) for name in EventRow._fields]
    return [EventRow(*values) for values in zip(*(c.to_pylist() for c in columns), strict=True)]
