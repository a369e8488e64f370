"""What one state key did in one micro-batch, by label: the coordinator's metrics at their source.

The operator runs once per state key per batch and emits one timer row per key
(:func:`txstream.streaming.engine.records.timer_row`). That row also carries a :class:`KeyTally` of
the call, as compact JSON in its ``value``: counts by metric and labels, histogram bucket counts,
and what the key holds open now (unresolved transactions by status and producer group, the
oldest born time of a pending one). The query observes the list of these summaries per batch
(``collect_list``, a few hundred small strings at most, not one per transaction), and the
driver folds them (:mod:`txstream.streaming.engine.metric_totals`). Per-row labels cannot be
aggregated with ``observe`` directly; per key they can, in the worker, for the price of a small
dict (docs/decisions/0020-metrics.md).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from typing import Any

from txstream.message import Decision, EndEvent, Message
from txstream.outputs import encode_compact
from txstream.refusals import Code
from txstream.state.bucket import Bucket
from txstream.state.effects import (
    BodyLost,
    DeadLetter,
    Discard,
    DiscardCause,
    Effect,
    Note,
    NoteKind,
    Release,
    RequestCheck,
)
from txstream.state.transaction import Transaction

__all__ = ["BUCKETS_MS", "Counted", "Timed", "KeyTally", "OUTCOME", "KEY_SUMMARIES",
           "bucket_of", "decode_summary"]

# The query's observed column that lists the keys' summaries of a batch.
KEY_SUMMARIES = "key_summaries"

# Histogram bounds (ms), shared by the driver's batch durations: tens of ms to a minute.
BUCKETS_MS = (25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000)


def bucket_of(ms: int) -> int:
    """The histogram bucket of ``ms``: the first bound at or above it (len(BUCKETS_MS): past
    every bound)."""
    return bisect_left(BUCKETS_MS, ms)


class Counted:
    """The counters a key tallies: each one's label names, in order, and what it counts (the
    metric's help; Prometheus appends ``_total`` to ``txstream_NAME``)."""

    HALF_MESSAGES = "half_messages"
    COMMITS = "commits"
    ROLLBACKS = "rollbacks"
    CHECKS_SENT = "checks_sent"
    CHECKS_ANSWERED = "checks_answered"
    DISCARDS = "discards"
    DEAD_LETTERS = "dead_letters"
    REJECTED = "rejected"
    DUPLICATES = "duplicates"
    EXPIRED = "expired"
    # Counted on the driver from the sink's commits (txstream.sinks.refusal_log), not by keys.
    RELEASES_REFUSED = "releases_refused"

    LABELS: Mapping[str, tuple[str, ...]] = {
        HALF_MESSAGES: ("producer_group", "topic"),
        COMMITS: ("producer_group", "topic"),
        ROLLBACKS: ("producer_group", "topic"),
        CHECKS_SENT: ("producer_group", "topic"),
        CHECKS_ANSWERED: ("producer_group", "outcome"),
        DISCARDS: ("producer_group", "topic", "reason"),
        DEAD_LETTERS: ("reason",),
        REJECTED: (),
        DUPLICATES: (),
        EXPIRED: (),
        RELEASES_REFUSED: ("producer_group", "topic", "reason"),
    }
    HELP: Mapping[str, str] = {
        HALF_MESSAGES: "half messages registered",
        COMMITS: "messages released to their real topic (committed transactions)",
        ROLLBACKS: "transactions rolled back",
        CHECKS_SENT: "back-checks sent to producers",
        CHECKS_ANSWERED: "back-check answers counted, by the producer's outcome",
        DISCARDS: "half messages discarded, by reason (check max or reserved time)",
        DEAD_LETTERS: "records refused to the dead-letter topic, by refusal code",
        REJECTED: "end events refused (wrong group, contradicting decision)",
        DUPLICATES: "duplicate half messages or end events recognised",
        EXPIRED: "end events dead-lettered because their half message never came",
        RELEASES_REFUSED: "committed messages the broker refused to take on their real topic "
                          "(dead-lettered), by refusal code; not counted as commits",
    }


class Timed:
    """The histograms a key tallies (milliseconds), and what each times (its help)."""

    COMMIT_TO_VISIBLE = "commit_to_visible"  # a commit's send to its release
    CHECK_LATENESS = "check_lateness"  # a back-check's deadline to its sending

    HELP: Mapping[str, str] = {
        COMMIT_TO_VISIBLE: "time from a commit's send to its message's release",
        CHECK_LATENESS: "time a back-check was sent after it was due",
    }
    ALL = tuple(HELP)


# The ``outcome`` label of an answered check.
OUTCOME = {Decision.COMMIT_MESSAGE: "commit", Decision.ROLLBACK_MESSAGE: "rollback",
           Decision.UNKNOW: "unknown"}

_Labels = tuple[str, ...]
# The history notes :meth:`KeyTally._note` counts, and the counter of each.
_COUNTED_NOTES = {NoteKind.HALF: Counted.HALF_MESSAGES, NoteKind.ROLLED_BACK: Counted.ROLLBACKS,
                  NoteKind.REJECTED: Counted.REJECTED, NoteKind.DUPLICATE: Counted.DUPLICATES,
                  NoteKind.EXPIRED: Counted.EXPIRED}


