"""Releases in Kafka transactions where the broker has them (docs/decisions/0032-transactions.md),
on Apache Kafka: a sink task's records land together or not at all; a task killed
mid-transaction leaves nothing a read_committed reader sees, and its replay releases each
message once; a record the broker refuses is dead-lettered in a new transaction.
``--transactions off`` keeps the ordered path (0030)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import KafkaAdminClient

from tests.support.kafka_helpers import release_rows
from txstream.kafka import KafkaSettings, make_consumer, partition_ends
from txstream.kafka.reading import read_topic as read_committed
from txstream.outputs import decode_history
from txstream.schema import Kind
from txstream.sinks.delivery import Delivery
from txstream.sinks.kafka_sink import SinkOptions, send_rows
from txstream.sinks.transactional import TransactionalDelivery
from txstream.topics import Topics


class Killed(Exception):
    """The task's process dying, as the sink sees it: nothing after this point runs."""



def read_uncommitted(settings: KafkaSettings, topic: str) -> list[Any]:
    """Every record of partition 0 of ``topic``, aborted ones too."""
    from txstream.kafka import TopicPartition

    consumer = make_consumer(settings, isolation_level="read_uncommitted")
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        out: list[Any] = []
        for _ in range(50):
            for recs in consumer.poll(timeout_ms=100).values():
                out.extend(recs)
            hw = consumer.highwater(tp)
            if hw is not None and (consumer.position(tp) or 0) >= hw:
                break
        return out
    finally:
        consumer.close()


def _notes(settings: KafkaSettings, topics: Topics) -> list[str]:
    return [f"{n['transaction_id']}:{n['event']}" for r in read_committed(settings, topics.history)
            for n in decode_history(r.value)]


def _topics(settings: KafkaSettings, unique: str, real_configs: dict[str, str] | None = None
            ) -> tuple[Topics, str]:
    topics, real = Topics.with_prefix(f"{unique}_"), f"{unique}-orders"
    admin = KafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    try:
        # One partition each: the tests read partition 0 and name where records land.
        admin.create_topics({real: {"num_partitions": 1, "configs": real_configs or {}},
                             topics.history: {"num_partitions": 1},
                             topics.dead_letter: {"num_partitions": 1}}, wait_for_metadata=True)
    finally:
        admin.close()
    return topics, real


