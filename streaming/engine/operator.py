"""The ``applyInPandasWithState`` function: a thin adapter around the per-key step.

Per call (one state key, one micro-batch): read the batch's time and watermark and the key's
state from Spark's ``GroupState``, the key's rows from its frames in an order that does not
depend on the shuffle (:func:`in_replay_order`); run the key's step
(:class:`txstream.streaming.engine.key_step.KeyStep`: events, timers, records, numbered); save
the state and arm the key's processing-time timeout; yield the rows as one frame
(:func:`output_frame`). ``now`` is Spark's batch timestamp, and the watermark is the batch's,
both kept by a replayed batch, so a replay emits what the first run emitted, under the same
record ids: that is what lets the sink skip what a crashed run already wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd

from txstream.kafka import KafkaSettings
from txstream.message import MAX_BODY_BYTES
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES
from txstream.schema import OUTPUT_COLUMNS, OutputRow
from txstream.spark_worker import settle
from txstream.state.bucket import Bucket
from txstream.state.policy import Policy
from txstream.streaming.engine.key_step import INPUT, KeyOutput, KeyStep
from txstream.topics import Topics

__all__ = ["coordinator_function", "pandas_function", "call_step", "in_replay_order",
           "columns_in_replay_order", "ends_read_of", "output_frame", "output_columns"]

# Recovered outcomes first (a re-read event then finds them), then half messages (an end event
# in the same batch then finds its half), then end events; progress rows carry nothing to apply.
# By EventKind: HALF, END, OUTCOME, PROGRESS, HALF_AGAIN.
_RANK = np.array([1, 2, 0, 3, 1], dtype=np.int8)

# Nullable integer columns need pandas' nullable dtypes (Int64, Int32) to reach Arrow as
# integers: made here from numpy arrays and their masks.
_INTS: dict[str, type[np.integer[Any]]] = {"bigint": np.int64, "int": np.int32}


def in_replay_order(frames: Iterator[pd.DataFrame]) -> Iterable[tuple[Any, ...]]:
    """The key's rows (:data:`~txstream.streaming.engine.key_step.INPUT` tuples) in an order
    that does not depend on how the shuffle delivered them.

    Recovered outcomes, then half messages, then end events, each by source partition and
    offset; one transaction's end events share a partition, so their order holds. A replayed
    batch thus applies the same events in the same order and emits the same records.
    """
    parts = [f for f in frames if len(f)]
    if not parts:
        return ()
    # Column by column: a key's rows in several frames (Arrow batches) need no pd.concat.
    return columns_in_replay_order(
        [parts[0][name].to_numpy() if len(parts) == 1
         else np.concatenate([f[name].to_numpy() for f in parts]) for name in INPUT])


def columns_in_replay_order(columns: Sequence[Any]) -> Iterable[tuple[Any, ...]]:
    """:func:`in_replay_order` of a key's rows given as numpy arrays, one per
    :data:`~txstream.streaming.engine.key_step.INPUT` column."""
    if not len(columns[0]):
        return ()
    kind, partition, offset = columns[0], columns[1], columns[2]
    order = np.lexsort((offset, partition, _RANK[kind.astype(np.int64)]))
    return zip(*(column[order].tolist() for column in columns), strict=True)


def ends_read_of(state: Any, now: int) -> int:
    """How far the end topic has been read: the query's event-time watermark, which the
    source's PROGRESS rows set (the coordinator's query always defines it). A function run
    without one (a query that reads no end topic, a test) reads ``now``."""
    if not getattr(state, "_watermark_present", True):
        return now
    try:
        return int(state.getCurrentWatermarkMs())
    except Exception:  # no watermark in this query
        return now


def _ints(values: tuple[int | None, ...], dtype: type[np.integer[Any]]) -> Any:
    """A nullable integer column, as ``pd.array(values, dtype="Int64")`` makes it (a null's
    slot holds 1, pandas' fill), without its per-value type inference."""
    n, nulls = len(values), values.count(None)
    if nulls == n:
        return pd.arrays.IntegerArray(np.ones(n, dtype), np.ones(n, bool))
    if nulls == 0:
        return pd.arrays.IntegerArray(np.array(values, dtype), np.zeros(n, bool))
    objects = np.array(values, dtype=object)
    mask = objects == None  # noqa: E711 (numpy compares each element)
    objects[mask] = 1
    return pd.arrays.IntegerArray(objects.astype(dtype), mask)


def _objects(values: tuple[Any, ...]) -> Any:
    """An object column of ``values`` as they are (a list would be inferred again)."""
    if not values:
        return []  # as pandas makes an empty column from a list (float64), as it always did
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def output_frame(rows: Sequence[OutputRow]) -> pd.DataFrame:
    """``rows`` as the pandas frame ``applyInPandasWithState`` hands to Spark.

    Every call builds one, a key with only its timer row too: the columns are made as arrays
    pandas takes as they are (no inference, no copy), not value by value.
    """
    return pd.DataFrame(
        dict(zip((name for name, _ in OUTPUT_COLUMNS), output_columns(rows), strict=True)),
        copy=False,  # the dict's order is the columns' (columns= would cost a reindex)
    )


def output_columns(rows: Sequence[OutputRow]) -> list[Any]:
    """The columns of ``rows`` as :func:`output_frame` holds them (object arrays, and pandas'
    nullable integer arrays), which ``pa.Array.from_pandas`` takes as they are."""
    columns = list(zip(*rows)) if rows else [()] * len(OUTPUT_COLUMNS)
    return [_ints(values, _INTS[kind]) if kind in _INTS else _objects(values)
            for (_, kind), values in zip(OUTPUT_COLUMNS, columns, strict=True)]


def _keep(state: Any, out: KeyOutput) -> None:
    """Save the key's state and arm its timeout, or drop an empty key's state."""
    if out.state is None:
        state.remove()
        return
    state.update((out.state,))
    state.setTimeoutDuration(out.timeout_ms)


def coordinator_function(
    policy: Policy, topics: Topics, kafka: KafkaSettings | None = None,
    max_body: int = MAX_BODY_BYTES, max_record: int = KAFKA_MAX_MESSAGE_BYTES,
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The function for ``groupBy("state_key").applyInPandasWithState``; the arguments are
    :class:`~txstream.streaming.engine.key_step.KeyStep`'s. The history rows are always
    emitted: the query's counters are read from them before ``--no-history`` filters them
    out."""
    return pandas_function(KeyStep(policy, topics, kafka, max_body, max_record))


def pandas_function(
    step: KeyStep,
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """:func:`coordinator_function` around a step already made."""

    def coordinate(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        yield output_frame(call_step(step, key, in_replay_order(frames), state).rows)

    return coordinate


def call_step(step: KeyStep, key: tuple[Any, ...], rows: Iterable[tuple[Any, ...]],
              state: Any) -> KeyOutput:
    """One call of ``step`` with Spark's ``GroupState``: the batch's time and watermark and the
    key's state read from it; the state saved and the timeout armed on it."""
    settle()
    now = int(state.getCurrentProcessingTimeMs())
    ends_read = ends_read_of(state, now)
    bucket = Bucket.decode(state.get[0] if state.exists else None)
    out = step.run(int(key[0]), bucket, rows, now, ends_read)
    _keep(state, out)
    return out
