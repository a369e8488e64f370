"""The client's pure parts, without a broker: states, validation, executor, dedup, offsets."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka import TopicPartition
from kafka import errors as kafka_errors

from txstream import client
from txstream.client import (
    BoundedExecutor,
    DedupCache,
    InvalidMessage,
    LocalTransactionState,
    Message,
    RejectedExecution,
    SendFailed,
    SendInDoubt,
    Subscription,
    Topics,
    TxStreamError,
)
from txstream.client.consume_partitions import Partitions
from txstream.client.listener import call_for_state
from txstream.client.offsets import OffsetTracker as _Offsets
from txstream.client.options import resolve_settings, resolve_topics
from txstream.client.retry import (
    ROCKETMQ_DELAYS_S,
    RetryHeaders,
    due_ms,
    retry_delay_s,
    retry_delays,
    retry_record,
)
from txstream.client.retry_hold import HeldRetries
from txstream.client.send_errors import not_sent, send_failure
from txstream.client.validate import validate_message
from txstream.errors import ConfigError
from txstream.kafka import KafkaSettings
from txstream.message import Decision


def test_public_api_is_exported_and_states_are_the_shared_enum() -> None:
    for name in client.__all__:
        assert hasattr(client, name), name
    assert LocalTransactionState is Decision
    assert LocalTransactionState.UNKNOWN is LocalTransactionState.UNKNOW
    assert {s.value for s in LocalTransactionState} == {"COMMIT_MESSAGE", "ROLLBACK_MESSAGE",
                                                        "UNKNOW"}
    with pytest.raises(TypeError):
        client.TransactionListener()  # type: ignore[abstract]


def test_call_for_state_turns_anything_but_a_state_into_unknown_with_a_remark() -> None:
    assert call_for_state(lambda: Decision.COMMIT_MESSAGE, "x", "t") == (Decision.COMMIT_MESSAGE,
                                                                       None)
    assert call_for_state(lambda: "ROLLBACK_MESSAGE", "x", "t") == (Decision.ROLLBACK_MESSAGE,
                                                                  None)

    def boom() -> Decision:
        raise KeyError("gone")

    state, remark = call_for_state(boom, "checkLocalTransaction", "t")
    assert state is Decision.UNKNOW and remark is not None and "gone" in remark
    for stray in (None, 42, "COMMIT"):
        state, remark = call_for_state(lambda s=stray: s, "x", "t")
        assert state is Decision.UNKNOW and remark == f"x returned {stray!r}"


def test_validation_accepts_a_plain_message_and_names_what_is_wrong() -> None:
    topics = Topics()
    ok = Message("TopicTest", b"x", tags="TagA", keys="K", properties={"a": ""})
    assert validate_message(ok, topics) is ok
    with pytest.raises(InvalidMessage, match="system topic"):
        validate_message(Message(topics.end, b"x"), topics)
    with pytest.raises(InvalidMessage, match="keys"):
        validate_message(Message("T", b"x", keys=1), topics)  # type: ignore[arg-type]
    with pytest.raises(InvalidMessage, match="reserved"):
        validate_message(Message("T", b"x", properties={"TAGS": "a"}), topics)


def test_rocketmqs_immunity_property_is_taken_as_java_users_set_it() -> None:
    topics = Topics()
    put = Message("T", b"x")
    put.put_user_property("CHECK_IMMUNITY_TIME_IN_SECONDS", "-1")
    assert put.check_immunity_time_s == -1 and put.properties == {}
    direct = Message("T", b"x", properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "30", "a": "b"})
    assert validate_message(direct, topics).check_immunity_time_s == 30
    assert direct.properties == {"a": "b"}  # written once, as its own header
    for bad in ("soon", "-7", "1.5"):
        with pytest.raises(InvalidMessage, match=r"CHECK_IMMUNITY_TIME_IN_SECONDS|immunity"):
            validate_message(Message("T", b"x", properties={
                "CHECK_IMMUNITY_TIME_IN_SECONDS": bad}), topics)


def test_options_merge_settings_pieces_and_refuse_unknown_ones() -> None:
    base = KafkaSettings(bootstrap_servers="h:1", security_protocol="SSL")
    merged = resolve_settings("h:2", base, {"ssl_cafile": "/ca.pem"})
    assert (merged.bootstrap_servers, merged.security_protocol, merged.ssl_cafile) == (
        "h:2", "SSL", "/ca.pem")
    with pytest.raises(ConfigError, match="unknown option"):
        resolve_settings("h:1", None, {"ssl_ca": "x"})
    assert resolve_topics(None, "p_").half == "p_RMQ_SYS_TRANS_HALF_TOPIC"
    with pytest.raises(ConfigError):
        resolve_topics(Topics(), "p_")


def test_bounded_executor_refuses_when_full_and_frees_slots() -> None:
    gate = threading.Event()
    ex = BoundedExecutor(max_workers=1, queue_size=1)
    try:
        running = ex.submit(gate.wait, 10)
        queued = ex.submit(lambda: "queued")
        with pytest.raises(RejectedExecution, match="full"):
            ex.submit(lambda: "refused")
        assert queued.cancel()  # a cancelled task gives its slot back
        extra = ex.submit(lambda: "fits again")
        gate.set()
        assert running.result(5) is True and extra.result(5) == "fits again"
        assert [ex.submit(lambda i=i: i).result(5) for i in range(5)] == list(range(5))
    finally:
        gate.set()
        ex.shutdown()


def test_dedup_cache_is_bounded_in_size_and_age() -> None:
    now = [0.0]
    cache = DedupCache(capacity=3, ttl_s=10, clock=lambda: now[0])
    cache.add(["a", "b", "c", None])
    assert "a" in cache and len(cache) == 3
    cache.add(["d"])  # evicts the oldest
    assert "a" not in cache and {"b", "c", "d"} <= {x for x in "abcd" if x in cache}
    now[0] = 10.0
    assert "b" not in cache  # expired
    cache.add(["e"])
    assert len(cache) == 1 and "e" in cache


@given(st.lists(st.sampled_from("abcdefgh"), max_size=60), st.integers(1, 5))
def test_dedup_cache_remembers_exactly_the_most_recent_ids(ids: list[str], cap: int) -> None:
    cache = DedupCache(capacity=cap, ttl_s=1e9)
    for i in ids:
        cache.add([i])
    recent: list[str] = []
    for i in reversed(ids):
        if i not in recent:
            recent.append(i)
    assert {x for x in "abcdefgh" if x in cache} == set(recent[:cap])


def test_subscription_expressions() -> None:
    assert Subscription("t", "*").tags is None and Subscription("t", "").matches(None)
    sub = Subscription("t", "TagA || TagB ||")
    assert sub.tags == {"TagA", "TagB"}
    assert sub.matches("TagA") and sub.matches("TagB")
    assert not sub.matches("TagC") and not sub.matches(None) and not sub.matches("TagA ")


def test_retry_delays_follow_the_attempt_and_stay_at_the_last() -> None:
    assert retry_delay_s(ROCKETMQ_DELAYS_S, 1) == 10
    assert retry_delay_s(ROCKETMQ_DELAYS_S, 16) == 7200
    assert retry_delay_s(ROCKETMQ_DELAYS_S, 99) == 7200
    assert retry_delay_s((0.5,), 3) == 0.5
    rec = retry_record("R", b"k", b"v", [("A", b"1"), (RetryHeaders.RECONSUME_TIMES, b"1")],
                       "T", 2, 123)
    assert rec.headers == (("A", b"1"), ("RETRY_TOPIC", b"T"), ("RECONSUME_TIME", b"2"),
                           ("TXSTREAM_RETRY_DUE_MS", b"123"))


def test_check_offsets_commit_only_past_answered_requests() -> None:
    tp = TopicPartition("c", 0)
    o = _Offsets()
    for off in (0, 1, 2):
        assert o.take(tp, off)
    assert o.to_commit() == {tp: 0}
    o.finish(tp, 1, ok=True)
    assert o.to_commit() == {tp: 0}  # 0 is still being answered
    o.finish(tp, 0, ok=True)
    assert o.to_commit() == {tp: 2}
    o.committed({tp: 2})
    assert o.to_commit() == {}
    o.finish(tp, 2, ok=False)  # not acknowledged: pinned until rewound and answered again
    assert not o.take(tp, 3)
    assert o.to_commit() == {}
    assert o.pop_failed() == {tp: 2}
    o.rewind(tp, 2)
    assert o.take(tp, 2) and o.take(tp, 3, inflight=False)
    o.finish(tp, 2, ok=True)
    assert o.to_commit() == {tp: 4}


def test_retry_delays_and_due_times_of_records() -> None:
    assert retry_delays(None) == ROCKETMQ_DELAYS_S and retry_delays(2) == (2.0,)
    assert retry_delays([1, 0.5]) == (1.0, 0.5)
    for bad in ([], [-1], -0.1):
        with pytest.raises(ConfigError, match="retry delays"):
            retry_delays(bad)
    assert due_ms({RetryHeaders.DUE_MS: "123"}) == 123
    assert due_ms({}) == due_ms({RetryHeaders.DUE_MS: "soon"}) == 0  # due now, never held


_TPS = [TopicPartition("r", 0), TopicPartition("r", 1)]
_OPS = st.lists(st.tuples(st.sampled_from(["hold", "pop", "drop", "forget", "due"]),
                          st.sampled_from(_TPS), st.integers(0, 9), st.integers(0, 50)),
                max_size=80)


@given(_OPS)
def test_held_retries_come_out_exactly_when_due_in_due_order(ops: list) -> None:
    held, model = HeldRetries(), {}  # model: (tp, offset) -> due
    for op, tp, offset, t in ops:
        if op == "hold" and (tp, offset) not in model:
            held.hold(tp, t, SimpleNamespace(offset=offset), f"m{offset}")
            model[tp, offset] = t
        elif op == "pop":
            entry = held.pop(tp, offset)
            assert (entry and entry[0]) == model.pop((tp, offset), None)
        elif op == "drop":
            dropped = held.drop_from(tp, offset)
            assert sorted(dropped) == sorted(o for (p, o) in model if p == tp and o >= offset)
            for o in dropped:
                del model[tp, o]
        elif op == "forget":
            held.forget({tp})
            model = {k: v for k, v in model.items() if k[0] != tp}
        elif op == "due":
            out = held.pop_due(t)
            want = sorted((due, p, o) for (p, o), due in model.items() if due <= t)
            for p in _TPS:
                assert [r.offset for r, _ in out.get(p, [])] == [o for _, q, o in want
                                                                 if q == p]
            for _, p, o in want:
                del model[p, o]
        for p in _TPS:
            assert held.count(p) == sum(1 for q, _ in model if q == p)
        assert held.next_due() == min(model.values(), default=None)
        assert held.wait_ms(200, 0) == min([200, *model.values()])


def test_a_held_retry_the_span_reached_is_requeued_once_acknowledged() -> None:
    tp = TopicPartition("TXSTREAM_RETRY_g", 0)
    offsets = _Offsets()
    parts = Partitions(offsets, pull_threshold=10, max_span=3)
    parts.positioned(frozenset({tp}))

    def hold(offset: int) -> None:
        assert offsets.take(tp, offset)
        parts.held.hold(tp, 10**15, SimpleNamespace(offset=offset), Message("t", b""))

    def refuse(rec: object) -> None:
        raise SendFailed("broker away")

    hold(0)
    assert offsets.take(tp, 1, inflight=False) and offsets.take(tp, 2, inflight=False)
    parts.requeue_past_span(refuse)  # not acknowledged: still held, still pinning the commit
    assert parts.held.holds(tp, 0) and offsets.to_commit() == {tp: 0} and parts.full(tp, 3)
    sent: list[int] = []
    parts.requeue_past_span(lambda rec: sent.append(rec.offset))
    assert sent == [0] and not parts.held.holds(tp, 0) and offsets.to_commit() == {tp: 3}
    assert not parts.full(tp, 3)
    for offset in (3, 4, 5):  # the span's worth held: requeued, they would come round again
        hold(offset)
    parts.requeue_past_span(lambda rec: sent.append(rec.offset))
    assert sent == [0] and parts.full(tp, 6)


# The broker's answers that mean the record was not appended; anything else is in doubt.
REFUSED_SENDS = [
    kafka_errors.MessageSizeTooLargeError("too big"),
    kafka_errors.RecordListTooLargeError(),
    kafka_errors.InvalidTopicError("bad name"),
    kafka_errors.TopicAuthorizationFailedError("Orders"),
    kafka_errors.ClusterAuthorizationFailedError("no idempotent writes"),
    kafka_errors.InvalidRecordError("record 0 invalid"),
    kafka_errors.CorruptRecordError(),
    kafka_errors.InvalidTimestampError(),
    kafka_errors.UnsupportedForMessageFormatError(),
    kafka_errors.InvalidRequiredAcksError(),
    kafka_errors.UnsupportedVersionError(),
]
IN_DOUBT_SENDS = [
    kafka_errors.KafkaTimeoutError("Batch for Orders-0 containing 1 record(s) expired"),
    kafka_errors.RequestTimedOutError("Request timed out after 999 ms"),
    kafka_errors.KafkaConnectionError("connection lost"),
    kafka_errors.NotLeaderForPartitionError(),
    kafka_errors.NotEnoughReplicasAfterAppendError(),  # appended on the leader
    kafka_errors.NotEnoughReplicasError(),  # retried: an earlier attempt may have gone in
    kafka_errors.UnknownTopicOrPartitionError(),
    kafka_errors.OutOfOrderSequenceNumberError(),
    kafka_errors.ProducerFencedError(),
    # A batch refused for another record's sake: kafka-python says so only in prose.
    kafka_errors.KafkaError("Failed to append record because it was part of a batch which "
                            "had one more more invalid records"),
    RuntimeError("anything else"),
]


@pytest.mark.parametrize("exc", REFUSED_SENDS + IN_DOUBT_SENDS, ids=lambda e: type(e).__name__)
def test_a_failed_send_is_refused_for_sure_or_in_doubt(exc: BaseException) -> None:
    err = send_failure(exc, "half message", "broker:9092", 3.0, "TX1", "TX1")
    assert isinstance(err, SendFailed) and isinstance(err, TxStreamError)
    assert type(exc).__name__ in str(err) and str(err).startswith("half message of TX1 ")
    if exc in REFUSED_SENDS:
        assert type(err) is SendFailed and "refused by broker:9092" in str(err)
    else:
        assert isinstance(err, SendInDoubt)
        assert (err.transaction_id, err.msg_id) == ("TX1", "TX1")
        assert "not acknowledged by broker:9092 within 3s; it may have been stored" in str(err)


def test_a_send_that_raised_before_sending_is_not_in_doubt() -> None:
    err = not_sent(kafka_errors.KafkaTimeoutError("Failed to update metadata after 3.0 secs."),
                   "half message", "TX2")
    assert type(err) is SendFailed
    assert str(err) == ("half message of TX2 not sent: KafkaTimeoutError: Failed to update "
                        "metadata after 3.0 secs.")


class _StubFuture:
    def __init__(self, outcome: object) -> None:
        self.outcome = outcome

    def get(self, timeout: float) -> object:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


class _StubProducer:
    """Answers each send with the next of ``outcomes`` (an error, or record metadata)."""

    def __init__(self, *outcomes: object) -> None:
        self.outcomes, self.sent = list(outcomes), 0

    def send(self, topic: str, **_: object) -> _StubFuture:
        self.sent += 1
        return _StubFuture(self.outcomes.pop(0))


@pytest.mark.parametrize("reset", [kafka_errors.OutOfOrderSequenceNumberError(),
                                   kafka_errors.UnknownProducerIdError(),
                                   kafka_errors.InvalidProducerEpochError()],
                         ids=lambda e: type(e).__name__)
def test_a_send_failed_by_the_producers_sequence_goes_out_once_more(
        reset: BaseException) -> None:
    """After a send in doubt kafka-python starts a new epoch and fails the next batch with a
    sequence error: that record is sent again (a duplicate at worst, which the coordinator
    drops), and a second failure is in doubt like any other."""
    from txstream.client.producer import TransactionProducer
    from txstream.client.renewal import ProducerRenewal
    from txstream.wire import Record

    p = TransactionProducer("g", "127.0.0.1:1", listener=None)
    record = Record(topic="T", key=b"k", value=b"v", headers=())

    def stub(*outcomes: object) -> _StubProducer:
        p._producer = ProducerRenewal(lambda: _StubProducer(*outcomes),  # type: ignore
                                      after_s=10)
        return p._producer.producer  # type: ignore[return-value]

    first = stub(reset, "stored")
    assert p._send(record, "half message", "TX3") == "stored"
    assert first.sent == 2
    stub(reset, reset)
    with pytest.raises(SendInDoubt, match="half message of TX3"):
        p._send(record, "half message", "TX3")
    stub(kafka_errors.KafkaTimeoutError("expired"), "stored")
    with pytest.raises(SendInDoubt):  # a timeout is not sent again: the caller hears of it
        p._send(record, "half message", "TX3")


def test_a_producer_that_acknowledges_nothing_for_a_while_is_replaced() -> None:
    """A client wedged for good (kafka-python 3 after a failed epoch bump) times every send
    out: once none was acknowledged for ``after_s``, the next failure makes a new one, and
    the sends go on; one acknowledged send in between starts the count again."""
    from txstream.client.renewal import ProducerRenewal

    clock = [0.0]
    made: list[object] = []

    def make() -> object:
        made.append(object())
        return made[-1]

    renewal = ProducerRenewal(make, after_s=10, clock=lambda: clock[0])  # type: ignore[arg-type]
    first = renewal.producer
    renewal.unacknowledged(first)
    clock[0] = 6
    renewal.acknowledged()  # one got through: the client works
    renewal.unacknowledged(first)
    clock[0] = 15
    renewal.unacknowledged(first)
    assert renewal.producer is first and renewal.renewals == 0
    clock[0] = 16
    renewal.unacknowledged(first)
    assert renewal.producer is made[1] and renewal.renewals == 1
    renewal.unacknowledged(first)  # a send of the old one, failing late: nothing more
    assert renewal.renewals == 1 and len(made) == 2
