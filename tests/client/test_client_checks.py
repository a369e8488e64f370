"""Back-check answering against the real tansu broker.

The tests play the coordinator: they write check requests (``encode_check``) to the group's
check topic and read the answers (end events with ``from_check``) from the end topic.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

import txstream.client.checker as checker_module
from tests.support.kafka_helpers import produce, read_topic, wait_until
from txstream.client import (
    BoundedExecutor,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txstream.kafka import KafkaSettings
from txstream.message import EndEvent
from txstream.outputs import encode_check
from txstream.topics import Topics
from txstream.wire import H, Record, decode_end, decode_half

pytestmark = pytest.mark.kafka

S = LocalTransactionState
ROOT = Path(__file__).resolve().parents[2]


class MapListener(TransactionListener):
    """Answers checks from a dict; records every check it was asked."""

    def __init__(self, answers: dict[str, object] | None = None,
                 gate: threading.Event | None = None) -> None:
        self.answers = answers or {}
        self.asked: list[Message] = []
        self.entered = threading.Event()
        self.gate = gate
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg: Message, arg: object) -> S:
        return S.UNKNOW

    def check_local_transaction(self, msg: Message) -> S:
        with self._lock:
            self.asked.append(msg)
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(20)
        answer = self.answers.get(msg.transaction_id or "", S.COMMIT_MESSAGE)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]


def _request(txid: str, group: str, check_times: int, topics: Topics,
             valid_until: int | None = None, **fields: object) -> Record:
    msg = Message("TopicTest", f"body of {txid}".encode(), tags="TagA", keys=f"K-{txid}",
                  properties={"p": txid}, transaction_id=txid, msg_id=txid,
                  producer_group=group, born_timestamp=1_700_000_000_000)
    for name, value in fields.items():
        setattr(msg, name, value)
    return encode_check(msg, check_times, topics, valid_until)


def _answers(kafka: KafkaSettings, topics: Topics) -> list[EndEvent]:
    return [decode_end(r.key, r.value, r.headers) for r in read_topic(kafka, topics.end)]


def _wait_answers(kafka: KafkaSettings, topics: Topics, n: int, timeout_s: float = 30.0
                  ) -> list[EndEvent]:
    return wait_until(lambda: (a := _answers(kafka, topics)) and len(a) >= n and a, timeout_s)


def _committed(kafka: KafkaSettings, group_id: str, topic: str) -> dict[int, int | None]:
    """The check group's committed offsets, read without joining the group."""
    consumer = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group_id,
                             enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        return {p: consumer.committed(TopicPartition(topic, p)) for p in sorted(parts)}
    finally:
        consumer.close()


