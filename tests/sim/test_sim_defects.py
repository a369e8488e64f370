"""The simulation catches each defect it was built for: put the old rule back, and a seeded
schedule breaks the promise.

Each case re-introduces one defect found by reading the code against the seeds, or by a run of
the simulation longer than the default, at the depth where it lived, as it was, and plays the
first seed that caught it (of the default run, ``pytest -m sim``, where it did). A change to
the simulation that moves its schedules may move the seed:
``TXSTREAM_SIM_SEEDS=400 pytest -m sim`` with the old rule put back (the patches here) finds
another. The consumer's retries are outside the simulation: ``tests/client/test_client_retry.py``;
so are the look's cost (``tests/readback/test_release_index.py``), a release the broker refuses
(``tests/sinks/test_refused_release.py``), a replay numbered otherwise than its crashed run
(defect 27, ``tests/readback/test_replay_guard.py``: no schedule of the simulation is known
to break with its old rule, 16,000 searched), the
answered-checks metric and the interval an answer restores
(``tests/state/test_check_rules.py``) and the data-loss flag (``tests/cli/test_config.py``).

The guards of a recovery each have a case of their own too (``GUARD``): the oracle must see
any of them taken out (``tests.sim.mutants``; ``TXSTREAM_SIM_MUTANT=all pytest -m sim`` counts the
schedules of a run that each one breaks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import txstream.client.check_choice as check_choice
import txstream.kafka.clients as clients
import txstream.kafka.read_back as read_back
import txstream.kafka.reading as reading
import txstream.readback.bodies as bodies
import txstream.readback.release_index as release_index
import txstream.readback.replay as replay
import txstream.sources.journal as journal
import txstream.sources.kafka_io as kafka_io
import txstream.sources.kafka_source as kafka_source
import txstream.sources.loss_watch as loss_watch
import txstream.sources.topic_watch as topic_watch
import txstream.state.bucket as bucket
import txstream.state.lifecycle as lifecycle
import txstream.state.timing as timing
import txstream.streaming.engine.key_step as key_step
import txstream.streaming.engine.transactions as transactions
from tests.sim import scenarios
from tests.sim.actors import COMMIT, Producers
from tests.sim.mutants import GUARDS
from tests.sim.oracle import Violation
from tests.sim.schedule import run
from txstream.outputs import CheckRequest
from txstream.sinks.delivery import Delivery
from txstream.state.effects import NoteKind, Release
from txstream.state.lifecycle import Action
from txstream.state.timing import anchor
from txstream.state.transaction import Status
from txstream.topics import Topics

pytestmark = pytest.mark.sim


def _stale_body_read(mp: pytest.MonkeyPatch) -> None:
    """1: a kept consumer re-assigned without clearing its state, and what it did not find
    taken as gone."""
    def assign(consumer: Any, tps: Any, starts: Any) -> None:
        consumer.assign(list(tps))
        for tp in tps:
            consumer.seek(tp, starts.get((tp.topic, tp.partition), 0))

    mp.setattr(reading, "_assign", assign)
    mp.setattr(bodies.BodySource, "_confirm", lambda self, found, missing: None)


def _no_recovery(mp: pytest.MonkeyPatch) -> None:
    """2: a new checkpoint reads the topics afresh, knowing nothing decided."""
    mp.setattr(journal.Journal, "starting", classmethod(lambda cls, ends, half_ends: None))


def _age_from_born_time(mp: pytest.MonkeyPatch) -> None:
    """3: the reserved time counted from the producer's born time (or a record timestamp)."""
    def born(tx: Any, policy: Any) -> int:
        return anchor(tx.half, tx.deadline, policy)

    mp.setattr(timing, "registered_at", born)
    mp.setattr(lifecycle, "registered_at", born)


def _discard_before_ends_read(mp: pytest.MonkeyPatch) -> None:
    """3: a discard that does not wait for the end topic to be read past its deadline."""
    mp.setattr(lifecycle, "waits_for_ends", lambda *args: False)
    mp.setattr(bucket, "waits_for_ends", lambda *args: False)


