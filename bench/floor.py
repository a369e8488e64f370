"""The floor phase: Spark's own cost of a micro-batch of this design's shape, with no txstream.

Two trivial stateful queries in the benchmark's session (same JVM, same settings). ``floor``:
Spark's built-in ``rate-micro-batch`` source, which gives every batch the same number of rows
and so runs them back to back as the coordinator does under load (two rows per offered
transaction, a half message and its end, as many per batch as the coordinator's batches
carried), grouped by as many keys as the coordinator has buckets, ``applyInPandasWithState``
with a processing-time timeout and a function that only counts, and Spark's ``noop`` sink.
``floor_python_io``: the same between a Python data source and sink that read and write
nothing but the rows: pyspark's Python data source API, which txstream's source and sink use
(Spark's Kafka connector cannot be fetched here).

What they cost per batch is what Spark and pyspark cost before any of txstream's code runs:
the driver's planning and logs, the shuffle, the state store, the Python hand-overs of the
stateful operator, and of the source and sink. Set beside the ceiling's and the coordinator's
batches at the same rate (``fixed_cost`` in the JSON), they split a near-empty batch's time
into Spark's own, pyspark's Python I/O, txstream's Kafka I/O (the ceiling less
``floor_python_io``) and txstream's core (the coordinator less the ceiling).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)

from bench.batches import Batch, BatchLog, parts_p50, percentile
from bench.cpu import CpuMeter
from bench.harness import logged_session
from txstream.streaming.engine.config import RunConfig

__all__ = ["FloorResult", "Span", "measure_floor", "measure_span", "floor_result",
           "count_rows", "RowsSource", "NothingSink", "batch_cost", "rows_per_batch",
           "first_batch_ms", "WARM_UP_S", "BATCH_S", "MIN_BATCHES", "MAX_EXTRA_S"]

WARM_UP_S = 20.0  # the floor query's first batches: JIT, Python workers, first plans
MIN_BATCHES = 2  # a floor measured over fewer batches says nothing
MAX_EXTRA_S = 60.0
BATCH_S = 0.4  # a batch's length when no coordinator ran to measure it (its low-rate p50)


@dataclass(frozen=True)
class FloorResult:
    rows_per_batch: int
    seconds: float
    batches: int
    batch_ms_p50: float | None
    batch_parts_ms_p50: dict[str, float | None]
    cores: float | None  # the machine's, while the floor query ran alone
    cpu_ms_per_batch: float | None
    # The query's first batch: a new query's planning, and Python processes the first time.
    first_batch_ms: int | None = None


def count_rows(key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
           ) -> Iterator[pd.DataFrame]:
    rows = sum(len(frame) for frame in frames)
    if not state.hasTimedOut:
        state.update((rows,))
        state.setTimeoutDuration(60_000)
    yield pd.DataFrame({"k": [key[0]], "rows": [rows]})


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start, self.end = start, end


class _RowsReader(DataSourceStreamReader):
    """``rows`` numbered rows a batch, in two tasks, as txstream's source plans two."""

    def __init__(self, rows: int, keys: int) -> None:
        self.rows, self.keys, self.end = rows, keys, 0

    def initialOffset(self) -> dict:
        return {"n": 0}

    def latestOffset(self) -> dict:
        self.end += self.rows
        return {"n": self.end}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        middle = (start["n"] + end["n"]) // 2
        return [_Range(start["n"], middle), _Range(middle, end["n"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[int, str]]:
        assert isinstance(partition, _Range)
        for i in range(partition.start, partition.end):
            yield i, str(i % self.keys)

    def commit(self, end: dict) -> None:
        pass


class RowsSource(DataSource):
    """``bench-rows``: pyspark's Python source API with no I/O (options rows, keys)."""

    @classmethod
    def name(cls) -> str:
        return "bench-rows"

    def schema(self) -> str:
        return "value long, k string"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _RowsReader(int(self.options["rows"]), int(self.options["keys"]))


class _NothingWriter(DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class NothingSink(DataSource):
    """``bench-nothing``: pyspark's Python sink API that takes the rows and writes nothing."""

    @classmethod
    def name(cls) -> str:
        return "bench-nothing"

    def schema(self) -> str:
        return "k string, rows long"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return _NothingWriter()


def _start(spark: Any, config: RunConfig, rows_per_batch: int, checkpoint: str,
           name: str, python_source: bool, python_sink: bool) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    spark.dataSource.register(RowsSource)
    spark.dataSource.register(NothingSink)
    if python_source:
        keyed = (spark.readStream.format(RowsSource.name()).option("rows", rows_per_batch)
                 .option("keys", config.buckets).load())
    else:
        keyed = (spark.readStream.format("rate-micro-batch")
                 .option("rowsPerBatch", rows_per_batch).load()
                 .withColumn("k", (F.col("value") % config.buckets).cast("string")))
    counted = keyed.groupBy("k").applyInPandasWithState(
        count_rows, "k string, rows long", "rows long", "append",
        GroupStateTimeout.ProcessingTimeTimeout)
    sink = NothingSink.name() if python_sink else "noop"
    return (counted.writeStream.format(sink).outputMode("append").queryName(name)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime=f"{config.trigger_ms} milliseconds").start())


def batch_cost(cores: float | None, span_s: float, batches: int) -> float | None:
    """CPU milliseconds per micro-batch, from the cores busy over a span of ``batches``."""
    if cores is None or batches <= 0:
        return None
    return round(cores * span_s * 1000 / batches, 1)


def rows_per_batch(tx_per_s: float, batches_per_s: float | None) -> int:
    """The rows a batch carries at ``tx_per_s`` (a half message and an end each), at the
    coordinator's measured batches per second, else at a batch of :data:`BATCH_S`."""
    per_batch = 1 / batches_per_s if batches_per_s else BATCH_S
    return max(1, round(2 * tx_per_s * per_batch))


def measure_floor(config: RunConfig, rows: int, seconds: float, meter: CpuMeter, *,
                  python_source: bool = False, python_sink: bool = False) -> FloorResult:
    """Run the floor query with ``rows`` per batch for a warm-up (``WARM_UP_S``, or
    ``seconds`` if shorter), then ``seconds``; ``python_source``, ``python_sink``: the Python
    source, sink that do no I/O instead of Spark's built-in ones."""
    spark, log = logged_session(config)
    name = f"bench-floor-{uuid.uuid4().hex[:6]}"
    checkpoint = tempfile.mkdtemp(prefix="txstream-bench-floor-")
    query = _start(spark, config, rows, checkpoint, name, python_source, python_sink)
    return floor_result(rows, seconds, measure_span(query, log, name, seconds, checkpoint),
                        meter)


@dataclass(frozen=True)
class Span:
    """What a floor query did over its measured span."""

    batches: list[Batch]
    start_ms: float
    end_ms: float
    first_batch_ms: int | None


def measure_span(query: Any, log: BatchLog, name: str, seconds: float,
                 checkpoint: str) -> Span:
    """Let ``query`` warm up (``WARM_UP_S``, or ``seconds`` if shorter), measure ``seconds``,
    then stop it and remove its checkpoint."""
    try:
        time.sleep(min(WARM_UP_S, seconds))
        mark, start_ms = log.mark(), time.time() * 1000
        time.sleep(seconds)
        # A span shorter than its batches (a short run on a busy machine) would measure
        # nothing: it lasts until MIN_BATCHES have ended, for at most MAX_EXTRA_S more.
        batches: list[Batch] = log.of(name, mark)
        extra_until = time.monotonic() + MAX_EXTRA_S
        while len(batches) < MIN_BATCHES and time.monotonic() < extra_until:
            time.sleep(0.5)
            batches = log.of(name, mark)
        return Span(batches, start_ms, time.time() * 1000, first_batch_ms(log.of(name)))
    finally:
        query.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


def floor_result(rows: int, seconds: float, span: Span, meter: CpuMeter) -> FloorResult:
    use = meter.use(span.start_ms, span.end_ms, 0)
    cores = use["cores"] if use else None
    batches = span.batches
    return FloorResult(
        rows_per_batch=rows, seconds=seconds, batches=len(batches),
        batch_ms_p50=percentile([b.duration_ms for b in batches], 0.5),
        batch_parts_ms_p50=parts_p50(batches), cores=cores,
        cpu_ms_per_batch=batch_cost(cores, (span.end_ms - span.start_ms) / 1000, len(batches)),
        first_batch_ms=span.first_batch_ms)


def first_batch_ms(batches: list[Batch]) -> int | None:
    """The first of a query's batches (ms), given all of them."""
    return batches[0].duration_ms if batches else None
