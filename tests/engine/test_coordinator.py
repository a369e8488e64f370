"""The coordinator query end to end: real tansu broker, real local Spark, wire-format records.

One coordinator serves the module (short timeouts); each test uses its own transactions,
groups and real topics. The restart test runs its own coordinator on its own checkpoint.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.kafka_helpers import (
    end_record,
    half_record,
    headers_of,
    history_of,
    now_ms,
    produce,
    read_topic,
    wait_for,
    wait_until,
)
from tests.support.process_helpers import batch_ids
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.topics import Topics
from txstream.wire import Record

pytestmark = pytest.mark.spark

POLICY = Policy(
    transaction_timeout=2000,
    check_interval=2000,
    check_max=2,
    orphan_end_timeout=3000,
    resolved_retention=120_000,
)
COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW


@dataclass
class Running:
    kafka: KafkaSettings
    topics: Topics
    query: object


def _config(kafka: KafkaSettings, topics: Topics, checkpoint: Path, name: str) -> RunConfig:
    return RunConfig(kafka=kafka, topics=topics, policy=POLICY, checkpoint_dir=checkpoint,
                     buckets=8, query_name=name)


def _wait_started(query: object, kafka: KafkaSettings, topics: Topics) -> None:
    """The query answers: a transaction sent now comes out released."""
    txid, real = f"warmup-{uuid.uuid4().hex[:8]}", f"{topics.half}_warmup"
    produce(kafka, [half_record(topics, txid, "warmup", real),
                    end_record(topics, txid, "warmup", COMMIT)])
    wait_for(kafka, real, 1, timeout_s=120)


@pytest.fixture(scope="module")
def coordinator(spark, kafka, tmp_path_factory) -> Running:
    topics = Topics.with_prefix(f"c{uuid.uuid4().hex[:8]}_")
    cfg = _config(kafka, topics, tmp_path_factory.mktemp("cp"), f"coord-{uuid.uuid4().hex[:6]}")
    query = start_coordinator(spark, cfg)
    _wait_started(query, kafka, topics)
    yield Running(kafka, topics, query)
    query.stop()


def _ids(unique: str) -> tuple[str, str, str]:
    return f"{unique}-tx", f"{unique}-group", f"{unique}-real"


def test_commit_releases_once_with_body_keys_and_properties(coordinator: Running, unique: str):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    produce(k, [half_record(t, txid, group, real, b"hello", tags="TagA", keys="KEY1",
                            properties={"color": "blue"}),
                end_record(t, txid, group, COMMIT)])
    [visible] = wait_for(k, real, 1)
    assert visible.value == b"hello"
    assert visible.key == b"KEY1"
    h = headers_of(visible)
    assert h["TAGS"] == "TagA" and h["color"] == "blue" and h["UNIQ_KEY"] == txid

    produce(k, [end_record(t, txid, group, COMMIT)])  # a duplicate commit
    wait_until(lambda: any(n["event"] == "duplicate" for n in history_of(k, t, txid)))
    assert len(read_topic(k, real)) == 1


def test_rollback_is_never_visible_and_a_later_commit_is_rejected(
    coordinator: Running, unique: str
):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    produce(k, [half_record(t, txid, group, real), end_record(t, txid, group, ROLLBACK)])
    wait_until(lambda: any(n["event"] == "rolled_back" for n in history_of(k, t, txid)))
    produce(k, [end_record(t, txid, group, COMMIT)])
    dead = wait_until(lambda: [r for r in read_topic(k, t.dead_letter) if r.key == txid.encode()])
    assert "already ROLLED_BACK" in headers_of(dead[0])["DLQ_REASON"]
    assert read_topic(k, real) == []


def test_unknown_is_checked_at_the_configured_times(coordinator: Running, unique: str):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    born = now_ms()
    produce(k, [half_record(t, txid, group, real, born_ms=born),
                end_record(t, txid, group, UNKNOW)])
    checks = wait_for(k, t.check(group), 3, timeout_s=60)
    numbers = [int(headers_of(r)["TRANSACTION_CHECK_TIMES"]) for r in checks]
    assert numbers[:3] == [1, 2, 3]
    # When each check was decided (the batch time), from the history: exact, unlike the
    # record timestamps, which add the sink's variable send delay.
    asked = [n["at"] for n in history_of(k, t, txid) if n["event"] == "check_sent"]
    assert asked[0] >= born + POLICY.transaction_timeout
    assert asked[1] >= asked[0] + POLICY.check_interval
    # Not a timing measure (the benchmarks are): a check many intervals late would
    # show here, but a loaded CI machine takes seconds per batch (9.5 s seen).
    written_late = checks[0].timestamp - (born + POLICY.transaction_timeout)
    assert 0 <= written_late < 15000, "first check far too late"
    assert checks[0].value == b"body" and headers_of(checks[0])["REAL_TOPIC"] == real
    # Unanswered checks do not count: three were asked (check_max=2) and nothing is discarded.
    assert not [r for r in read_topic(k, t.discard) if r.key == txid.encode()]


def test_max_answered_checks_discard_with_reason(coordinator: Running, unique: str):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    produce(k, [half_record(t, txid, group, real, b"give up")])
    answered: set[int] = set()

    def discarded() -> list[object]:
        # The producer answers every check UNKNOW. An answer read after the next check fell
        # due (a slow machine, the timer lead) does not count, so the discard comes after
        # exactly check_max counted answers, whatever the timing.
        for r in read_topic(k, t.check(group)):
            number = int(headers_of(r)["TRANSACTION_CHECK_TIMES"])
            if number not in answered:
                answered.add(number)
                produce(k, [end_record(t, txid, group, UNKNOW, from_check=True,
                                       check_times=number)])
        return [r for r in read_topic(k, t.discard) if r.key == txid.encode()]

    [discard] = wait_until(discarded, timeout_s=60)
    h = headers_of(discard)
    assert discard.value == b"give up"
    assert h["TRANSACTION_CHECK_TIMES"] == "2"
    assert "after 2 answered checks (check_max=2)" in h["DISCARD_REASON"]
    assert read_topic(k, real) == []


def test_wrong_producer_group_goes_to_dead_letter_and_changes_nothing(
    coordinator: Running, unique: str
):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    produce(k, [half_record(t, txid, group, real), end_record(t, txid, "intruder", COMMIT)])
    dead = wait_until(lambda: [r for r in read_topic(k, t.dead_letter) if r.key == txid.encode()])
    assert "'intruder' does not own" in headers_of(dead[0])["DLQ_REASON"]
    assert read_topic(k, real) == []
    produce(k, [end_record(t, txid, group, COMMIT)])
    wait_for(k, real, 1)


def test_malformed_records_are_dead_lettered_and_the_query_keeps_running(
    coordinator: Running, unique: str
):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    bad = [
        half_record(t, "unused", group, real, b"no key")._replace(key=None),
        Record(t.end, f"{unique}-x".encode(), b"", (("COMMIT_OR_ROLLBACK", b"MAYBE"),
                                                     ("PGROUP", b"g"))),
        Record(t.end, f"{unique}-y".encode(), b"\xff", (("COMMIT_OR_ROLLBACK", b"\xff\xfe"),)),
    ]
    produce(k, bad)
    produce(k, [half_record(t, txid, group, real), end_record(t, txid, group, COMMIT)])
    wait_for(k, real, 1)

    def dead_letter_reasons() -> dict[bytes, str]:
        found = {
            r.value: headers_of(r)["DLQ_REASON"]
            for r in read_topic(k, t.dead_letter)
            if r.value in (b"no key", b"\xff") or r.key == f"{unique}-x".encode()
        }
        return found if len(found) == 3 else {}

    # Written by another task of the batch (their keys route nowhere): maybe a moment later.
    reasons = wait_until(dead_letter_reasons)
    assert "missing transaction id" in reasons[b"no key"]
    assert "not UTF-8" in reasons[b"\xff"]
    assert any("unknown event type" in v for v in reasons.values())
    assert coordinator.query.isActive


def test_end_event_before_its_half_message_is_applied_when_it_arrives(
    coordinator: Running, unique: str
):
    k, t = coordinator.kafka, coordinator.topics
    txid, group, real = _ids(unique)
    produce(k, [end_record(t, txid, group, COMMIT)])
    wait_until(lambda: any(n["event"] == "end_before_half" for n in history_of(k, t, txid)))
    produce(k, [half_record(t, txid, group, real, b"late half")])
    [visible] = wait_for(k, real, 1)
    assert visible.value == b"late half"


def test_restart_from_checkpoint_releases_nothing_twice_and_loses_nothing(
    spark, kafka: KafkaSettings, topics: Topics, checkpoint_dir: Path, unique: str
):
    group, real = f"{unique}-group", f"{unique}-real"
    cfg = _config(kafka, topics, checkpoint_dir, f"restart-{unique}")
    query = start_coordinator(spark, cfg)
    _wait_started(query, kafka, topics)
    produce(kafka, [half_record(topics, "a", group, real, b"A"),
                    end_record(topics, "a", group, COMMIT),
                    half_record(topics, "b", group, real, b"B")])
    wait_for(kafka, real, 1)
    wait_until(lambda: any(n["event"] == "half" for n in history_of(kafka, topics, "b")))
    query.stop()

    # While it is down: the pending one is committed, a new one comes and goes.
    produce(kafka, [end_record(topics, "b", group, COMMIT),
                    half_record(topics, "c", group, real, b"C"),
                    end_record(topics, "c", group, COMMIT)])
    query = start_coordinator(spark, cfg)
    records = wait_for(kafka, real, 3, timeout_s=120)
    time.sleep(2)  # a duplicate would come with the first batches after the restart
    bodies = sorted(r.value for r in read_topic(kafka, real))
    assert bodies == [b"A", b"B", b"C"], records
    query.stop()


def test_an_idle_coordinator_runs_a_batch_only_when_a_timer_is_due_also_after_a_restart(
    spark, kafka: KafkaSettings, topics: Topics, checkpoint_dir: Path, unique: str
):
    group, real = f"{unique}-group", f"{unique}-real"
    cfg = _config(kafka, topics, checkpoint_dir, f"idle-{unique}")
    query = start_coordinator(spark, cfg)
    _wait_started(query, kafka, topics)
    produce(kafka, [half_record(topics, "x", group, real, b"X")])  # never answered
    wait_until(lambda: any(n["event"] == "half" for n in history_of(kafka, topics, "x")))
    query.stop()
    # The timer armed before the stop fires after the restart: the schedule is in the checkpoint.
    query = start_coordinator(spark, cfg)
    wait_for(kafka, topics.check(group), 3, timeout_s=60)

    def checks_noted() -> list[int] | None:  # the notes' topic may be read a moment later
        at = [n["at"] for n in history_of(kafka, topics, "x") if n["event"] == "check_sent"]
        return at if len(at) >= 3 else None

    asked = wait_until(checks_noted, timeout_s=30)
    # While idle, each check comes on time (Spark's batches would otherwise run back to back);
    # unanswered, the third comes two intervals after the second (state.timing.check_spacing).
    assert 0 <= asked[2] - (asked[1] + 2 * POLICY.check_interval) < 1000, asked
    done = batch_ids(checkpoint_dir, "commits")
    time.sleep(POLICY.check_interval * 2.2 / 1000)
    # About one batch per check; back to back, a batch takes a fraction of a second.
    assert len(batch_ids(checkpoint_dir, "commits") - done) <= 4

    produce(kafka, [end_record(topics, "x", group, COMMIT)])
    wait_for(kafka, real, 1)
    time.sleep(1)  # the batch that released it commits
    done = batch_ids(checkpoint_dir, "commits")
    time.sleep(3)
    # Nothing is due before the resolved transaction's retention (120 s): no batch at all.
    assert batch_ids(checkpoint_dir, "commits") == done
    query.stop()
