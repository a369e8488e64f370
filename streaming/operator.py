"""The ``applyInPandasWithState`` function: a thin adapter around the pure core.

Per call (one state key, one micro-batch): decode the key's state, decode each record
(:func:`sources.events.parse_event`) and apply it, run the timers that are due (or due within
``Policy.timer_lead``), encode the state back, arm the key's processing-time timeout at its
earliest transaction deadline less that lead, and turn the core's effects into records to
write, plus one timer row with the key's new timeout for the driver's timer schedule
(:mod:`txstream.timer_schedule`). ``now`` is Spark's batch timestamp, which a replayed batch
keeps, so a replay emits exactly what the first run emitted (with the same lead), under the
same record ids (:func:`record_id`): that is what lets the sink skip what a crashed run
already wrote.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from sources.events import Malformed, parse_event
from state.bucket import Bucket
from state.effects import DeadLetter, Discard, Effect, Note, Release, RequestCheck
from state.policy import Policy
from txstream.message import MAX_BODY_BYTES, Message
from txstream.schema import HISTORY_COUNTED, OUTPUT_COLUMNS, EventKind, Kind
from txstream.spark_worker import settle
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
    unpack_headers,
)

__all__ = ["coordinator_function", "coordinator_tag", "history_row", "in_replay_order",
           "records_for", "record_id", "timer_row"]

_OUTPUT_NAMES = [name for name, _ in OUTPUT_COLUMNS]
_INPUT = ("kind", "src_partition", "src_offset", "key", "value", "headers", "error")
# (kind, record, lag_ms, counts of history events or None, not before this time (ms) or None)
_Row = tuple[str, Record, int | None, dict[str, int] | None, int | None]


def _source_topic(kind: int, topics: Topics) -> str:
    return topics.half if kind == EventKind.HALF else topics.end


def _dead_letter(kind: int, key: Any, value: Any, headers: Any, partition: int, offset: int,
                 reason: str, topics: Topics) -> _Row:
    """A record that is no event, written to the dead-letter topic as it was read."""
    try:
        original_headers = tuple(unpack_headers(headers))
    except Exception:  # the packed headers are the source's own; keep the reason if not
        original_headers = ()
    original = Record(_source_topic(kind, topics), key, value, original_headers)
    return (Kind.DEAD_LETTER, encode_dead_letter(original, reason, partition, offset, topics),
            None, None, None)


def records_for(
    effects: Iterable[Effect],
    now: int,
    topics: Topics,
    origin: tuple[Any, int, int] | None = None,
    not_before: int | None = None,
) -> Iterator[_Row]:
    """The records the core's effects ask for, history notes aside (:func:`history_row`).
    ``origin``: (event, partition, offset) read; ``not_before``: the sink holds the records
    until then (a timer run ahead of its deadline)."""
    for effect in effects:
        if isinstance(effect, Release):
            lag = now - effect.committed_at if effect.committed_at is not None else None
            yield (Kind.VISIBLE, encode_visible(effect.message), lag, None, not_before)
        elif isinstance(effect, RequestCheck):
            record = encode_check(effect.message, effect.check_times, topics)
            yield (Kind.CHECK, record, effect.late_ms, None, not_before)
        elif isinstance(effect, Discard):
            record = encode_discard(effect.message, effect.reason, effect.check_times, topics)
            yield (Kind.DISCARD, record, None, None, not_before)
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
            yield (Kind.DEAD_LETTER, record, None, None, not_before)


def history_row(notes: list[Note], key: int, topics: Topics) -> _Row:
    """One history record for all of a key's notes in a batch, with the count of each event
    (the query's observed metrics sum them)."""
    record = encode_history(((n.transaction_id, n.at, n.event, n.detail) for n in notes),
                            str(key).encode("ascii"), topics)
    return (Kind.HISTORY, record, None, dict(Counter(n.event for n in notes)), None)


def timer_row(key: int, timeout_ms: int | None) -> _Row:
    """The key's processing-time timeout as Spark armed it (None: no timer), for the sink to
    fold into the timer schedule; it is no record and takes no record number."""
    return (Kind.TIMER, Record("", str(key).encode("ascii"), None), None, None, timeout_ms)


def coordinator_tag(topics: Topics) -> str:
    """Names this coordinator in record ids: two coordinators (topic prefixes) releasing to one
    topic never take each other's records for their own."""
    return f"{zlib.crc32(topics.half.encode('utf-8')):08x}"


def record_id(tag: str, key: int, epoch: int, number: int) -> str:
    """``tag.key.epoch.number``: unique per coordinator, equal in a replayed batch."""
    return f"{tag}.{key}.{epoch}.{number}"


def _frame(rows: list[_Row], ids: list[str], now: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "kind": [r[0] for r in rows],
            "topic": [r[1].topic for r in rows],
            "key": [r[1].key for r in rows],
            "value": [r[1].value for r in rows],
            "headers": [pack_headers((*r[1].headers, (H.RECORD_ID, i.encode("ascii"))))
                        if i else None for r, i in zip(rows, ids, strict=True)],
            "lag_ms": pd.array([r[2] for r in rows], dtype="Int64"),
            **{column: pd.array([r[3].get(event) if r[3] is not None else None for r in rows],
                                dtype="Int32")
               for event, column in HISTORY_COUNTED.items()},
            "record_id": [i or None for i in ids],
            "batch_ms": np.full(len(rows), now, dtype=np.int64),
            "not_before_ms": pd.array([r[4] for r in rows], dtype="Int64"),
        },
        columns=_OUTPUT_NAMES,
    )


