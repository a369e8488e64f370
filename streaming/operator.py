"""The ``applyInPandasWithState`` function: a thin adapter around the pure core.

Per call (one bucket, one micro-batch): decode the bucket's state, turn each event row into a
``Message``/``EndEvent`` and apply it, run the timers that are due, encode the state back, arm
the bucket's processing-time timeout at its earliest transaction deadline, and turn the core's
effects into records to write. ``now`` is Spark's batch timestamp, which a replayed batch keeps,
so a replay emits exactly what the first run emitted, under the same record ids
(:func:`record_id`): that is what lets the sink skip what a crashed run already wrote.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pandas as pd

from state.effects import DeadLetter, Discard, Effect, Note, Release, RequestCheck
from state.policy import Policy
from streaming.parking_lot import ParkingLot
from txstream.kafka import KafkaSettings
from txstream.message import Decision, EndEvent, Message
from txstream.schema import OUTPUT_COLUMNS, EventKind, Kind
from txstream.topics import Topics
from txstream.wire import (
    H,
    Record,
    encode_check,
    encode_dead_letter,
    encode_discard,
    encode_end,
    encode_half,
    encode_history,
    encode_visible,
    pack_headers,
)

__all__ = [
    "coordinator_function", "coordinator_tag", "event_from_row", "history_row", "records_for",
    "record_id",
]

_OUTPUT_NAMES = [name for name, _ in OUTPUT_COLUMNS]
# (kind, record, transaction id, event, lag_ms, counts of history events or None)
_Row = tuple[str, Record, str | None, str, int | None, dict[str, int] | None]


def _opt_int(value: Any) -> int | None:
    """pandas turns a nullable integer column with nulls into floats with NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return int(value)


def _opt_str(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return str(value)


def event_from_row(row: Any) -> Message | EndEvent:
    """An EVENT_SCHEMA row (half or end) as the core's event."""
    if row.kind == EventKind.HALF:
        props = row.properties
        return Message(
            topic=row.topic,
            body=bytes(row.body) if row.body is not None else b"",
            tags=_opt_str(row.tags),
            keys=_opt_str(row.keys),
            properties=dict(props) if props is not None and not isinstance(props, float) else {},
            transaction_id=row.transaction_id,
            msg_id=_opt_str(row.msg_id) or row.transaction_id,
            producer_group=row.producer_group,
            born_timestamp=_opt_int(row.born_ms),
            check_immunity_time_s=_opt_int(row.immunity_s),
            # Where the half message lies in the half topic: a parked transaction keeps only
            # this (state.parking) and reads the message back when it is needed.
            queue_id=_opt_int(row.src_partition),
            queue_offset=_opt_int(row.src_offset),
        )
    return EndEvent(
        transaction_id=row.transaction_id,
        producer_group=row.producer_group,
        decision=Decision(row.decision),
        from_check=bool(row.from_check) if row.from_check is not None else False,
        check_times=_opt_int(row.check_times),
        operator=_opt_str(row.operator),
        remark=_opt_str(row.remark),
        born_timestamp=_opt_int(row.born_ms),
    )


def _malformed(row: Any, topics: Topics) -> _Row:
    raw_headers = row.raw_headers
    headers = tuple(
        (h["key"], bytes(h["value"]) if h["value"] is not None else b"")
        if isinstance(h, dict)
        else (h[0], bytes(h[1]) if h[1] is not None else b"")
        for h in (raw_headers if raw_headers is not None else ())
    )
    original = Record(
        row.src_topic,
        bytes(row.raw_key) if row.raw_key is not None else None,
        bytes(row.raw_value) if row.raw_value is not None else None,
        headers,
    )
    dead = encode_dead_letter(
        original, str(row.error), _opt_int(row.src_partition) or 0,
        _opt_int(row.src_offset) or 0, topics,
    )
    return (Kind.DEAD_LETTER, dead, None, Kind.DEAD_LETTER, None, None)


def records_for(
    effects: Iterable[Effect],
    now: int,
    topics: Topics,
    origin: tuple[Any, int, int] | None = None,
) -> Iterator[_Row]:
    """The records the core's effects ask for, history notes aside (:func:`history_row`).
    ``origin``: (event, partition, offset) read."""
    for effect in effects:
        if isinstance(effect, Release):
            msg = effect.message
            lag = now - effect.committed_at if effect.committed_at is not None else None
            yield (Kind.VISIBLE, encode_visible(msg), msg.transaction_id, Kind.VISIBLE, lag, None)
        elif isinstance(effect, RequestCheck):
            msg = effect.message
            record = encode_check(msg, effect.check_times, topics)
            yield (Kind.CHECK, record, msg.transaction_id, Kind.CHECK, effect.late_ms, None)
        elif isinstance(effect, Discard):
            msg = effect.message
            record = encode_discard(msg, effect.reason, effect.check_times, topics)
            yield (Kind.DISCARD, record, msg.transaction_id, Kind.DISCARD, None, None)
        elif isinstance(effect, DeadLetter):
            event = effect.event
            original = (
                encode_half(event, topics) if isinstance(event, Message)
                else encode_end(event, topics)
            )
            partition, offset = -1, -1
            if origin is not None and origin[0] is event:
                partition, offset = origin[1], origin[2]
            record = encode_dead_letter(original, effect.reason, partition, offset, topics)
            yield (Kind.DEAD_LETTER, record, event.transaction_id, Kind.DEAD_LETTER, None, None)


def history_row(notes: list[Note], bucket: int, topics: Topics) -> _Row:
    """One history record for all of a bucket's notes in a batch, with the count of each
    event (the query's observed metrics sum them)."""
    record = encode_history(((n.transaction_id, n.at, n.event, n.detail) for n in notes),
                            str(bucket).encode("ascii"), topics)
    return (Kind.HISTORY, record, None, Kind.HISTORY, None, dict(Counter(n.event for n in notes)))


def coordinator_tag(topics: Topics) -> str:
    """Names this coordinator in record ids: two coordinators (topic prefixes) releasing to one
    topic never take each other's records for their own."""
    return f"{zlib.crc32(topics.half.encode('utf-8')):08x}"


def record_id(tag: str, bucket: int, epoch: int, number: int) -> str:
    """``tag.bucket.epoch.number``: unique per coordinator, equal in a replayed batch."""
    return f"{tag}.{bucket}.{epoch}.{number}"


def _frame(rows: list[_Row], ids: list[str], now: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "kind": [r[0] for r in rows],
            "topic": [r[1].topic for r in rows],
            "key": [r[1].key for r in rows],
            "value": [r[1].value for r in rows],
            "headers": [pack_headers((*r[1].headers, (H.RECORD_ID, i.encode("ascii"))))
                        for r, i in zip(rows, ids, strict=True)],
            "transaction_id": [r[2] for r in rows],
            "event": [r[3] for r in rows],
            "lag_ms": pd.array([r[4] for r in rows], dtype="Int64"),
            "counts": [r[5] for r in rows],
            "record_id": ids,
            "batch_ms": pd.array([now] * len(rows), dtype="Int64"),
        },
        columns=_OUTPUT_NAMES,
    )


