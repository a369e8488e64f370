"""TransactionProducer against the real tansu broker: what it writes, and what it refuses."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.support.kafka_helpers import produce, read_topic, wait_until
from tests.support.ports import reserve_port
from txstream.broker import EmbeddedBroker
from txstream.client import (
    MAX_BODY_BYTES,
    BrokerUnavailable,
    ClientStateError,
    ConfigError,
    InvalidMessage,
    LocalTransactionState,
    Message,
    SendFailed,
    SendInDoubt,
    SendStatus,
    TransactionListener,
    TransactionProducer,
)
from txstream.kafka import KafkaSettings
from txstream.outputs import encode_check
from txstream.topics import Topics
from txstream.wire import decode_end, decode_half

pytestmark = pytest.mark.kafka

S = LocalTransactionState


class ScriptedListener(TransactionListener):
    """execute_local_transaction does what the message body says."""

    def __init__(self, kafka: KafkaSettings | None = None, topics: Topics | None = None) -> None:
        self.calls: list[tuple[Message, object]] = []
        self.half_seen_stored: list[bool] = []
        self._kafka, self._topics = kafka, topics

    def execute_local_transaction(self, msg: Message, arg: object) -> S:
        self.calls.append((msg, arg))
        body = msg.body.decode()
        if body == "raise":
            raise ValueError("boom in the local transaction")
        if body == "none":
            return None  # type: ignore[return-value]
        if body == "stored?":
            assert self._kafka is not None and self._topics is not None
            keys = [r.key for r in read_topic(self._kafka, self._topics.half)]
            self.half_seen_stored.append(msg.transaction_id.encode() in keys)
            return S.COMMIT_MESSAGE
        return {"commit": S.COMMIT_MESSAGE, "rollback": S.ROLLBACK_MESSAGE}.get(body, S.UNKNOW)

    def check_local_transaction(self, msg: Message) -> S:
        return S.UNKNOW


@pytest.fixture
def listener(kafka: KafkaSettings, topics: Topics) -> ScriptedListener:
    return ScriptedListener(kafka, topics)


@pytest.fixture
def producer(
    kafka: KafkaSettings, topics: Topics, listener: ScriptedListener
) -> Iterator[TransactionProducer]:
    # No check consumer: these tests are about sending (checks: test_client_checks.py).
    with TransactionProducer("pg_send", kafka.bootstrap_servers, listener, topics=topics,
                             answer_checks=False) as p:
        yield p


def _records(kafka: KafkaSettings, topic: str) -> list:
    return read_topic(kafka, topic)


def _end_of(kafka: KafkaSettings, topics: Topics, txid: str):
    ends = [decode_end(r.key, r.value, r.headers) for r in _records(kafka, topics.end)]
    mine = [e for e in ends if e.transaction_id == txid]
    assert len(mine) == 1, ends
    return mine[0]


def test_commit_writes_the_half_message_then_the_end_event(
    producer: TransactionProducer, listener: ScriptedListener, kafka: KafkaSettings,
    topics: Topics,
) -> None:
    msg = Message("TopicTest", b"commit", tags="TagA", keys="KEY1", properties={"color": "red"})
    msg.set_check_immunity_time(30)
    arg = object()
    before = int(time.time() * 1000)
    result = producer.send_message_in_transaction(msg, arg)

    assert result.send_status is SendStatus.SEND_OK
    assert result.local_transaction_state is S.COMMIT_MESSAGE
    assert result.msg_id == result.transaction_id
    assert len(result.msg_id) == 32 and int(result.msg_id, 16) >= 0
    assert result.end_acknowledged
    # The listener saw the half message with its ids, and the caller's argument.
    (seen, seen_arg), = listener.calls
    assert seen_arg is arg
    assert seen.transaction_id == result.transaction_id
    assert seen.producer_group == "pg_send"
    assert msg.transaction_id is None  # the caller's message is not changed

    halves = _records(kafka, topics.half)
    assert len(halves) == 1
    rec = halves[0]
    # The result names the real topic, and where the half message was stored.
    assert result.topic == "TopicTest" and result.half_topic == topics.half
    assert (rec.topic, rec.partition, rec.offset) == (result.half_topic, result.half_partition,
                                                      result.half_offset)
    assert (result.queue_id, result.queue_offset) == (rec.partition, rec.offset)
    assert str(result) == (
        f"TransactionSendResult [sendStatus=SEND_OK, msgId={result.msg_id}, topic=TopicTest, "
        f"localTransactionState=COMMIT_MESSAGE, messageQueue=MessageQueue [topic="
        f"{topics.half}, queueId={rec.partition}], queueOffset={rec.offset}]")
    half = decode_half(rec.key, rec.value, rec.headers)
    assert half.topic == "TopicTest" and half.body == b"commit"
    assert (half.tags, half.keys, half.properties) == ("TagA", "KEY1", {"color": "red"})
    assert half.transaction_id == half.msg_id == result.transaction_id
    assert half.producer_group == "pg_send"
    assert half.check_immunity_time_s == 30
    assert half.born_timestamp is not None and half.born_timestamp >= before

    end = _end_of(kafka, topics, result.transaction_id)
    assert end.decision is S.COMMIT_MESSAGE
    assert end.producer_group == "pg_send"
    assert not end.from_check and end.check_times is None and end.remark is None


@pytest.mark.parametrize(
    ("body", "state"),
    [(b"rollback", S.ROLLBACK_MESSAGE), (b"unknown", S.UNKNOW)],
)
def test_the_end_event_carries_the_listener_decision(
    producer: TransactionProducer, kafka: KafkaSettings, topics: Topics, body: bytes, state: S
) -> None:
    result = producer.send_message_in_transaction(Message("TopicTest", body))
    assert result.local_transaction_state is state
    end = _end_of(kafka, topics, result.transaction_id)
    assert end.decision is state and end.remark is None


def test_local_transaction_runs_only_after_the_half_was_stored(
    producer: TransactionProducer, listener: ScriptedListener
) -> None:
    producer.send_message_in_transaction(Message("TopicTest", b"stored?"))
    assert listener.half_seen_stored == [True]


@pytest.mark.parametrize(("body", "remark"), [(b"raise", "boom in the local"), (b"none", "None")])
def test_listener_that_raises_or_returns_none_ends_unknown_with_a_remark(
    producer: TransactionProducer, kafka: KafkaSettings, topics: Topics,
    caplog: pytest.LogCaptureFixture, body: bytes, remark: str,
) -> None:
    with caplog.at_level(logging.WARNING, logger="txstream.client.listener"):
        result = producer.send_message_in_transaction(Message("TopicTest", body))
    assert result.local_transaction_state is S.UNKNOW
    end = _end_of(kafka, topics, result.transaction_id)
    assert end.decision is S.UNKNOW
    assert end.remark is not None and remark in end.remark
    assert "executeLocalTransaction" in end.remark
    assert result.transaction_id in caplog.text


BAD_MESSAGES = [
    (lambda t: Message("", b"x"), "topic"),
    (lambda t: Message("bad topic!", b"x"), "topic"),
    (lambda t: Message(t.half, b"x"), "system topic"),
    (lambda t: Message(t.check("pg_send"), b"x"), "system topic"),
    (lambda t: Message("TopicTest", b""), "empty"),
    (lambda t: Message("TopicTest", "text, not bytes"), "bytes"),  # type: ignore[arg-type]
    (lambda t: Message("TopicTest", b"x" * (MAX_BODY_BYTES + 1)), "exceeds"),
    (lambda t: Message("TopicTest", b"x", properties={"UNIQ_KEY": "forged"}), "reserved"),
    (lambda t: Message("TopicTest", b"x", properties={"TRAN_MSG": "false"}), "reserved"),
    (lambda t: Message("TopicTest", b"x", properties={"REAL_TOPIC": "other"}), "reserved"),
    (lambda t: Message("TopicTest", b"x", properties={"n": 1}), "text"),  # type: ignore[dict-item]
    (lambda t: Message("TopicTest", b"x", tags=7), "tags"),  # type: ignore[arg-type]
    (lambda t: Message("TopicTest", b"x", tags="A || B"), "'||'"),
    (lambda t: "not a message", "client.Message"),
]


def test_invalid_messages_are_refused_before_anything_is_sent(
    producer: TransactionProducer, listener: ScriptedListener, kafka: KafkaSettings,
    topics: Topics,
) -> None:
    for make, words in BAD_MESSAGES:
        with pytest.raises(InvalidMessage, match=words):
            producer.send_message_in_transaction(make(topics))
    assert listener.calls == []
    assert _records(kafka, topics.half) == []
    assert _records(kafka, topics.end) == []
    # The largest legal body still goes through.
    ok = producer.send_message_in_transaction(Message("TopicTest", b"x" * MAX_BODY_BYTES))
    assert ok.send_status is SendStatus.SEND_OK


def test_client_state_errors(kafka: KafkaSettings, topics: Topics) -> None:
    servers = kafka.bootstrap_servers
    with pytest.raises(ClientStateError, match="listener"):
        TransactionProducer("pg", servers, None, topics=topics).start()
    p = TransactionProducer("pg", servers, ScriptedListener(), topics=topics, answer_checks=False)
    with pytest.raises(ClientStateError, match="start"):
        p.send_message_in_transaction(Message("TopicTest", b"commit"))
    p.start()
    with pytest.raises(ClientStateError):
        p.start()
    p.shutdown()
    p.shutdown()  # idempotent
    with pytest.raises(ClientStateError, match="shut down"):
        p.send_message_in_transaction(Message("TopicTest", b"commit"))
    assert _records(kafka, topics.half) == []
    with pytest.raises(ConfigError):
        TransactionProducer("bad group!", servers, ScriptedListener())
    with pytest.raises(ConfigError, match="unknown option"):
        TransactionProducer("pg", servers, ScriptedListener(), sned_timeout_s=1)
    with pytest.raises(ConfigError, match="send_timeout_s"):
        TransactionProducer("pg", servers, ScriptedListener(), send_timeout_s=0)


def test_unreachable_broker_fails_start_within_the_timeout() -> None:
    closed = f"127.0.0.1:{reserve_port()}"
    p = TransactionProducer("pg", closed, ScriptedListener(), connect_timeout_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailable, match=closed):
        p.start()
    elapsed = time.monotonic() - t0
    assert 1.0 <= elapsed < 5.0, elapsed


def test_half_not_acknowledged_raises_in_doubt_and_skips_the_local_transaction() -> None:
    listener = ScriptedListener()
    with EmbeddedBroker() as own:
        p = TransactionProducer("pg", own.bootstrap_servers, listener, send_timeout_s=1.0,
                                answer_checks=False).start()
        assert p.send_message_in_transaction(Message("TopicTest", b"commit")).end_acknowledged
        # The broker dies (SIGKILL: tansu takes 5 s to stop on SIGTERM while clients are
        # connected, and a crash is what this is about anyway).
        assert own._proc is not None
        own._proc.kill()
        own._proc.wait()
        t0 = time.monotonic()
        with pytest.raises(SendInDoubt, match=r"half message of [0-9A-F]{32} not ack") as caught:
            p.send_message_in_transaction(Message("TopicTest", b"commit"))
        assert time.monotonic() - t0 < 5.0
        # Sent, not acknowledged: the client cannot tell a dead broker from a lost answer.
        assert caught.value.transaction_id and caught.value.msg_id == caught.value.transaction_id
        assert len(listener.calls) == 1  # only the first, stored one ran
        p.shutdown()


def test_concurrent_senders_get_distinct_transactions(
    producer: TransactionProducer, kafka: KafkaSettings, topics: Topics
) -> None:
    results = []
    lock = threading.Lock()

    def send(n: int) -> None:
        for i in range(25):
            r = producer.send_message_in_transaction(Message("TopicTest", b"commit",
                                                             keys=f"{n}-{i}"))
            with lock:
                results.append(r)

    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = {r.transaction_id for r in results}
    assert len(ids) == 200
    halves = {r.key.decode() for r in _records(kafka, topics.half)}
    ends = [decode_end(r.key, r.value, r.headers) for r in _records(kafka, topics.end)]
    assert halves == ids
    assert {e.transaction_id for e in ends} == ids and len(ends) == 200


def test_a_half_refused_before_it_was_sent_raises_plain_send_failed(
    kafka: KafkaSettings, topics: Topics
) -> None:
    listener = ScriptedListener()
    p = TransactionProducer("pg_send", kafka.bootstrap_servers, listener, topics=topics,
                            answer_checks=False, kafka_properties={"max.request.size": "600"})
    with p, pytest.raises(SendFailed, match=r"not sent: .*MessageSizeTooLargeError") as caught:
        p.send_message_in_transaction(Message("TopicTest", b"x" * 1000))
    assert type(caught.value) is SendFailed  # not in doubt: it never left the process
    assert listener.calls == [] and _records(kafka, topics.half) == []


@contextlib.contextmanager
def _paused(broker: EmbeddedBroker) -> Iterator[None]:
    """The broker process stopped (SIGSTOP): connections stay open, requests wait unread."""
    assert broker.pid is not None
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.pid, signal.SIGCONT)


class Orders(TransactionListener):
    """The README's listener: the local transaction records its transaction id, and a check
    is answered by looking it up (unknown: its local transaction never ran)."""

    def __init__(self) -> None:
        self.paid: dict[str, object] = {}  # transaction id -> order: the "database"

    def execute_local_transaction(self, msg: Message, arg: object) -> S:
        self.paid[msg.transaction_id or ""] = arg
        return S.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> S:
        return S.COMMIT_MESSAGE if msg.transaction_id in self.paid else S.ROLLBACK_MESSAGE


def test_a_half_sent_to_a_paused_broker_is_in_doubt_stored_and_its_check_rolls_back() -> None:
    """A send whose answer never came raises SendInDoubt naming the transaction; the broker,
    resumed, stores the half message all the same. The application retries (a new
    transaction); the coordinator's check of the first one is answered ROLLBACK by a listener
    that answers by transaction id, so the order is released once."""
    listener, topics = Orders(), Topics.with_prefix(f"p{uuid.uuid4().hex[:8]}_")
    with EmbeddedBroker() as own:
        kafka = KafkaSettings(bootstrap_servers=own.bootstrap_servers)
        # 3 s: under a loaded machine's queue tansu took over 1 s to acknowledge order 1's end
        # event, the client dropped the connection, and the paused send then failed before it
        # was sent (not in doubt).
        with TransactionProducer("pg_doubt", own.bootstrap_servers, listener, topics=topics,
                                 send_timeout_s=3.0) as p:
            p.send_message_in_transaction(Message("Orders", b"order 1"), "order-1")
            wait_until(lambda: p.check_partitions, timeout_s=30)
            wait_until(lambda: read_topic(kafka, topics.end), timeout_s=30)  # order 1 settled
            with _paused(own), pytest.raises(SendInDoubt) as caught:
                p.send_message_in_transaction(Message("Orders", b"order 2"), "order-2")
            doubt = caught.value.transaction_id
            assert doubt and doubt in str(caught.value) and "may have been stored" in str(
                caught.value)
            assert doubt not in listener.paid  # its local transaction did not run
            retried = p.send_message_in_transaction(Message("Orders", b"order 2"), "order-2")

            stored = wait_until(lambda: (h := read_topic(kafka, topics.half)) and len(h) == 3
                                and h, timeout_s=20)
            halves = {r.key.decode(): r for r in stored}
            assert doubt in halves, "the paused broker stored the half message it was sent"
            # Play the coordinator: check the in-doubt transaction, as it would.
            rec = halves[doubt]
            produce(kafka, [encode_check(decode_half(rec.key, rec.value, rec.headers), 1,
                                         topics)])
            answer = wait_until(lambda: [e for e in (decode_end(r.key, r.value, r.headers)
                                                     for r in read_topic(kafka, topics.end))
                                         if e.transaction_id == doubt], timeout_s=40)
        assert [(e.decision, e.from_check) for e in answer] == [(S.ROLLBACK_MESSAGE, True)]
        commits = [e.transaction_id for e in (decode_end(r.key, r.value, r.headers)
                                              for r in read_topic(kafka, topics.end))
                   if e.decision is S.COMMIT_MESSAGE]
        assert sorted(listener.paid.values()) == ["order-1", "order-2"]
        assert len(commits) == 2 and retried.transaction_id in commits and doubt not in commits