def _release_without_body(mp: pytest.MonkeyPatch) -> None:
    """4: "released" whether or not the body can be read back."""
    def release(tx: Any, end: Any, now: int, policy: Any) -> Any:
        detail = lifecycle._decision_detail(end)
        return lifecycle._resolved(tx, Status.COMMITTED, now, policy), [
            Release(tx.half, end.born_timestamp),
            lifecycle._note(tx.transaction_id, "released", now, **detail)]

    mp.setitem(lifecycle._ACTIONS, Action.RELEASE, release)


def _latest_made_not_due(mp: pytest.MonkeyPatch) -> None:
    """6: only an answer to the latest check made counts, even one held back till its due."""
    mp.setattr(lifecycle, "latest_visible_check", lambda tx, now: tx.checks_sent)


def _outcome_until_born_plus_reserved(mp: pytest.MonkeyPatch) -> None:
    """7: an outcome remembered until the half message's reserved time, so a discard for age
    is not remembered at all."""
    resolved = lifecycle._resolved

    def old(tx: Any, status: Status, now: int, policy: Any) -> Any:
        new = resolved(tx, status, now, policy)
        until = (timing.registered_at(tx, policy) + policy.reserved_time
                 if tx.half is not None else None)
        return dataclasses.replace(new, remember_until=until)

    mp.setattr(lifecycle, "_resolved", old)


def _expiry_on_producer_clock(mp: pytest.MonkeyPatch) -> None:
    """8: a request's validity compared with the producer's own clock."""
    choose = check_choice.CheckChoice.choose

    def remembering(self: Any, fetched: Any, now_ms: int) -> Any:
        self.producer_ms = now_ms
        return choose(self, fetched, now_ms)

    def expired(self: Any, req: Any) -> bool:
        return req.valid_until is not None and self.producer_ms > req.valid_until + self.grace_ms

    mp.setattr(check_choice.CheckChoice, "choose", remembering)
    mp.setattr(check_choice.CheckChoice, "expired", expired)


def _partitions_assumed(mp: pytest.MonkeyPatch) -> None:
    """9: end offsets and bodies asked of partitions a re-created half topic no longer has:
    a read waits for a leader that never comes (0.1 s here, not 30), then fails the batch."""
    mp.setattr(reading, "_existing", lambda consumer, tps: list(tps))
    mp.setattr(reading, "_listed", lambda consumer, topic, partition: True)
    mp.setattr(bodies.BodySource, "_partitions", lambda self: set(range(1 << 16)))
    mp.setattr(bodies, "_READ_TIMEOUT_S", 0.1)


def _answer_by_business_key(mp: pytest.MonkeyPatch) -> None:
    """10: an application that retries after a failed send and answers checks by business key
    (as the README's sample did): any attempt of a committed order is committed."""
    answer = Producers._answer

    def by_key(self: Any, txid: str, check: int) -> None:
        truth = self.ledger.tx.get(txid)
        if truth is not None and any(self.ledger.tx[t].decision is COMMIT
                                     for t in self.ledger.by_key[truth.plan.business_key]):
            self._write_end(truth, COMMIT, check)
            return
        answer(self, txid, check)

    mp.setattr(Producers, "_answer", by_key)


def _topic_ids_unread(mp: pytest.MonkeyPatch) -> None:
    """11 (a long run): a half topic deleted and created again is seen only by its offsets,
    so records written past the checkpoint's offset before it looks are never read."""
    mp.setattr(topic_watch, "topic_ids", lambda consumer, topics: {})


def _replay_trusts_the_body_read(mp: pytest.MonkeyPatch) -> None:
    """12 (a long run): a replay takes a body gone since its first run at its word, though
    that run released it: the replay emits another verdict than the records already written."""
    mp.setattr(key_step, "_not_written_before",
               lambda kafka, topics, bucket, gone, now, first: gone)


def _replay_looks_for_releases_only(mp: pytest.MonkeyPatch) -> None:
    """14 (a long run): a replay counts a body gone since its first run as there only when
    that run released it, not when it sent its check: the replay sends no check, and the
    producer's answer to the check the first run sent is not counted."""
    topics, written = Topics.with_prefix("sim_"), key_step.written_before

    def releases_only(settings: Any, wanted: Any, batch_ms: int, first_id: str) -> Any:
        return written(settings, {t: ids for t, ids in wanted.items()
                                  if not t.startswith(topics.check_prefix)
                                  and t != topics.discard}, batch_ms, first_id)

    mp.setattr(key_step, "written_before", releases_only)