def test_a_task_killed_mid_transaction_leaves_nothing_and_its_replay_releases_once(
        apache_kafka_settings: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    settings = apache_kafka_settings
    topics, real = _topics(settings, unique)
    options = SinkOptions(kafka=settings, transactional_id=f"txstream-{unique}",
                          dead_letter_topic=topics.dead_letter)

    def die(self: TransactionalDelivery) -> None:  # the releases sent and acknowledged
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(TransactionalDelivery, "_note_dead_letters", die)
        with pytest.raises(Killed):
            send_rows(options, release_rows(real, topics))
    # The releases reached the broker, in a transaction left open: no reader that reads
    # committed records sees them, nor waits for them.
    assert len(read_uncommitted(settings, real)) == 3
    assert partition_ends(settings, real) == {0: 0}  # the last stable offset, not the end
    assert read_committed(settings, real) == [] and _notes(settings, topics) == []

    commit = send_rows(options, release_rows(real, topics))  # the task run again: a replay
    assert commit.counts == {Kind.VISIBLE: 3, Kind.HISTORY: 3} and commit.already_written == 0
    assert [r.value for r in read_committed(settings, real)] == [b"body 0", b"body 1", b"body 2"]
    assert _notes(settings, topics) == ["tx-0:released", "tx-1:released", "tx-2:released"]
    # Once more (the batch's commit was lost): the replay check finds all of it.
    assert send_rows(options, release_rows(real, topics)).already_written == 6
    assert len(read_committed(settings, real)) == 3 and len(_notes(settings, topics)) == 3


def test_a_refused_release_is_dead_lettered_in_a_new_transaction(
        apache_kafka_settings: KafkaSettings, unique: str) -> None:
    settings = apache_kafka_settings
    topics, real = _topics(settings, unique, {"max.message.bytes": "1200"})
    rows = release_rows(real, topics, n=2)
    big = rows[2]._replace(value=b"x" * 5000)  # tx-1's release: over the topic's limit
    options = SinkOptions(kafka=settings, transactional_id=f"txstream-{unique}",
                          dead_letter_topic=topics.dead_letter)
    commit = send_rows(options, [rows[0], rows[1], big, rows[3]])
    assert commit.counts == {Kind.VISIBLE: 1, Kind.DEAD_LETTER: 1, Kind.HISTORY: 2}
    # The first transaction was aborted after the broker refused the big release: its
    # records are in the log, and a read_committed reader sees none of them.
    assert len(read_uncommitted(settings, real)) == 2
    assert [r.value for r in read_committed(settings, real)] == [b"body 0"]
    [dead] = read_committed(settings, topics.dead_letter)
    assert dead.key == b"tx-1"
    notes = [n for r in read_committed(settings, topics.history) for n in decode_history(r.value)]
    assert [(n["transaction_id"], n["event"]) for n in notes] == [
        ("tx-0", "released"), ("tx-1", "release_refused")]
    assert notes[1]["dead_letter"] == f"0@{dead.offset}"


def test_with_transactions_off_the_ordered_path_holds(
        apache_kafka_settings: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    settings = apache_kafka_settings
    topics, real = _topics(settings, unique)
    options = SinkOptions(kafka=settings, dead_letter_topic=topics.dead_letter)
    acknowledged = Delivery._acknowledged

    def die_before_notes(self: Delivery) -> None:
        acknowledged(self)
        if not any(row.kind == Kind.HISTORY for (row, _), _f in self.futures):
            raise Killed  # the releases acknowledged, the notes not sent

    with monkeypatch.context() as patch:
        patch.setattr(Delivery, "_acknowledged", die_before_notes)
        with pytest.raises(Killed):
            send_rows(options, release_rows(real, topics))
    # No transaction: the releases are there for every reader, and no note without them.
    assert len(read_committed(settings, real)) == 3 and _notes(settings, topics) == []
    commit = send_rows(options, release_rows(real, topics))
    assert commit.already_written == 3 and commit.counts == {Kind.HISTORY: 3}
    assert len(read_committed(settings, real)) == 3
    assert _notes(settings, topics) == ["tx-0:released", "tx-1:released", "tx-2:released"]


def _first_run_of_a_task(settings: KafkaSettings, unique: str,
                         monkeypatch: pytest.MonkeyPatch) -> tuple[Topics, str, SinkOptions]:
    """The topics and transactional sink options of a task that is no replay (attempt 0 of
    a batch after the run's first)."""
    topics, real = _topics(settings, unique)
    monkeypatch.setattr("txstream.sinks.kafka_sink.replay_suspected", lambda: False)
    return topics, real, SinkOptions(kafka=settings, transactional_id=f"txstream-{unique}",
                                     dead_letter_topic=topics.dead_letter)


def test_a_producer_fenced_by_another_takes_its_id_back(
        apache_kafka_settings: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # Another worker process ran this partition's task of a later batch: its producer of the
    # same transactional id fenced this process's cached one.
    from txstream.kafka.transactions import make_transactional_producer

    settings = apache_kafka_settings
    topics, real, options = _first_run_of_a_task(settings, unique, monkeypatch)
    rows = release_rows(real, topics, n=2)
    send_rows(options, rows[:2])
    other = make_transactional_producer(settings, f"txstream-{unique}-0")
    other.close()
    commit = send_rows(options, rows[2:])
    assert commit.counts == {Kind.VISIBLE: 1, Kind.HISTORY: 1}
    assert [r.value for r in read_committed(settings, real)] == [b"body 0", b"body 1"]
    assert _notes(settings, topics) == ["tx-0:released", "tx-1:released"]


def test_a_fenced_task_finds_what_another_attempt_of_it_committed(
        apache_kafka_settings: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    # Two worker processes, one transactional id: this process's producer (kept in the
    # process's cache) is fenced by another's that committed this very task (a zombie's
    # view: the task was run again elsewhere). Its one-record look finds the other's commit
    # and the full check writes nothing twice.
    from txstream.kafka import clients

    settings = apache_kafka_settings
    topics, real, options = _first_run_of_a_task(settings, unique, monkeypatch)
    rows = release_rows(real, topics, n=3)
    send_rows(options, rows[:2])  # an earlier batch: this process's producer, kept
    [key] = [k for k in clients._CACHED if k[0] == "sink-tx" and k[1].startswith(
        f"txstream-{unique}")]
    ours = clients._CACHED.pop(key)
    try:
        other = send_rows(options, rows[2:])  # the other process: a new producer, committed
        assert other.counts == {Kind.VISIBLE: 2, Kind.HISTORY: 2}
    finally:
        clients.drop_cached_client(key)
        clients._CACHED[key] = ours  # back in this process, its producer fenced
    again = send_rows(options, rows[2:])
    assert again.already_written == 4 and again.counts == {}
    assert [r.value for r in read_committed(settings, real)] == [b"body 0", b"body 1",
                                                                  b"body 2"]
    assert _notes(settings, topics) == ["tx-0:released", "tx-1:released", "tx-2:released"]


def test_the_coordinator_on_apache_kafka_releases_in_transactions(
        spark: Any, apache_kafka_settings: KafkaSettings, unique: str, tmp_path: Any) -> None:
    # End to end: --transactions auto probes the broker, keeps the answer in the checkpoint
    # and gives the sink the checkpoint's transactional id; a commit is released once.
    import json

    from tests.support.kafka_helpers import (
        end_record,
        half_record,
        history_of,
        produce,
        wait_for,
        wait_until,
    )
    from txstream.message import Decision
    from txstream.state.policy import Policy
    from txstream.streaming.engine.config import RunConfig
    from txstream.streaming.engine.query import resolve_transactions, start_coordinator

    settings, topics = apache_kafka_settings, Topics.with_prefix(f"{unique}_")
    config = RunConfig(kafka=settings, topics=topics, checkpoint_dir=tmp_path / "cp", buckets=4,
                       policy=Policy(transaction_timeout=2000, check_interval=2000),
                       query_name=f"tx-{unique}")
    resolved, line = resolve_transactions(spark, config)
    assert resolved.transactions == "on" and resolved.transactional_id is not None
    assert line is not None and line.startswith("transactions on (the broker isolates")
    kept = json.loads((tmp_path / "cp" / "transactions.json").read_text())
    assert kept["transactional_id"] == resolved.transactional_id and kept["probe"]["isolates"]
    query = start_coordinator(spark, config)  # the kept answer: not probed again
    try:
        real = f"{unique}-real"
        produce(settings, [half_record(topics, "tx-1", "G", real, b"hello"),
                           end_record(topics, "tx-1", "G", Decision.COMMIT_MESSAGE)])
        [visible] = wait_for(settings, real, 1, timeout_s=180)
        assert visible.value == b"hello"
        wait_until(lambda: any(n["event"] == "released"
                               for n in history_of(settings, topics, "tx-1")), timeout_s=60)
        # Written in a transaction: the log holds its commit marker after the release.
        assert partition_ends(settings, real)[visible.partition] > visible.offset + 1
    finally:
        query.stop()


def test_a_producer_that_stops_sending_is_replaced_and_the_task_commits_once(
        apache_kafka_settings: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
        ) -> None:
    """kafka-python 3's producer can stop sending for good after a leader's node dies (the
    three-node soak: the task waited out its 120-s flush). Its I/O thread stalled here: once
    nothing is acknowledged for STALL_S the transaction goes again with a new producer,
    which fences the stalled one; each record is committed once."""
    import dataclasses
    import threading

    from txstream.kafka import transactions
    from txstream.sinks import delivery

    settings = apache_kafka_settings
    topics, real, options = _first_run_of_a_task(settings, unique, monkeypatch)
    options = dataclasses.replace(options, flush_timeout_s=20.0)
    monkeypatch.setattr(delivery, "STALL_S", 2.0)
    made: list[Any] = []
    wedged = threading.Event()
    real_make = transactions.make_transactional_producer

    def make(*args: Any, **kwargs: Any) -> Any:
        producer = real_make(*args, **kwargs)
        if not made:  # the soak's wedge: waiting for ever for a new epoch, sending nothing
            producer._transaction_manager.is_bumping_epoch = lambda: not wedged.is_set()
        made.append(producer)
        return producer

    monkeypatch.setattr("txstream.sinks.transactional.make_transactional_producer", make)
    rows = release_rows(real, topics, n=2)
    try:
        commit = send_rows(options, rows)
    finally:
        wedged.set()
    assert len(made) == 2, "the stalled producer was replaced once"
    assert commit.counts == {Kind.VISIBLE: 2, Kind.HISTORY: 2}
    assert [r.value for r in read_committed(settings, real)] == [b"body 0", b"body 1"]
    assert _notes(settings, topics) == ["tx-0:released", "tx-1:released"]
