"""The ``applyInPandasWithState`` function: a thin adapter around the pure core.

Per call (one state key, one micro-batch): decode the key's state and each record
(:func:`txstream.sources.events.parse_event`); read back the bodies of the held half messages the
call may write, to learn which are gone (:mod:`txstream.readback.bodies`: a body that is gone is
told to the core before any event, so nothing claims a release it cannot make); apply the events;
run the timers that are due (or due within ``Policy.timer_lead``; a discard only once the end topic
has been read past when it became due: the query's event-time watermark, fed by the source's
PROGRESS rows); encode the state back; arm the key's processing-time timeout at its earliest
transaction deadline less that lead; and turn the core's effects into records to write, plus one
timer row with the key's new timeout for the driver's timer schedule
(:mod:`txstream.timer_schedule`) and the call's metrics
(:mod:`txstream.streaming.engine.key_metrics`). ``now`` is Spark's batch timestamp, and the
watermark is the batch's, both kept by a replayed batch, so a replay emits what the first run
emitted (with the same lead), under the same record ids (:func:`record_id`): that is what lets the
sink skip what a crashed run already wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from txstream.kafka import KafkaSettings
from txstream.message import MAX_BODY_BYTES, Decision, EndEvent, Message
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES
from txstream.readback.bodies import BodySource, gone_bodies
from txstream.readback.release_index import released_by_others
from txstream.readback.replay import replay_suspected, written_before
from txstream.refusals import Code
from txstream.schema import EventKind, EventRow
from txstream.sources.events import Malformed, parse_event
from txstream.spark_worker import settle
from txstream.state.bucket import Bucket
from txstream.state.effects import Note
from txstream.state.policy import Policy
from txstream.state.timing import anchor
from txstream.state.transaction import BodyGone, Event, FoundReleased, Status
from txstream.streaming.engine.key_metrics import Counted, KeyTally
from txstream.streaming.engine.records import (
    Emit,
    coordinator_tag,
    dead_letter_of_record,
    history_rows,
    output_frame,
    output_rows,
    record_id,
    records_for,
    timer_row,
)
from txstream.topics import Topics

__all__ = ["coordinator_function", "in_replay_order", "ends_read_of"]

# All but the state key, which the call is for, and the progress time, which reaches every key
# as the watermark instead.
_INPUT = tuple(f for f in EventRow._fields[1:] if f != "ends_read")
# Recovered outcomes first (a re-read event then finds them), then half messages (an end event
# in the same batch then finds its half), then end events; progress rows carry nothing to apply.
# By EventKind: HALF, END, OUTCOME, PROGRESS, HALF_AGAIN.
_RANK = np.array([1, 2, 0, 3, 1], dtype=np.int8)


def in_replay_order(frames: Iterator[pd.DataFrame]) -> Iterable[tuple[Any, ...]]:
    """The key's rows in an order that does not depend on how the shuffle delivered them.

    Recovered outcomes, then half messages, then end events, each by source partition and
    offset; one transaction's end events share a partition, so their order holds. A replayed
    batch thus applies the same events in the same order and emits the same records.
    """
    parts = [f for f in frames if len(f)]
    if not parts:
        return ()
    frame = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    columns = [frame[name].to_numpy() for name in _INPUT]
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


def _arm(state: Any, bucket: Bucket, now: int, policy: Policy) -> int | None:
    """Save the key's state and arm its timeout when it must next run (a check's deadline
    less the timer lead, any other timer's deadline); returns the timeout Spark armed (None:
    the key is empty and keeps no state)."""
    wakeup = bucket.next_wakeup(policy.timer_lead, policy)
    if wakeup is None:
        # An empty key keeps no state; its next numbering starts at a later batch time.
        state.remove()
        return None
    state.update((bucket.encode(),))
    duration = max(1, wakeup - now)
    state.setTimeoutDuration(duration)
    return now + duration  # what Spark arms: the batch's time plus the duration


def _not_written_before(kafka: KafkaSettings, topics: Topics, bucket: Bucket,
                        gone: dict[str, str], batch_ms: int, first_id: str) -> dict[str, str]:
    """The gone bodies none of whose records a crashed run of this batch wrote already.

    A body can vanish between a batch's run and its replay (retention, a re-created half
    topic). The replay must still emit what the first run emitted, which released, checked or
    discarded it: so a body whose release, check request or discard is on its topic under one
    of this batch's record ids (``first_id`` on) counts as there, and the sink, finding that
    record under its record id, neither writes it again nor needs the body."""
    if not replay_suspected():
        return gone
    by_topic: dict[str, set[str]] = {}
    for txid in gone:
        tx = bucket.get(txid)
        if tx is not None and tx.half is not None:
            for topic in (tx.half.topic, topics.discard,
                          *([topics.check(tx.half.producer_group)]
                            if tx.half.producer_group else [])):
                by_topic.setdefault(topic, set()).add(txid)
    written = written_before(kafka, by_topic, batch_ms, first_id)
    return {txid: why for txid, why in gone.items() if txid not in written}


def _found_released(kafka: KafkaSettings, bucket: Bucket, halves: list[Message], now: int,
                    policy: Policy, tag: str, ours: str) -> list[FoundReleased]:
    """The half messages read again (``halves``) whose release a coordinator before this
    checkpoint wrote though its history does not say so (its last batch died in between):
    looked for on their real topics, back to the born time less the allowed clock skew, among
    the records this coordinator wrote under ids this checkpoint did not give (``ours``)
    (docs/decisions/0029-releases-found.md)."""
    wanted: dict[str, dict[str, int]] = {}
    for half in halves:
        txid = half.transaction_id
        tx = bucket.get(txid) if txid else None
        if (not txid or (tx is not None and tx.status is not Status.EARLY_END)
                or bucket.known_outcome(txid, now) is not None):
            continue  # known here: decided by this checkpoint, or read back from the history
        stored = half.stored_timestamp if half.stored_timestamp is not None else now
        since = min(anchor(half, now, policy), stored, now) - policy.max_clock_skew
        ids = wanted.setdefault(half.topic, {})
        ids[txid] = min(since, ids.get(txid, since))
    if not wanted:
        return []
    found = released_by_others(kafka, wanted, tag, ours)
    return [FoundReleased(txid, topic) for topic, ids in sorted(wanted.items())
            for txid in sorted(ids) if txid in found]


def coordinator_function(
    policy: Policy, topics: Topics, kafka: KafkaSettings | None = None,
    max_body: int = MAX_BODY_BYTES, max_record: int = KAFKA_MAX_MESSAGE_BYTES,
) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any], Iterator[pd.DataFrame]]:
    """The function for ``groupBy("state_key").applyInPandasWithState``.

    ``kafka``: where held half messages' bodies are read back from (None: a function whose
    state never holds one without its body); ``max_body``: a bigger half message is
    dead-lettered (RocketMQ's maxMessageSize); ``max_record``: the largest record the
    coordinator may write (``--max-message-bytes``): a half message whose records would be
    bigger is refused as it comes, and a dead letter too big to carry the refused record
    carries a reference to it. The history rows are always emitted: the query's counters are
    read from them before ``--no-history`` filters them out.
    """
    tag = coordinator_tag(topics)
    bodies = BodySource(kafka, topics.half) if kafka is not None else None

    def decode_rows(bucket: Bucket, frames: Iterator[pd.DataFrame], now: int,
                    rows: list[Emit], tally: KeyTally, again: list[Message]) -> list[Event]:
        """The call's events in replay order; a record that is no event becomes its dead
        letter, a recovered outcome is remembered; ``again`` gets the half messages a
        coordinator before this checkpoint may have read, or released (their ids in doubt)."""
        events: list[Event] = []
        for kind, partition, offset, k, v, h, error, stamp in in_replay_order(frames):
            if kind == EventKind.PROGRESS:
                continue
            if kind == EventKind.OUTCOME:
                bucket.recall_outcome(bytes(k).decode("utf-8"), bytes(v).decode("ascii"),
                                      now + policy.reserved_time, now)
                continue
            event = (parse_event(kind, k, v, h, partition, offset, max_body, max_record, stamp)
                     if error is None else Malformed(error, Code.UNREADABLE))
            if isinstance(event, Malformed):
                rows.append(dead_letter_of_record(kind, k, v, h, partition, offset, event,
                                                  topics, max_record))
                tally.count(Counted.DEAD_LETTERS, event.code)
            else:
                events.append(event)
                if isinstance(event, Message) and (kind == EventKind.HALF_AGAIN or (
                        event.transaction_id and bucket.in_doubt(event.transaction_id, now))):
                    again.append(event)
        return events

    def bodies_gone(bucket: Bucket, events: list[Event], now: int, ends_read: int,
                    state_key: int) -> list[BodyGone]:
        """The bodies this call may write that are gone, as events (the sink reads the others
        again as it writes them: big bodies stay out of the JVM)."""
        commits = [e.transaction_id for e in events if isinstance(e, EndEvent)
                   and e.decision is Decision.COMMIT_MESSAGE and e.transaction_id]
        wanted = bucket.bodies_wanted(commits, now, policy.timer_lead, policy, ends_read)
        if not wanted:
            return []
        if bodies is None:
            raise ValueError("held half messages need their bodies read back: the coordinator "
                             "function was made without Kafka settings")
        gone = gone_bodies(bodies, wanted)
        if gone and kafka is not None:
            # The ids this call will number its records from (take_numbers, below).
            epoch = now if bucket.epoch is None else bucket.epoch
            first_id = record_id(tag, state_key, epoch, bucket.next_number)
            gone = _not_written_before(kafka, topics, bucket, gone, now, first_id)
        return [BodyGone(txid, reason) for txid, reason in sorted(gone.items())]

    def found_released(bucket: Bucket, again: list[Message], now: int,
                       state_key: int) -> list[FoundReleased]:
        if not again or kafka is None:
            return []
        epoch = now if bucket.epoch is None else bucket.epoch
        ours = record_id(tag, state_key, epoch, 0).rsplit(".", 1)[0] + "."
        return _found_released(kafka, bucket, again, now, policy, tag, ours)

    def apply_events(bucket: Bucket, events: list[Event], now: int, rows: list[Emit],
                     notes: list[Note], tally: KeyTally) -> None:
        for event in events:
            # Decoded here or by apply, once: an end event's transaction as it was.
            before = (bucket.get(event.transaction_id)
                      if isinstance(event, EndEvent) and event.transaction_id else None)
            effects = bucket.apply(event, now, policy)
            rows.extend(records_for(effects, topics, limit=max_record))
            notes.extend(e for e in effects if isinstance(e, Note))
            tally.applied(event, before, effects)

    def coordinate(
        key: tuple[Any, ...], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        settle()
        now = int(state.getCurrentProcessingTimeMs())
        ends_read = ends_read_of(state, now)
        state_key = int(key[0])
        bucket = Bucket.decode(state.get[0] if state.exists else None)
        notes: list[Note] = []
        tally = KeyTally(now)
        rows: list[Emit] = []
        again: list[Message] = []
        events = decode_rows(bucket, frames, now, rows, tally, again)
        # A release found and a body gone are told first: no event or timer then claims to
        # write them.
        told: list[Event] = [*found_released(bucket, again, now, state_key),
                             *bodies_gone(bucket, events, now, ends_read, state_key)]
        apply_events(bucket, told + events, now, rows, notes, tally)
        # Events first: a commit in this batch spares the transaction a check due now.
        # Timers due within the lead run now, as of their deadlines, and the sink holds their
        # records until then: the batch's own run time is then mostly behind them.
        for at, fired in bucket.run_timers(now, policy.timer_lead, policy, ends_read):
            rows.extend(records_for(fired, topics, not_before=at if at > now else None,
                                    limit=max_record))
            notes.extend(e for e in fired if isinstance(e, Note))
            tally.effects(fired)
        rows.extend(history_rows(notes, state_key, topics, max_record))
        # Numbered before the state is saved: the numbers taken are part of this batch's state.
        epoch, first = bucket.take_numbers(len(rows), now)
        ids: list[str | None] = [record_id(tag, state_key, epoch, first + i)
                                 for i in range(len(rows))]
        armed = _arm(state, bucket, now, policy)
        rows.append(timer_row(state_key, armed, tally.summary(state_key, bucket)))
        ids.append(None)
        yield output_frame(output_rows(rows, ids, now))

    return coordinate