def _releases_found_nowhere(mp: pytest.MonkeyPatch) -> None:
    """13 (a long run): a new checkpoint takes the history for every release, though the
    predecessor's last batch may have died between a release and its note."""
    mp.setattr(key_step, "_found_released", lambda *args: [])


def _notes_with_releases(mp: pytest.MonkeyPatch) -> None:
    """15: a task's history notes sent with its releases, not after them: a partition that
    refuses the release while the history's takes the note (a leader election, too few in-sync
    replicas) leaves a note a new checkpoint takes for the release."""
    send = Delivery.send

    def together(self: Any, rows: Any) -> None:
        send(self, rows)
        notes, self.notes = self.notes, []
        self._send_now(notes)

    mp.setattr(Delivery, "send", together)


def _foreign_horizon(mp: pytest.MonkeyPatch) -> None:
    """16: reading back stopped at another writer's record stamped 10 minutes before the
    horizon: records are not sent in their timestamps' order, and a release behind a few
    chunks of them was not found (a replay wrote it again)."""
    def older(rec: Any, horizon: int, own: Any) -> bool:
        ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp >= 0 else None
        foreign = horizon + read_back.SKEW_MARGIN_MS - 10 * 60_000
        return ts is not None and ts < (horizon if own(rec) else foreign)

    mp.setattr(read_back, "_own_and_older", older)


def _lost_recovered_as_committed(mp: pytest.MonkeyPatch) -> None:
    """17: a new checkpoint read a lost release back as committed: the half message sent
    again, which the promise releases, was taken for a duplicate."""
    mp.setitem(journal.OUTCOME_OF, NoteKind.RELEASE_LOST, "COMMITTED")


def _checks_by_number_only(mp: pytest.MonkeyPatch) -> None:
    """18: a producer ordered a transaction's checks by number alone: after a new checkpoint,
    which numbers from 1 again, it skipped the checks up to the last number it had answered."""
    mp.setattr(CheckRequest, "order", property(lambda self: (0, self.check_times)))


def _recovery_only_over_used_topics(mp: pytest.MonkeyPatch) -> None:
    """19 (a long run): a new checkpoint read the history back only when the half or end topic
    held records; over topics emptied since (retention, a topic created again), an end event
    that came later met no outcome, and was dead-lettered for having no half message."""
    recovery = kafka_source.KafkaEventReader._recovery

    def only_when_used(self: Any, why: str, half_ends: Any) -> Any:
        used = any(end > 0 for end in self._known_end.values())  # the ends just fetched
        return recovery(self, why, half_ends) if used or "new checkpoint" not in why else None

    mp.setattr(kafka_source.KafkaEventReader, "_recovery", only_when_used)
    # Bodies past the end of the recreated half topic gone at once, as when the seed was found
    # (defect 23's wait moves its schedule; the run fixed passes with either).
    mp.setattr(bodies, "SHORT_SETTLE_S", 0.0)


def _in_doubt_unsaid(mp: pytest.MonkeyPatch) -> None:
    """20 (a long run): the recovery handed only outcomes. A batch died after releasing a
    commit and before noting it, retention took its half message, a new checkpoint read the
    history back (half registered, no outcome): the producer's copy of the half message, sent
    after the reset began, was no copy read again, and was released a second time."""
    outcome_rows = journal.outcome_rows

    def outcomes_only(records: Any, layout: Any) -> Any:
        return (row for row in outcome_rows(records, layout) if row.value != b"IN_DOUBT")

    mp.setattr(kafka_source, "outcome_rows", outcomes_only)


def _readers_read_uncommitted(mp: pytest.MonkeyPatch) -> None:
    """21 (Kafka transactions): txstream's readers read uncommitted records. A batch died
    mid-transaction; its replay check found the dead attempt's aborted release and left it
    out, and the replay's committed note then stated a release no reader is ever handed."""
    mp.setitem(clients._CONSUMER_DEFAULTS, "isolation_level", "read_uncommitted")


def _transactional_id_per_checkpoint(mp: pytest.MonkeyPatch) -> None:
    """22 (Kafka transactions): a new checkpoint took a transactional id of its own. A batch
    died mid-transaction, a new checkpoint replaced its own: nothing fenced the dead task's
    id, its open transaction held the partition's last stable offset until its timeout, and
    the new checkpoint's release stayed out of every read_committed reader's sight."""
    made = iter(range(1_000_000))
    mp.setattr(transactions, "transactional_id_of", lambda half: f"txstream-{next(made)}")