class KeyTally:
    """Counts and timings of one operator call (one key, one batch), at batch time ``now``."""

    __slots__ = ("counts", "now", "timings")

    def __init__(self, now: int) -> None:
        self.now = now
        self.counts: dict[tuple[str, _Labels], int] = {}
        self.timings: dict[str, list[int]] = {}

    def count(self, name: str, *labels: str | None) -> None:
        key = (name, tuple([label or "" for label in labels]))  # a list: no generator frame
        self.counts[key] = self.counts.get(key, 0) + 1

    def time(self, name: str, ms: int) -> None:
        self.timings.setdefault(name, []).append(max(0, ms))

    def applied(self, event: object, before: Transaction | None,
                effects: Iterable[Effect]) -> None:
        """An event applied to the key, the effects it had; ``before``: its transaction as
        it was (the group and topic of a rollback: a resolved transaction keeps no body)."""
        effects = list(effects)
        if isinstance(event, EndEvent) and event.from_check and _counted(before, effects):
            self.count(Counted.CHECKS_ANSWERED, event.producer_group, OUTCOME[event.decision])
        half = event if isinstance(event, Message) else before.half if before else None
        self.effects(effects, half)

    def effects(self, effects: Iterable[Effect], half: Message | None = None) -> None:
        """The core's effects (of an event, or of timers: ``half`` None)."""
        for effect in effects:
            # A note first: nearly every event has one, and only some kinds are counted.
            if isinstance(effect, Note):
                if effect.event in _COUNTED_NOTES:
                    self._note(effect, half)
            elif isinstance(effect, Release):
                self.count(Counted.COMMITS, effect.message.producer_group, effect.message.topic)
                if effect.committed_at is not None:
                    self.time(Timed.COMMIT_TO_VISIBLE, self.now - effect.committed_at)
            elif isinstance(effect, RequestCheck):
                self.count(Counted.CHECKS_SENT, effect.message.producer_group,
                           effect.message.topic)
                self.time(Timed.CHECK_LATENESS, effect.late_ms)
            elif isinstance(effect, Discard):
                self.count(Counted.DISCARDS, effect.message.producer_group, effect.message.topic,
                           effect.cause)
            elif isinstance(effect, DeadLetter):
                self.count(Counted.DEAD_LETTERS, effect.code)
            elif isinstance(effect, BodyLost):
                # Not released, not on the discard topic: a dead letter says why.
                self.count(Counted.DEAD_LETTERS, Code.HALF_MESSAGE_LOST)
                if effect.instead_of == "discard":
                    self.count(Counted.DISCARDS, effect.message.producer_group,
                               effect.message.topic, DiscardCause.HALF_MESSAGE_LOST)

    def _note(self, note: Note, half: Message | None) -> None:
        name = _COUNTED_NOTES[note.event]
        if note.event == NoteKind.HALF:
            self.count(name, _text(note.detail.get("group")), _text(note.detail.get("topic")))
        elif note.event == NoteKind.ROLLED_BACK:
            self.count(name, half.producer_group if half else None, half.topic if half else None)
        else:
            self.count(name)

    def summary(self, key: int, bucket: Bucket) -> bytes:
        """This call's tally and what ``bucket`` holds open now, as compact JSON."""
        doc: dict[str, Any] = {"k": key}
        if self.counts:
            doc["c"] = [[name, *labels, n] for (name, labels), n in self.counts.items()]
        if self.timings:
            doc["h"] = {name: _buckets(values) for name, values in self.timings.items()}
        open_counts, oldest = bucket.open_counts()
        if open_counts:
            doc["p"] = [[status, group, n] for (status, group), n in open_counts.items()]
        if oldest is not None:
            doc["o"] = oldest
        return encode_compact(doc)


# The notes of an answer that decided its transaction.
_DECIDED = frozenset({NoteKind.RELEASED, NoteKind.RELEASE_LOST, NoteKind.ROLLED_BACK})


def _counted(before: Transaction | None, effects: list[Effect]) -> bool:
    """Whether the core counted an answer to a back-check, as its notes say: it decided the
    transaction, or (UNKNOW) it raised the answered checks. A stale answer, a copy, another
    group's or one to a resolved transaction did neither."""
    answered = before.checks_answered if before is not None else 0
    for effect in effects:
        if not isinstance(effect, Note):
            continue
        now_answered = effect.detail.get("checks_answered")
        if effect.event in _DECIDED or (effect.event == NoteKind.UNKNOWN
                                        and isinstance(now_answered, int)
                                        and now_answered > answered):
            return True
    return False


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _buckets(values: list[int]) -> list[int]:
    """Per-bucket counts (not cumulative; the last one past every bound), then the sum (ms)."""
    counts = [0] * (len(BUCKETS_MS) + 1)
    for value in values:
        counts[bucket_of(value)] += 1
    return [*counts, sum(values)]


def decode_summary(text: str) -> dict[str, Any]:
    """A key's summary as :meth:`KeyTally.summary` wrote it."""
    doc: dict[str, Any] = json.loads(text)
    return doc
