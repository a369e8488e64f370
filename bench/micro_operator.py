"""The coordinator operator's CPU per call of its parts, in µs: before/after figures of a change.

``python -m bench.micro_operator [--per-key K] [--repeat R]`` builds the records a producer
writes (:class:`bench.workload.Workload`: a 200-byte random body, the client's headers), and
times, in this process (no broker, no Spark): ``parse_event`` of a half message and of an end
event, ``largest_output_bytes``, ``encode_history`` per note, ``output_frame`` per row, the
per-key tally per transaction, and the whole operator call (``coordinate``: K committed
transactions, half and commit in one batch, one key) per transaction. Each figure is the best
of R runs, so that another process on the machine inflates it less.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

from bench.workload import Workload
from txstream.message import EndEvent, Message
from txstream.outputs import encode_history, largest_output_bytes
from txstream.schema import EventKind, EventRow
from txstream.sources.event_rows import record_row
from txstream.sources.events import parse_event
from txstream.state.bucket import Bucket
from txstream.state.effects import Note
from txstream.state.keys import KeyLayout
from txstream.state.policy import Policy
from txstream.streaming.engine.key_metrics import KeyTally
from txstream.streaming.engine.operator import coordinator_function, output_frame
from txstream.streaming.engine.records import history_rows, output_rows, records_for
from txstream.topics import Topics
from txstream.wire import Record

__all__ = ["main"]

T0 = 1_700_000_000_000
TOPICS = Topics()
POLICY = Policy()
WORKLOAD = Workload(TOPICS, "bench-group", "bench-real-topic")


def _best_us(fn: Callable[[], object], calls: int, repeat: int) -> float:
    """Best of ``repeat`` runs of ``calls`` calls of ``fn``, µs per call."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls)
    return best * 1e6


def _records(count: int) -> list[Record]:
    return list(WORKLOAD.committed("micro", count))


def _rows(records: list[Record]) -> list[EventRow]:
    return [record_row(r.topic == TOPICS.half, r.key, r.value, list(r.headers), 0, i,
                       KeyLayout(), T0) for i, r in enumerate(records)]


def _group_state(now: int) -> Any:
    from pyspark.sql.streaming.state import GroupState, GroupStateTimeout
    from pyspark.sql.types import BinaryType, Row, StructField, StructType

    return GroupState(
        optionalValue=Row(), batchProcessingTimeMs=now, eventTimeWatermarkMs=-1,
        timeoutConf=GroupStateTimeout.ProcessingTimeTimeout, hasTimedOut=False,
        watermarkPresent=False, defined=False, updated=False, removed=False,
        timeoutTimestamp=GroupState.NO_TIMESTAMP, keyAsUnsafe=b"",
        valueSchema=StructType([StructField("blob", BinaryType())]))


def _parts(rows: list[EventRow], repeat: int) -> dict[str, float]:
    half = next(r for r in rows if r.kind == EventKind.HALF)
    end = next(r for r in rows if r.kind == EventKind.END)
    msg = parse_event(half.kind, half.key, half.value, half.headers, 0, 0)
    assert isinstance(msg, Message)
    return {
        "parse_half": _best_us(lambda: parse_event(
            half.kind, half.key, half.value, half.headers, 0, 0, timestamp=T0), 20_000, repeat),
        "parse_end": _best_us(lambda: parse_event(
            end.kind, end.key, end.value, end.headers, 0, 1), 20_000, repeat),
        "largest_output_bytes": _best_us(lambda: largest_output_bytes(msg), 20_000, repeat),
    }


def _per_key(rows: list[EventRow], repeat: int) -> dict[str, float]:
    """What one key's call of ``len(rows) // 2`` transactions costs, per transaction or row."""
    count = len(rows) // 2
    events = [parse_event(r.kind, r.key, r.value, r.headers, r.src_partition, r.src_offset)
              for r in rows]
    bucket, effects_of = Bucket(), []
    notes: list[Note] = []
    for event in events:
        assert isinstance(event, (Message, EndEvent))
        before = bucket.get(event.transaction_id) if isinstance(event, EndEvent) else None
        effects = bucket.apply(event, T0, POLICY)
        effects_of.append((event, before, effects))
        notes.extend(e for e in effects if isinstance(e, Note))
    lines = [(n.transaction_id, n.at, n.event, n.detail) for n in notes]
    emits = [e for _, _, effects in effects_of for e in records_for(effects, TOPICS)]
    emits += list(history_rows(notes, 7, TOPICS))
    ids = [f"0000abcd.7.{T0}.{i}" for i in range(len(emits))]
    out_rows = output_rows(emits, ids, T0)

    coordinate = coordinator_function(POLICY, TOPICS)

    def tally() -> None:
        t = KeyTally(T0)
        for event, before, effects in effects_of:
            t.applied(event, before, effects)
        t.summary(7, bucket)

    def call() -> None:
        frames = iter([pd.DataFrame(rows, columns=list(EventRow._fields))])
        list(coordinate((7,), frames, _group_state(T0)))

    per_note = _best_us(lambda: list(encode_history(lines, b"7", TOPICS)), 20, repeat)
    return {
        "encode_history_per_note": per_note / len(lines),
        "output_frame_per_row": _best_us(lambda: output_frame(out_rows), 20, repeat)
        / len(out_rows),
        "tally_per_tx": _best_us(tally, 20, repeat) / count,
        "coordinate_per_tx": _best_us(call, 5, repeat) / count,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-key", type=int, default=200, help="transactions per key and batch")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    rows = _rows(_records(args.per_key))
    figures = {**_parts(rows, args.repeat), **_per_key(rows, args.repeat)}
    for name, us in figures.items():
        print(f"{name:26s} {us:8.2f} µs")


if __name__ == "__main__":
    main()