def _short_end_is_gone(mp: pytest.MonkeyPatch) -> None:
    """23 (a replicated broker): a body the read-back did not find was gone, whatever the
    partition's end. A Kafka 4 leader short of in-sync replicas keeps its high watermark
    where it was (KIP-966): a committed message whose half message lay past it was
    dead-lettered as lost while its record was stored."""
    mp.setattr(bodies.BodySource, "short", lambda self, partition, offset: False)


def _short_end_waited_out(mp: pytest.MonkeyPatch) -> None:
    """23b: a partition ending short of a body was waited for ``SHORT_SETTLE_S`` whatever its
    replicas: a stall longer than that (a replica down for minutes) lost the message all the
    same."""
    mp.setattr(bodies, "troubles_of", lambda settings, topics: {})


def _checkpoint_on_a_stalled_end(mp: pytest.MonkeyPatch) -> None:
    """24: the source took a half partition's high watermark for its end while its leader was
    short of in-sync replicas. A new checkpoint began then: the half messages past the held
    high watermark, read and released before, were not marked as read again (0029), came in
    once it moved on, past the reserved time of the outcomes the history gave back, and were
    released a second time."""
    mp.setattr(kafka_source, "troubles_of", lambda settings, topics: {})


def _stalled_end_taken_for_loss(mp: pytest.MonkeyPatch) -> None:
    """24b: a partition seen ending below the checkpoint for ``loss_confirm_ms`` was taken for
    records lost, even while its leader was short of in-sync replicas. With
    fail_on_data_loss=false it was read again from its start, over the held high watermark:
    the half messages past it were not marked as read again, and one was released twice."""
    mp.setattr(loss_watch, "troubles_of", lambda settings, topics: {})


def _replay_check_over_a_held_end(mp: pytest.MonkeyPatch) -> None:
    """25: the replay check took what it did not find on a real topic for never written, while
    a partition's leader was short of in-sync replicas. A batch died after releasing a
    message without a key into that partition, past its held high watermark; its replay
    wrote it again, into another partition."""
    for name in ("unless_held", "unless_held_before_ends"):
        mp.setattr(replay, name, lambda settings, topic, looked_for: None)


def _lost_copy_taken_as_known(mp: pytest.MonkeyPatch) -> None:
    """26: a new checkpoint did not look for the release of a lost release's half message
    sent again: the history said LOST, so its predecessor's release of the copy (its last
    batch died before the note) was taken as never written, and the copy released again."""
    mp.setitem(lifecycle.TRANSITIONS, (Status.LOST, lifecycle.Trigger.FOUND_RELEASED),
               (Status.LOST, Action.IGNORE))


def _held_end_checked_after_the_ends(mp: pytest.MonkeyPatch) -> None:
    """28 (a long run): the look for a predecessor's releases and the replay check asked
    whether a partition's leader was short of in-sync replicas only after they took its ends.
    A batch died after releasing a message without a key past a held high watermark; the new
    checkpoint's look took the held end, then asked once the replicas were back, and passed:
    the message went out again, to another partition."""
    for module in (release_index, replay):
        mp.setattr(module, "unless_held_before_ends", lambda settings, topic, looked_for: None)


def _held_end_taken_for_gone(mp: pytest.MonkeyPatch) -> None:
    """29 (a long run): a task reading a planned batch took a partition ending at or before
    its records for records gone at once (fail_on_data_loss=false, after a topic was created
    again). A stall held the half partition's high watermark below a half message a crashed
    batch had planned; its replay skipped it, the checkpoint moved past it, and the
    transaction never ended."""
    def read(options: Any, part: Any) -> Any:
        try:
            yield from kafka_io.read_slice(options, part)
        except kafka_io.RecordsGone:
            return
    mp.setattr(kafka_source, "read_past_loss", read)