def in_replay_order(frames: Iterator[pd.DataFrame]) -> Iterable[tuple[Any, ...]]:
    """The key's rows in an order that does not depend on how the shuffle delivered them.

    Half messages first (an end event in the same batch then finds its half), then by source
    partition and offset; one transaction's end events share a partition, so their order holds.
    A replayed batch thus applies the same events in the same order and emits the same records.
    """
    parts = [f for f in frames if len(f)]
    if not parts:
        return ()
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    columns = [frame[name].to_numpy() for name in _INPUT]
    kind, partition, offset = columns[0], columns[1], columns[2]
    order = np.lexsort((offset, partition, kind))  # EventKind.HALF sorts first
    return zip(*(column[order].tolist() for column in columns), strict=True)


def coordinator_function(
    policy: Policy, topics: Topics, max_body: int = MAX_BODY_BYTES
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The function for ``groupBy("state_key").applyInPandasWithState``.

    ``max_body``: a bigger half message is dead-lettered (RocketMQ's maxMessageSize). The
    history row is always emitted: the query's counters are read from it before ``--no-history``
    filters it out.
    """
    tag = coordinator_tag(topics)

    def coordinate(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        settle()
        now = int(state.getCurrentProcessingTimeMs())
        state_key = int(key[0])
        bucket = Bucket.decode(state.get[0] if state.exists else None)
        rows: list[_Row] = []
        notes: list[Note] = []
        for kind, partition, offset, k, v, h, error in in_replay_order(frames):
            if error is not None:
                rows.append(_dead_letter(kind, k, v, h, partition, offset, error, topics))
                continue
            event = parse_event(kind, k, v, h, partition, offset, max_body)
            if isinstance(event, Malformed):
                rows.append(_dead_letter(kind, k, v, h, partition, offset, event.reason,
                                         topics))
                continue
            effects = bucket.apply(event, now, policy)
            rows.extend(records_for(effects, now, topics, (event, partition, offset)))
            notes.extend(e for e in effects if isinstance(e, Note))
        # Events first: a commit in this batch spares the transaction a check due now.
        # Timers due within the lead run now, as of their deadlines, and the sink holds their
        # records until then: the batch's own run time is then mostly behind them.
        for at, fired in bucket.run_timers(now, policy.timer_lead, policy):
            rows.extend(records_for(fired, now, topics, not_before=at if at > now else None))
            notes.extend(e for e in fired if isinstance(e, Note))
        if notes:
            rows.append(history_row(notes, state_key, topics))
        # Numbered before the state is saved: the numbers taken are part of this batch's state.
        epoch, first = bucket.take_numbers(len(rows), now)
        ids = [record_id(tag, state_key, epoch, first + i) for i in range(len(rows))]
        deadline = bucket.next_deadline()
        timeout = None
        if deadline is None:
            # An empty key keeps no state; its next numbering starts at a later batch time.
            state.remove()
        else:
            state.update((bucket.encode(),))
            duration = max(1, deadline - policy.timer_lead - now)
            state.setTimeoutDuration(duration)
            timeout = now + duration  # what Spark arms: the batch's time plus the duration
        rows.append(timer_row(state_key, timeout))
        ids.append("")
        yield _frame(rows, ids, now)

    return coordinate