def _in_replay_order(frames: Iterator[pd.DataFrame]) -> Iterator[Any]:
    """The bucket's rows in an order that does not depend on how the shuffle delivered them.

    Half messages first (an end event in the same batch then finds its half), then by source
    partition and offset; one transaction's end events share a partition, so their order holds.
    A replayed batch thus applies the same events in the same order and emits the same records.
    """
    parts = [f for f in frames if len(f)]
    if not parts:
        return iter(())
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    order = frame.assign(_later=frame["kind"] != EventKind.HALF).sort_values(
        ["_later", "src_topic", "src_partition", "src_offset"], kind="stable"
    )
    return order.drop(columns="_later").itertuples(index=False)


def coordinator_function(
    policy: Policy, topics: Topics, kafka: KafkaSettings | None = None, park_after: int = 0
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The function for ``groupBy("bucket").applyInPandasWithState``.

    ``park_after`` ms (with ``kafka``, to read half messages back): pending transactions whose
    next deadline is further away are parked (streaming.parking_lot); 0: never.
    """
    tag = coordinator_tag(topics)
    lot = ParkingLot(kafka, topics.half, park_after)

    def coordinate(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        now = int(state.getCurrentProcessingTimeMs())
        bucket, parked = lot.load(state.get[0] if state.exists else None)
        ordered = list(_in_replay_order(frames))
        lot.unpark(bucket, parked, (r.transaction_id for r in ordered
                                    if r.kind != EventKind.MALFORMED), now)
        rows: list[_Row] = []
        notes: list[Note] = []
        for row in ordered:
            if row.kind == EventKind.MALFORMED:
                rows.append(_malformed(row, topics))
                continue
            event = event_from_row(row)
            effects = bucket.apply(event, now, policy)
            origin = (event, int(row.src_partition), int(row.src_offset))
            rows.extend(records_for(effects, now, topics, origin))
            notes.extend(e for e in effects if isinstance(e, Note))
        # Events first: a commit in this batch spares the transaction a check due now.
        fired = bucket.fire_due(now, policy)
        rows.extend(records_for(fired, now, topics))
        notes.extend(e for e in fired if isinstance(e, Note))
        if notes:
            rows.append(history_row(notes, int(key[0]), topics))
        # Numbered before the state is saved: the numbers taken are part of this batch's state.
        epoch, first = bucket.take_numbers(len(rows), now)
        ids = [record_id(tag, int(key[0]), epoch, first + i) for i in range(len(rows))]
        blob, deadline = lot.store(bucket, parked, now)
        if deadline is None:
            # An empty bucket keeps no state; its next numbering starts at a later batch time.
            state.remove()
        else:
            state.update((blob,))
            state.setTimeoutDuration(max(1, deadline - now))
        if rows:
            yield _frame(rows, ids, now)

    return coordinate