# (name, the old rule put back, a seed that breaks with it, what the oracle says). A negative
# seed plays its schedule on the ordered path (no Kafka transactions), where it was found.
DEFECTS: list[tuple[str, Callable[[pytest.MonkeyPatch], None], int, str]] = [
    ("1-stale-watermark", _stale_body_read, 288, "although its commit was written before"),
    ("2-fresh-checkpoint", _no_recovery, 202, "released 2 times"),
    ("3-born-time", _age_from_born_time, 12, "discarded for age"),
    ("3-ends-unread", _discard_before_ends_read, 126, "its commit was written before"),
    ("4-lost-body-released", _release_without_body, 126, "failed 3 times in a row"),
    ("6-valid-answer", _latest_made_not_due, 14, "was not counted"),
    ("7-age-discard-forgotten", _outcome_until_born_plus_reserved, 962, "ended twice"),
    ("8-producer-clock", _expiry_on_producer_clock, 6, "was not answered"),
    ("9-fewer-partitions", _partitions_assumed, 12, "failed 3 times in a row"),
    ("10-in-doubt-by-key", _answer_by_business_key, 3, "released twice"),
    ("11-recreated-topic", _topic_ids_unread, 264, "never ended"),
    ("12-replay-body-gone", _replay_trusts_the_body_read, 153, "the metrics count"),
    ("13-release-without-note", _releases_found_nowhere, 300, "released 2 times"),
    ("14-replay-check-body-gone", _replay_looks_for_releases_only, 55538, "was not counted"),
    ("15-note-before-release", _notes_with_releases, 1033, "the history says released"),
    ("16-foreign-timestamps", _foreign_horizon, 1452, "released 2 times"),
    ("17-lost-across-checkpoints", _lost_recovered_as_committed, 838, "was never released"),
    ("18-checks-by-number", _checks_by_number_only, 25, "was not answered"),
    ("19-recovery-over-emptied-topics", _recovery_only_over_used_topics, 200157,
     "no half message at .* while its outcome"),
    ("20-in-doubt-unsaid", _in_doubt_unsaid, -2983, "released 2 times"),
    ("21-readers-read-uncommitted", _readers_read_uncommitted, 142,
     "the history says released; it is not on its real topic"),
    ("22-transactional-id-per-checkpoint", _transactional_id_per_checkpoint, 359,
     "the history says released; it is not on its real topic"),
    ("23-short-end-is-gone", _short_end_is_gone, 92, "HALF_MESSAGE_LOST while its body"),
    ("23b-short-end-waited-out", _short_end_waited_out, 170,
     "HALF_MESSAGE_LOST while its body"),
    ("24-checkpoint-on-a-stalled-end", _checkpoint_on_a_stalled_end, 2450, "released 2 times"),
    ("24b-stalled-end-taken-for-loss", _stalled_end_taken_for_loss, 27860, "released 2 times"),
    ("25-replay-check-over-a-held-end", _replay_check_over_a_held_end, 1977,
     "released 2 times"),
    ("26-lost-copy-taken-as-known", _lost_copy_taken_as_known, 3685, "released 2 times"),
    ("28-held-end-checked-after-the-ends", _held_end_checked_after_the_ends, 15030,
     "released 2 times"),
    ("29-held-end-taken-for-gone", _held_end_taken_for_gone, 67913, "never ended"),
    # Each recovery guard taken out: the oracle must see each (it once saw neither of the
    # first two).
    ("guard-journal", GUARDS["journal"], 19, "released 2 times"),
    ("guard-look", GUARDS["look"], 300, "released 2 times"),
    ("guard-replay-check", GUARDS["replay-check"], 6, "released 2 times"),
    ("guard-record-ids", GUARDS["record-ids"], 6, "released 2 times"),
    ("guard-topic-ids", GUARDS["topic-ids"], 264, "never ended"),
    ("guard-held-look", GUARDS["held-look"], 37, "released 2 times"),
]


@pytest.mark.parametrize(("patch", "seed", "broken"), [d[1:] for d in DEFECTS],
                         ids=[d[0] for d in DEFECTS])
def test_the_simulation_catches_the_defect(monkeypatch: pytest.MonkeyPatch,
                                           patch: Callable[[pytest.MonkeyPatch], None],
                                           seed: int, broken: str) -> None:
    if seed < 0:  # the seed's schedule found on the ordered path, before transactions
        monkeypatch.setattr(scenarios, "TRANSACTIONS", False)
        seed = -seed
    run(seed)  # the fixed code keeps the promise on this schedule
    patch(monkeypatch)
    with pytest.raises((Violation, Exception), match=broken):
        run(seed)
