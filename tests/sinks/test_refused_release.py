"""A release the broker refuses for what it is (its topic missing on a broker that creates
none, too large, not allowed) is never reported as released: its dead letter is keyed by the
transaction id and says where the body lies, its note says ``release_refused`` and why, and
the metrics count a refusal, not a release. In-memory broker, the sink's own code."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.kafka_helpers import output_row
from tests.support.memory_helpers import Clock
from txstream.headers import header_dict
from txstream.kafka import make_producer
from txstream.kafka.memory import MemoryBroker
from txstream.kafka.reading import read_topic
from txstream.message import Message
from txstream.outputs import decode_history, encode_history, encode_visible
from txstream.schema import Kind
from txstream.sinks.delivery import RefusedRelease
from txstream.sinks.kafka_sink import KafkaRecordWriter, SinkOptions, send_rows
from txstream.sinks.refusal_log import RefusalReader, refusal_log
from txstream.sources.journal import OUTCOME_OF
from txstream.state.effects import NoteKind
from txstream.streaming.engine.key_metrics import Counted
from txstream.streaming.engine.metric_totals import MetricsBoard
from txstream.topics import Topics
from txstream.wire import H, pack_headers

TOPICS = Topics.with_prefix("r_")


@pytest.fixture
def broker() -> Iterator[MemoryBroker]:
    # Like a broker with auto.create.topics.enable=false: the real topic "missing" is not there.
    with MemoryBroker(f"refused-{random.getrandbits(32)}", Clock(), auto_create=False) as made:
        for topic in (TOPICS.half, TOPICS.history, TOPICS.dead_letter, "orders"):
            made.create_topic(topic, 1)
        yield made


def _release(txid: str, topic: str, body_at: tuple[int, int]) -> tuple[object, object]:
    msg = Message(topic, b"the body", keys=f"order-{txid}", transaction_id=txid, msg_id=txid,
                  producer_group="G", born_timestamp=1)
    record = encode_visible(msg)
    release = output_row(Kind.VISIBLE, topic, record.key, None,
                         pack_headers((*record.headers, (H.RECORD_ID, f"t.1.5.{txid}".encode()))),
                         f"t.1.5.{txid}", 5, body_at=body_at)
    notes = [(txid, 5, "released", {"decision": "COMMIT_MESSAGE"})]
    [(history, _)] = encode_history(notes, b"1", TOPICS)
    note = output_row(Kind.HISTORY, TOPICS.history, history.key, history.value,
                      pack_headers(((H.RECORD_ID, f"t.1.5.n{txid}".encode()),)),
                      f"t.1.5.n{txid}", 5)
    return release, note


def test_a_release_to_a_missing_topic_is_dead_lettered_and_its_note_says_so(
        broker: MemoryBroker, tmp_path: Path) -> None:
    half = broker.append(TOPICS.half, b"tx-a", b"the body")  # where the bodies lie
    broker.append(TOPICS.half, b"tx-b", b"the body")
    refused, refused_note = _release("tx-a", "missing", half)
    kept, kept_note = _release("tx-b", "orders", (0, 1))
    options = SinkOptions(kafka=broker.settings, dead_letter_topic=TOPICS.dead_letter,
                          half_topic=TOPICS.half, timer_file=str(tmp_path / "timers.json"))
    commit = send_rows(options, [refused, kept, refused_note, kept_note])  # type: ignore[list-item]

    assert commit.counts == {Kind.VISIBLE: 1, Kind.DEAD_LETTER: 1, Kind.HISTORY: 2}
    assert commit.refused == [RefusedRelease("G", "missing", "MISSING_TOPIC")]
    [dead] = broker.records(TOPICS.dead_letter, 0)
    h = header_dict(dead.headers)
    assert dead.key == b"tx-a" and dead.value == b"the body"
    assert (h[H.REAL_TOPIC], h[H.DLQ_CODE], h[H.KEYS]) == ("missing", "MISSING_TOPIC", "order-tx-a")
    assert (h[H.DLQ_ORIGIN_TOPIC], h[H.DLQ_ORIGIN_PARTITION], h[H.DLQ_ORIGIN_OFFSET]) == (
        TOPICS.half, "0", "0")  # where the body lies, to release it again from
    assert h[H.RECORD_ID] == "t.1.5.tx-a"  # a replay finds it and writes neither again
    notes = {n["transaction_id"]: n for r in broker.records(TOPICS.history, 0)
             for n in decode_history(r.value)}
    assert notes["tx-b"]["event"] == "released"
    assert notes["tx-a"]["event"] == "release_refused"
    assert notes["tx-a"]["code"] == "MISSING_TOPIC" and "does not exist" in notes["tx-a"]["reason"]
    assert notes["tx-a"]["dead_letter"] == "0@0"
    # A new checkpoint reads it back as decided: committed, waiting on the dead-letter topic.
    assert OUTCOME_OF[NoteKind.RELEASE_REFUSED] == "COMMITTED"

    # The metrics: the key counted a commit when it decided it; the driver makes it a refusal.
    log = refusal_log(options.timer_file or "")
    reader = RefusalReader(log)
    KafkaRecordWriter(options).commit([commit], 7)
    KafkaRecordWriter(options).commit([commit], 7)  # the same batch committed again: once
    board = MetricsBoard()
    board.add_refusals(reader.new())
    assert board.view().counters == {(Counted.COMMITS, ("G", "missing")): -1,
                                     (Counted.RELEASES_REFUSED, ("G", "missing",
                                                                 "MISSING_TOPIC")): 1}
    assert reader.new() == []


def _release_command(broker: MemoryBroker, *extra: str) -> int:
    from txstream.streaming.cli import main

    return main(["dead-letters", "release", "--bootstrap-servers",
                 broker.settings.bootstrap_servers, "--topic-prefix", "r_", *extra])


def test_a_refused_release_is_released_once_when_its_topic_exists(
        broker: MemoryBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import txstream.streaming.cli.dead_letters as dead_letters
    from txstream.sinks import delivery

    half = broker.append(TOPICS.half, b"tx-a", b"the body")
    refused, note = _release("tx-a", "missing", half)
    options = SinkOptions(kafka=broker.settings, dead_letter_topic=TOPICS.dead_letter,
                          half_topic=TOPICS.half)
    send_rows(options, [refused, note])  # type: ignore[list-item]
    assert _release_command(broker) == 1  # its topic is still missing: nothing written
    assert "still does not exist" in capsys.readouterr().out

    broker.create_topic("missing", 1)
    monkeypatch.setattr(delivery, "_EXISTING", set())
    # A run that dies between the release and its note ...
    monkeypatch.setattr(dead_letters, "_note", lambda *args: (_ for _ in ()).throw(
        KeyboardInterrupt()))
    assert _release_command(broker) == 130
    monkeypatch.undo()
    assert [r.value for r in broker.records("missing", 0)] == [b"the body"]
    # ... is noted by the next, which does not release it again.
    assert _release_command(broker) == 0
    assert "released before" in capsys.readouterr().out
    [released] = broker.records("missing", 0)
    h = header_dict(released.headers)
    assert (released.key, h[H.TRANSACTION_ID], h[H.KEYS]) == (b"order-tx-a", "tx-a", "order-tx-a")
    assert H.DLQ_CODE not in h and H.REAL_TOPIC not in h
    notes = [n for r in broker.records(TOPICS.history, 0) for n in decode_history(r.value)]
    assert [n["event"] for n in notes] == ["release_refused", "released"]
    assert notes[1]["from_dead_letter"] == "0@0"
    assert _release_command(broker) == 0
    assert "no refused release waits" in capsys.readouterr().out


def test_on_apache_kafka_refusals_are_dead_lettered_noted_and_released_again(
        own_kafka_cluster: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """A topic missing where the broker creates none, and one whose max.message.bytes is
    below the release (RECORD_TOO_LARGE): what tansu can show of neither."""
    from kafka.admin import NewTopic

    from txstream.kafka import KafkaSettings, make_admin

    kafka = own_kafka_cluster(nodes=1, auto_create_topics=False).start()
    settings = KafkaSettings(bootstrap_servers=kafka.bootstrap_servers)
    admin = make_admin(settings)
    try:
        admin.create_topics([NewTopic(t, 1, 1) for t in (TOPICS.half, TOPICS.history,
                                                          TOPICS.dead_letter)]
                            + [NewTopic("small", 1, 1, topic_configs={
                                "max.message.bytes": "200"})])
    finally:
        admin.close()
    producer = make_producer(settings)
    producer.send(TOPICS.half, key=b"tx-a", value=b"the body").get(30)
    producer.send(TOPICS.half, key=b"tx-b", value=b"the body").get(30)
    producer.close()
    missing, missing_note = _release("tx-a", "missing", (0, 0))
    large, large_note = _release("tx-b", "small", (0, 1))
    options = SinkOptions(kafka=settings, dead_letter_topic=TOPICS.dead_letter,
                          half_topic=TOPICS.half)
    commit = send_rows(options, [missing, large, missing_note, large_note])  # type: ignore[list-item]
    assert sorted(commit.refused) == [RefusedRelease("G", "missing", "MISSING_TOPIC"),
                                      RefusedRelease("G", "small", "REFUSED_BY_BROKER")]
    notes = {n["transaction_id"]: n for r in read_topic(settings, TOPICS.history)
             for n in decode_history(r.value)}
    assert notes["tx-a"]["event"] == notes["tx-b"]["event"] == "release_refused"
    assert "MessageSizeTooLarge" in str(notes["tx-b"]["reason"])

    admin = make_admin(settings)
    try:
        admin.create_topics([NewTopic("missing", 1, 1)])
    finally:
        admin.close()
    assert _release_command_at(kafka.bootstrap_servers, "--reason", "MISSING_TOPIC") == 0
    assert "tx-a (MISSING_TOPIC): released to missing" in capsys.readouterr().out
    assert _release_command_at(kafka.bootstrap_servers) == 1  # "small" still refuses it
    assert "tx-b (REFUSED_BY_BROKER): not released" in capsys.readouterr().out
    assert [r.value for r in read_topic(settings, "missing")] == [b"the body"]
    assert _release_command_at(kafka.bootstrap_servers, "--reason", "MISSING_TOPIC") == 0
    assert [r.value for r in read_topic(settings, "missing")] == [b"the body"]  # once


def _release_command_at(servers: str, *extra: str) -> int:
    from txstream.streaming.cli import main

    return main(["dead-letters", "release", "--bootstrap-servers", servers, "--topic-prefix",
                 "r_", *extra])
