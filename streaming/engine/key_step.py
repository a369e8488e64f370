"""One state key's call in one micro-batch, step by step: plain rows in, typed rows out.

The order (:meth:`KeyStep.run`): decode the rows into events; look on the real topics for
releases of half messages read again that the state does not know
(:mod:`txstream.readback.release_index`); read back the bodies of the held half messages the
call may write, to learn which are gone (:mod:`txstream.readback.bodies`); tell the core of the
releases found and the bodies gone before any event (so nothing claims a release it cannot
make, or makes one again), then apply the events; run the timers that are due (or due within
``Policy.timer_lead``; a discard only once the end topic has been read past when it became
due); the history rows; number the records (:func:`record_id`, from the state: a replay gives
the same ids); the key's next timeout; and the rows to write, with one timer row carrying that
timeout and the call's metrics (:mod:`txstream.streaming.engine.key_metrics`).

``now`` is the batch's time and ``ends_read`` its watermark, both kept by a replayed batch, so
a replay emits what the first run emitted, under the same ids: that is what lets the sink skip
what a crashed run already wrote. The Spark side (frames in, ``GroupState``, the frame out) is
:mod:`txstream.streaming.engine.operator`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from txstream.kafka import KafkaSettings
from txstream.message import MAX_BODY_BYTES, Decision, EndEvent, Message
from txstream.outputs import KAFKA_MAX_MESSAGE_BYTES
from txstream.readback.bodies import BodySource, gone_bodies
from txstream.readback.release_index import released_by_others
from txstream.readback.replay import replay_suspected, written_before
from txstream.refusals import Code
from txstream.schema import EventKind, EventRow, OutputRow
from txstream.sources.events import Malformed, parse_event
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
    output_rows,
    record_id,
    records_for,
    timer_row,
)
from txstream.topics import Topics

__all__ = ["INPUT", "KeyCall", "KeyOutput", "KeyStep"]

# A row the step reads: an EventRow but the state key, which the call is for, and the progress
# time, which reaches every key as the watermark instead.
INPUT = tuple(f for f in EventRow._fields[1:] if f != "ends_read")


@dataclass(slots=True)
class KeyCall:
    """One call: the key, its state as the call found it and changes it, the batch's time and
    watermark, and what the steps made so far."""

    state_key: int
    bucket: Bucket
    now: int
    ends_read: int
    tally: KeyTally
    emits: list[Emit] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    # Half messages a coordinator before this checkpoint may have read, or released.
    again: list[Message] = field(default_factory=list)


class KeyOutput(NamedTuple):
    """What a call leaves: the rows to write (the timer row last), and the key's state to save
    with the timeout to arm, in ms after the batch's time (both None: the key is empty and
    keeps no state)."""

    rows: list[OutputRow]
    state: bytes | None
    timeout_ms: int | None


def _not_written_before(kafka: KafkaSettings, topics: Topics, bucket: Bucket,
                        gone: dict[str, str], batch_ms: int, first_id: str) -> dict[str, str]:
    """The gone bodies none of whose records a crashed run of this batch wrote already.

    A body can vanish between a batch's run and its replay (retention, a re-created half
    topic). The replay must still emit what the first run emitted, which released, checked or
    discarded it: so a body whose release, check request or discard is on its topic under one
    of this batch's record ids (``first_id`` on) counts as there, and the sink, finding that
    record by its transaction on its topic (its number may differ: the bodies gone change
    what the call emits before it), neither writes it again nor needs the body."""
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
        known = bucket.known_outcome(txid, now) if txid else None
        if (not txid or (tx is not None and tx.status is not Status.EARLY_END)
                or (known is not None and known[0] != Status.LOST.value)):
            # Known here: decided by this checkpoint, or read back from the history. A lost
            # release is looked for all the same: a coordinator before may have released its
            # half message sent again, and died before noting so.
            continue
        stored = half.stored_timestamp if half.stored_timestamp is not None else now
        since = min(anchor(half, now, policy), stored, now) - policy.max_clock_skew
        ids = wanted.setdefault(half.topic, {})
        ids[txid] = min(since, ids.get(txid, since))
    if not wanted:
        return []
    found = released_by_others(kafka, wanted, tag, ours)
    return [FoundReleased(txid, topic) for topic, ids in sorted(wanted.items())
            for txid in sorted(ids) if txid in found]


class KeyStep:
    """The per-key order of the coordinator, made once per query run.

    ``kafka``: where held half messages' bodies are read back from, and releases and replayed
    records looked for (None: a step whose state never holds one without its body, and that
    looks for nothing); ``max_body``: a bigger half message is dead-lettered (RocketMQ's
    maxMessageSize); ``max_record``: the largest record the coordinator may write
    (``--max-message-bytes``): a half message whose records would be bigger is refused as it
    comes, and a dead letter too big to carry the refused record carries a reference to it.
    """

    def __init__(self, policy: Policy, topics: Topics, kafka: KafkaSettings | None = None,
                 max_body: int = MAX_BODY_BYTES,
                 max_record: int = KAFKA_MAX_MESSAGE_BYTES) -> None:
        self.policy = policy
        self.topics = topics
        self.kafka = kafka
        self.max_body = max_body
        self.max_record = max_record
        self.tag = coordinator_tag(topics)
        self.bodies = BodySource(kafka, topics.half) if kafka is not None else None

    def run(self, state_key: int, bucket: Bucket, rows: Iterable[tuple[Any, ...]], now: int,
            ends_read: int) -> KeyOutput:
        """One call: ``rows`` (:data:`INPUT` tuples, in replay order) applied to ``bucket``
        (changed in place) at batch time ``now``, the end topic read to ``ends_read``."""
        call = KeyCall(state_key, bucket, now, ends_read, KeyTally(now))
        events = self.decode(call, rows)
        # A release found and a body gone are told first: no event or timer then claims to
        # write them.
        told: list[Event] = [*self.found_released(call), *self.bodies_gone(call, events)]
        self.apply_events(call, told + events)
        # Events first: a commit in this batch spares the transaction a check due now.
        self.run_timers(call)
        self.history(call)
        ids = self.take_numbers(call)
        timeout = self.timeout(call)
        state = None if timeout is None else bucket.encode()
        return KeyOutput(self.output(call, ids, timeout), state, timeout)

    def decode(self, call: KeyCall, rows: Iterable[tuple[Any, ...]]) -> list[Event]:
        """The call's events; a record that is no event becomes its dead letter, a recovered
        outcome is remembered; ``call.again`` gets the half messages a coordinator before this
        checkpoint may have read, or released (their ids in doubt)."""
        bucket, now, policy = call.bucket, call.now, self.policy
        events: list[Event] = []
        for kind, partition, offset, k, v, h, error, stamp in rows:
            if kind == EventKind.PROGRESS:
                continue
            if kind == EventKind.OUTCOME:
                bucket.recall_outcome(bytes(k).decode("utf-8"), bytes(v).decode("ascii"),
                                      now + policy.reserved_time, now)
                continue
            event = (parse_event(kind, k, v, h, partition, offset, self.max_body,
                                 self.max_record, stamp)
                     if error is None else Malformed(error, Code.UNREADABLE))
            if isinstance(event, Malformed):
                call.emits.append(dead_letter_of_record(kind, k, v, h, partition, offset, event,
                                                        self.topics, self.max_record))
                call.tally.count(Counted.DEAD_LETTERS, event.code)
            else:
                events.append(event)
                if isinstance(event, Message) and (kind == EventKind.HALF_AGAIN or (
                        event.transaction_id and bucket.in_doubt(event.transaction_id, now))):
                    call.again.append(event)
        return events

    def found_released(self, call: KeyCall) -> list[FoundReleased]:
        """The releases of ``call.again`` a coordinator before this checkpoint wrote."""
        if not call.again or self.kafka is None:
            return []
        bucket = call.bucket
        epoch = call.now if bucket.epoch is None else bucket.epoch
        ours = record_id(self.tag, call.state_key, epoch, 0).rsplit(".", 1)[0] + "."
        return _found_released(self.kafka, bucket, call.again, call.now, self.policy, self.tag,
                               ours)

    def bodies_gone(self, call: KeyCall, events: list[Event]) -> list[BodyGone]:
        """The bodies this call may write that are gone, as events (the sink reads the others
        again as it writes them: big bodies stay out of the JVM)."""
        bucket, now, policy = call.bucket, call.now, self.policy
        commits = [e.transaction_id for e in events if isinstance(e, EndEvent)
                   and e.decision is Decision.COMMIT_MESSAGE and e.transaction_id]
        wanted = bucket.bodies_wanted(commits, now, policy.timer_lead, policy, call.ends_read)
        if not wanted:
            return []
        if self.bodies is None:
            raise ValueError("held half messages need their bodies read back: the coordinator "
                             "function was made without Kafka settings")
        gone = gone_bodies(self.bodies, wanted)
        if gone and self.kafka is not None:
            # The ids this call will number its records from (take_numbers, below).
            epoch = now if bucket.epoch is None else bucket.epoch
            first_id = record_id(self.tag, call.state_key, epoch, bucket.next_number)
            gone = _not_written_before(self.kafka, self.topics, bucket, gone, now, first_id)
        return [BodyGone(txid, reason) for txid, reason in sorted(gone.items())]

    def apply_events(self, call: KeyCall, events: list[Event]) -> None:
        bucket = call.bucket
        for event in events:
            # Decoded here or by apply, once: an end event's transaction as it was.
            before = (bucket.get(event.transaction_id)
                      if isinstance(event, EndEvent) and event.transaction_id else None)
            effects = bucket.apply(event, call.now, self.policy)
            call.emits.extend(records_for(effects, self.topics, limit=self.max_record))
            call.notes.extend(e for e in effects if isinstance(e, Note))
            call.tally.applied(event, before, effects)

    def run_timers(self, call: KeyCall) -> None:
        """Timers due within the lead run now, as of their deadlines, and the sink holds their
        records until then: the batch's own run time is then mostly behind them."""
        now, policy = call.now, self.policy
        for at, fired in call.bucket.run_timers(now, policy.timer_lead, policy, call.ends_read):
            call.emits.extend(records_for(fired, self.topics, not_before=at if at > now else None,
                                          limit=self.max_record))
            call.notes.extend(e for e in fired if isinstance(e, Note))
            call.tally.effects(fired)

    def history(self, call: KeyCall) -> None:
        call.emits.extend(history_rows(call.notes, call.state_key, self.topics, self.max_record))

    def take_numbers(self, call: KeyCall) -> list[str | None]:
        """The ids of the call's records. Numbered before the state is saved: the numbers taken
        are part of this batch's state."""
        epoch, first = call.bucket.take_numbers(len(call.emits), call.now)
        return [record_id(self.tag, call.state_key, epoch, first + i)
                for i in range(len(call.emits))]

    def timeout(self, call: KeyCall) -> int | None:
        """When the key must next run, in ms after the batch's time (a check's deadline less
        the timer lead, any other timer's deadline); None: the key is empty."""
        wakeup = call.bucket.next_wakeup(self.policy.timer_lead, self.policy)
        # An empty key keeps no state; its next numbering starts at a later batch time.
        return None if wakeup is None else max(1, wakeup - call.now)

    def output(self, call: KeyCall, ids: list[str | None], timeout: int | None
               ) -> list[OutputRow]:
        """The call's records, numbered, and the timer row: the timeout as Spark arms it (the
        batch's time plus the duration) and the call's metrics."""
        armed = None if timeout is None else call.now + timeout
        emits = [*call.emits, timer_row(call.state_key, armed,
                                        call.tally.summary(call.state_key, call.bucket))]
        return output_rows(emits, [*ids, None], call.now)