def _end_offsets(kafka: KafkaSettings, topic: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in read_topic(kafka, topic):
        out[r.partition] = max(out.get(r.partition, 0), r.offset + 1)
    return out


def _producer(kafka: KafkaSettings, topics: Topics, listener: TransactionListener,
              group: str = "pg_check", **options: object) -> TransactionProducer:
    return TransactionProducer(group, kafka.bootstrap_servers, listener, topics=topics,
                               **options).start()  # type: ignore[arg-type]


def _joined(*producers: TransactionProducer, partitions: int = 2) -> None:
    def settled() -> bool:
        parts = [p.check_partitions for p in producers]
        union = frozenset().union(*parts)
        return all(parts) and len(union) == partitions and sum(map(len, parts)) == partitions
    wait_until(settled, timeout_s=30)


@pytest.fixture
def listener() -> MapListener:
    return MapListener({
        "tx-commit": S.COMMIT_MESSAGE,
        "tx-rollback": S.ROLLBACK_MESSAGE,
        "tx-unknown": S.UNKNOW,
        "tx-raise": RuntimeError("db down"),
        "tx-none": None,
    })


@pytest.fixture
def producer(kafka: KafkaSettings, topics: Topics, listener: MapListener
             ) -> Iterator[TransactionProducer]:
    p = _producer(kafka, topics, listener)
    yield p
    p.shutdown()


def test_every_check_is_answered_with_its_number_unknown_included(
    producer: TransactionProducer, listener: MapListener, kafka: KafkaSettings, topics: Topics,
    caplog: pytest.LogCaptureFixture,
) -> None:
    group = producer.producer_group
    requests = [
        # A malformed request (no REAL_TOPIC) in the same partition as a good one: skipped.
        Record(topics.check(group), b"tx-commit", b"x", ((H.CHECK_TIMES, b"1"),)),
        _request("tx-commit", group, 1, topics),
        _request("tx-rollback", group, 2, topics),
        _request("tx-unknown", group, 3, topics),
        _request("tx-raise", group, 4, topics),
        _request("tx-none", group, 5, topics),
    ]
    with caplog.at_level(logging.WARNING):
        produce(kafka, requests)
        answers = {a.transaction_id: a for a in _wait_answers(kafka, topics, 5)}

    expected = {"tx-commit": (S.COMMIT_MESSAGE, 1), "tx-rollback": (S.ROLLBACK_MESSAGE, 2),
                "tx-unknown": (S.UNKNOW, 3), "tx-raise": (S.UNKNOW, 4), "tx-none": (S.UNKNOW, 5)}
    assert {t: (a.decision, a.check_times) for t, a in answers.items()} == expected
    assert all(a.from_check and a.producer_group == group for a in answers.values())
    assert "db down" in (answers["tx-raise"].remark or "")
    assert "checkLocalTransaction" in (answers["tx-raise"].remark or "")
    assert "None" in (answers["tx-none"].remark or "")
    assert answers["tx-commit"].remark is None
    assert "tx-raise" in caplog.text and "malformed check request" in caplog.text

    asked = {m.transaction_id: m for m in listener.asked}
    m = asked["tx-commit"]
    assert (m.topic, m.body, m.tags, m.keys) == ("TopicTest", b"body of tx-commit", "TagA",
                                                 "K-tx-commit")
    assert m.get_property("p") == "tx-commit" and m.producer_group == group
    # What RocketMQ's check message carries, as a Java listener reads it.
    assert {k: m.get_property(k) for k in ("TRANSACTION_CHECK_TIMES", "PGROUP", "UNIQ_KEY",
                                           "TRAN_MSG")} == {
        "TRANSACTION_CHECK_TIMES": "1", "PGROUP": group, "UNIQ_KEY": m.msg_id,
        "TRAN_MSG": "true"}
    # Offsets are committed once the answers were acknowledged: every request is covered.
    ends = _end_offsets(kafka, producer.check_topic)
    wait_until(lambda: {p: c for p, c in _committed(kafka, producer.check_group_id,
                                                     producer.check_topic).items()
                        if p in ends} == ends, timeout_s=10)
    assert producer.checks_answered == 5


def test_two_producers_of_a_group_answer_each_check_once(
    kafka: KafkaSettings, topics: Topics
) -> None:
    a, b = MapListener(), MapListener()
    pa = _producer(kafka, topics, a)
    pb = _producer(kafka, topics, b)
    try:
        _joined(pa, pb)
        txids = [f"tx-{i:02d}" for i in range(24)]
        produce(kafka, [_request(t, "pg_check", 1, topics) for t in txids])
        _wait_answers(kafka, topics, len(txids))
        time.sleep(1.0)  # a second answer would have come by now
        answers = _answers(kafka, topics)
        assert sorted(x.transaction_id for x in answers) == txids
        by_a = {m.transaction_id for m in a.asked}
        by_b = {m.transaction_id for m in b.asked}
        assert by_a and by_b, "both producers own check partitions and get requests"
        assert by_a.isdisjoint(by_b) and by_a | by_b == set(txids)
    finally:
        pa.shutdown()
        pb.shutdown()


CRASHING_PRODUCER = textwrap.dedent("""
    import os, signal, sys, time
    from txstream.client import (LocalTransactionState, Message, TransactionListener,
                                 TransactionProducer)
    from txstream.topics import Topics

    servers, prefix, db = sys.argv[1:4]

    class Listener(TransactionListener):
        def execute_local_transaction(self, msg, arg):
            with open(db, "w") as f:          # the local transaction commits...
                f.write(msg.transaction_id)
            os.kill(os.getpid(), signal.SIGKILL)  # ...and the process dies before the end event

        def check_local_transaction(self, msg):
            return LocalTransactionState.UNKNOW

    p = TransactionProducer("pg_crash", servers, Listener(), topics=Topics.with_prefix(prefix))
    p.start()
    deadline = time.monotonic() + 30
    while not p.check_partitions and time.monotonic() < deadline:  # a full group member
        time.sleep(0.05)
    p.send_message_in_transaction(Message("TopicTest", b"order 42", keys="order-42"))
""")


class FileDbListener(TransactionListener):
    """A second process's view of the same local database (a file)."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.asked: list[str] = []

    def execute_local_transaction(self, msg: Message, arg: object) -> S:
        return S.UNKNOW

    def check_local_transaction(self, msg: Message) -> S:
        self.asked.append(msg.transaction_id or "")
        committed = self.db.exists() and self.db.read_text() == msg.transaction_id
        return S.COMMIT_MESSAGE if committed else S.ROLLBACK_MESSAGE


def test_check_for_a_crashed_producer_is_answered_by_another_of_its_group(
    kafka: KafkaSettings, topics: Topics, tmp_path: Path
) -> None:
    db = tmp_path / "local.db"
    prefix = topics.half[: -len("RMQ_SYS_TRANS_HALF_TOPIC")]
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_PRODUCER, kafka.bootstrap_servers, prefix, str(db)],
        cwd=ROOT, capture_output=True, timeout=60,
    )
    assert crashed.returncode == -9, crashed.stderr.decode()[-2000:]
    txid = db.read_text()
    (rec,) = read_topic(kafka, topics.half)
    half = decode_half(rec.key, rec.value, rec.headers)
    assert half.transaction_id == txid and half.producer_group == "pg_crash"
    assert _answers(kafka, topics) == []  # no end event: it died first

    survivor_listener = FileDbListener(db)
    survivor = _producer(kafka, topics, survivor_listener, group="pg_crash")
    try:
        # The coordinator's check, built from the stored half message as it would build it.
        produce(kafka, [encode_check(half, 1, topics)])
        (answer,) = _wait_answers(kafka, topics, 1, timeout_s=40)
        assert (answer.transaction_id, answer.decision) == (txid, S.COMMIT_MESSAGE)
        assert answer.from_check and answer.check_times == 1
        assert answer.producer_group == "pg_crash"
        assert survivor_listener.asked == [txid]
    finally:
        survivor.shutdown()


def test_shutdown_finishes_checks_in_flight_and_takes_no_more(
    kafka: KafkaSettings, topics: Topics
) -> None:
    gate = threading.Event()
    listener = MapListener(gate=gate)
    p = _producer(kafka, topics, listener)
    _joined(p)
    produce(kafka, [_request("tx-slow", "pg_check", 1, topics)])
    assert listener.entered.wait(20)
    (slow,) = read_topic(kafka, p.check_topic)
    time.sleep(0.3)
    # Taken but not answered yet: not committed.
    assert (_committed(kafka, p.check_group_id, p.check_topic)[slow.partition] or 0) <= slow.offset

    stopper = threading.Thread(target=p.shutdown)
    stopper.start()
    time.sleep(0.5)
    assert stopper.is_alive(), "shutdown must wait for the check being answered"
    produce(kafka, [_request("tx-late", "pg_check", 1, topics)])  # after it stopped taking
    time.sleep(0.5)
    gate.set()
    stopper.join(20)
    assert not stopper.is_alive()

    answers = _answers(kafka, topics)
    assert [(a.transaction_id, a.decision) for a in answers] == [("tx-slow", S.COMMIT_MESSAGE)]
    assert [m.transaction_id for m in listener.asked] == ["tx-slow"]
    # tx-slow's offset was committed, tx-late's was not: the next member of the group gets it.
    late = {r.key: r for r in read_topic(kafka, p.check_topic)}[b"tx-late"]
    committed = _committed(kafka, p.check_group_id, p.check_topic)
    assert committed[slow.partition] is not None
    assert committed[slow.partition] >= slow.offset + 1
    assert (committed[late.partition] or 0) <= late.offset


def test_full_executor_leaves_requests_to_be_fetched_again(
    kafka: KafkaSettings, topics: Topics, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    listener = MapListener(gate=gate)
    executor = BoundedExecutor(max_workers=1, queue_size=1)
    p = _producer(kafka, topics, listener, executor=executor)
    try:
        _joined(p)
        txids = [f"tx-{i}" for i in range(6)]
        with caplog.at_level(logging.INFO, logger="txstream.client.checker"):
            produce(kafka, [_request(t, "pg_check", 1, topics) for t in txids])
            assert listener.entered.wait(20)
            wait_until(lambda: "refused" in caplog.text, timeout_s=10)
            gate.set()
            _wait_answers(kafka, topics, len(txids))
        time.sleep(0.5)
        answers = _answers(kafka, topics)
        assert sorted(a.transaction_id for a in answers) == txids  # each exactly once
    finally:
        gate.set()
        p.shutdown()
        executor.shutdown()


@pytest.mark.parametrize("skew_s", [100, -100], ids=["ahead", "behind"])
def test_a_producer_with_a_wrong_clock_judges_expiry_on_the_coordinators_clock(
    kafka: KafkaSettings, topics: Topics, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, skew_s: int,
) -> None:
    """The requests carry the coordinator's clock (here: this machine's, as their record
    timestamps); the producer's clock is ``skew_s`` off. A request within its validity is
    answered, a stale one is not, and the difference is logged."""
    real_clock = checker_module._clock_ms
    monkeypatch.setattr(checker_module, "_clock_ms", lambda: real_clock() + skew_s * 1000)
    listener = MapListener()
    p = _producer(kafka, topics, listener)
    try:
        _joined(p)
        with caplog.at_level(logging.WARNING, logger="txstream.client.checker"):
            now = int(time.time() * 1000)
            produce(kafka, [_request("tx-live", "pg_check", 1, topics, valid_until=now + 2000)])
            (live,) = _wait_answers(kafka, topics, 1)
            assert live.transaction_id == "tx-live"
            # Written 70 s ago and valid until 68 s ago: tx-live, read since, is newer.
            produce(kafka, [_request("tx-stale", "pg_check", 1, topics,
                                     valid_until=now - 68_000)], timestamp_ms=now - 70_000)
        stale = {r.key: r for r in read_topic(kafka, p.check_topic)}[b"tx-stale"]
        wait_until(lambda: (_committed(kafka, p.check_group_id, p.check_topic)
                            [stale.partition] or 0) > stale.offset, timeout_s=20)
        time.sleep(0.5)  # an answer to it would be written by now
        assert [a.transaction_id for a in _answers(kafka, topics)] == ["tx-live"]
        assert [m.transaction_id for m in listener.asked] == ["tx-live"]
        word = "ahead of" if skew_s > 0 else "behind"
        said = re.search(rf"clock is ([0-9.]+)s {word} the newest check request", caplog.text)
        assert said, caplog.text
        assert abs(float(said.group(1)) - abs(skew_s)) < 5
    finally:
        p.shutdown()
