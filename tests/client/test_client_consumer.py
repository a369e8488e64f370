"""PushConsumer against the real tansu broker.

One consumer (one group join, ~3 s on tansu) serves most tests; what its listener does with a
message is scripted by the message's id, and each test uses its own ids. The tests of
concurrency, bounds and start positions start consumers of their own groups.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndTimestamp

from tests.support.kafka_helpers import read_topic, wait_until
from txstream.client import (
    ClientStateError,
    ConfigError,
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    PushConsumer,
)
from txstream.client.consume_from import start_offsets
from txstream.client.consume_pool import ConsumePool, Job
from txstream.client.retry import RetryHeaders
from txstream.kafka import KafkaSettings, make_producer
from txstream.kafka.group import CommitOnRevoke
from txstream.outputs import encode_visible
from txstream.wire import H, header_dict

pytestmark = pytest.mark.kafka

RETRY_DELAY_S = 0.3
MAX_RECONSUME = 2
FIRST = ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
LAST = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET
TIMESTAMP = ConsumeFromWhere.CONSUME_FROM_TIMESTAMP
OK = ConsumeStatus.CONSUME_SUCCESS


def send(kafka: KafkaSettings, topic: str, body: bytes, tags: str | None = "TagA",
         msg_id: str | None = None, keys: str = "K", partition: int | None = None,
         timestamp_ms: int | None = None) -> tuple[str, int, int]:
    """Release a message as the coordinator does; return (msg id, partition, offset)."""
    mid = msg_id or uuid.uuid4().hex.upper()
    record = encode_visible(Message(topic, body, tags=tags, keys=keys,
                                    properties={"app": "test"}, transaction_id=mid, msg_id=mid,
                                    producer_group="pg", born_timestamp=1_700_000_000_000))
    producer = make_producer(kafka)
    try:
        meta = producer.send(record.topic, key=record.key, value=record.value,
                             headers=list(record.headers), partition=partition,
                             timestamp_ms=timestamp_ms).get(timeout=10)
    finally:
        producer.close()
    return mid, meta.partition, meta.offset


def committed(kafka: KafkaSettings, group: str, topic: str, partition: int) -> int | None:
    c = KafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=group,
                      enable_auto_commit=False)
    try:
        return c.committed(TopicPartition(topic, partition))
    finally:
        c.close()


def start(kafka: KafkaSettings, group: str, topic: str, listener: object,
          **options: object) -> PushConsumer:
    """A started consumer of ``topic`` that reads (it joined and found where to start)."""
    consumer = PushConsumer(group, kafka.bootstrap_servers, **options)  # type: ignore[arg-type]
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)  # type: ignore[arg-type]
    consumer.start()
    try:
        wait_until(lambda: any(tp.topic == topic for tp in consumer.assignment), timeout_s=30)
    except BaseException:
        consumer.shutdown()
        raise
    return consumer


@dataclass
class Script:
    """What the listener does per message id: a list of outcomes, one per delivery."""

    plans: dict[str, list[str]] = field(default_factory=dict)
    calls: list[tuple[str, int, float, Message]] = field(default_factory=list)
    gates: dict[str, threading.Event] = field(default_factory=dict)

    def __call__(self, msgs: list[Message]) -> ConsumeStatus:
        (msg,) = msgs  # consume_batch_max_size=1
        mid = msg.msg_id or ""
        self.calls.append((mid, msg.reconsume_times, time.monotonic(), msg))
        plan = self.plans.get(mid, [])
        step = plan.pop(0) if plan else "ok"
        if step == "later":
            return ConsumeStatus.RECONSUME_LATER
        if step == "raise":
            raise RuntimeError(f"listener failed on {mid}")
        if step == "block":
            assert self.gates[mid].wait(20)
        return ConsumeStatus.CONSUME_SUCCESS

    def calls_of(self, mid: str) -> list[tuple[str, int, float, Message]]:
        return [c for c in self.calls if c[0] == mid]


@dataclass
class Env:
    kafka: KafkaSettings
    topic: str
    consumer: PushConsumer
    script: Script

    def send(self, body: bytes, tags: str | None = "TagA", msg_id: str | None = None,
             keys: str = "K") -> tuple[str, int, int]:
        return send(self.kafka, self.topic, body, tags, msg_id, keys)

    def committed(self, partition: int) -> int | None:
        return committed(self.kafka, self.consumer.consumer_group, self.topic, partition)

    def handled(self, *sent: tuple[str, int, int], timeout_s: float = 20.0) -> None:
        """Wait until the group committed past every one of ``sent``: each was consumed,
        filtered out or dropped as a duplicate."""
        for _, partition, offset in sent:
            wait_until(lambda p=partition, o=offset: (self.committed(p) or 0) > o, timeout_s)


@pytest.fixture(scope="module")
def env(kafka: KafkaSettings) -> Iterator[Env]:
    suffix = uuid.uuid4().hex[:8]
    topic, group = f"cons_{suffix}", f"cg_{suffix}"
    script = Script()
    consumer = PushConsumer(group, kafka.bootstrap_servers, retry_delay_s=RETRY_DELAY_S,
                            max_reconsume_times=MAX_RECONSUME)
    consumer.subscribe(topic, "TagA || TagB")
    consumer.register_message_listener(script)
    e = Env(kafka, topic, consumer, script)
    e.send(b"warm-up")  # creates the topic before the group is formed
    consumer.start()
    wait_until(lambda: {tp.topic for tp in consumer.assignment} == {topic,
                                                                   consumer.retry_topic},
               timeout_s=30)
    yield e
    consumer.shutdown()


def _consumed(env: Env, mid: str, n: int = 1, timeout_s: float = 20.0) -> list:
    return wait_until(lambda: (c := env.script.calls_of(mid)) and len(c) >= n and c, timeout_s)


def test_tags_are_filtered_on_the_client(env: Env) -> None:
    sent = {tags: env.send(f"tagged {tags}".encode(), tags=tags)
            for tags in ("TagA", "TagB", "TagC", None)}
    ids = {tags: s[0] for tags, s in sent.items()}
    env.handled(*sent.values())
    delivered = {c[0] for c in env.script.calls}
    assert ids["TagA"] in delivered and ids["TagB"] in delivered
    assert ids["TagC"] not in delivered and ids[None] not in delivered


def test_received_message_carries_its_ids_and_properties(env: Env) -> None:
    mid, partition, offset = env.send(b"hello", tags="TagA", keys="KEY7")
    (_, reconsume, _, msg), = _consumed(env, mid)
    assert (msg.topic, msg.body, msg.tags, msg.keys) == (env.topic, b"hello", "TagA", "KEY7")
    assert msg.msg_id == msg.transaction_id == mid
    assert msg.properties["app"] == "test" and msg.producer_group == "pg"
    assert (msg.queue_id, msg.queue_offset, reconsume) == (partition, offset, 0)
    wait_until(lambda: (env.committed(partition) or 0) >= offset + 1, timeout_s=10)


@pytest.mark.parametrize("failure", ["later", "raise"])
def test_failed_message_is_redelivered_after_the_delay(env: Env, failure: str) -> None:
    mid = uuid.uuid4().hex.upper()
    env.script.plans[mid] = [failure]
    env.send(b"try again", msg_id=mid)
    first, second = _consumed(env, mid, 2)
    assert (first[1], second[1]) == (0, 1)  # reconsume_times
    assert second[2] - first[2] >= RETRY_DELAY_S * 0.9
    again = second[3]
    assert (again.topic, again.body, again.msg_id) == (env.topic, b"try again", mid)
    # The retry bookkeeping is not shown: the message reads as it did the first time.
    assert again.properties == first[3].properties and again.properties["app"] == "test"
    assert not set(again.properties) & RetryHeaders.ALL
    time.sleep(RETRY_DELAY_S * 2)
    assert len(env.script.calls_of(mid)) == 2  # consumed: not delivered again


def test_message_goes_to_the_dead_letter_topic_after_max_attempts(env: Env) -> None:
    mid = uuid.uuid4().hex.upper()
    env.script.plans[mid] = ["later"] * (MAX_RECONSUME + 5)
    _, partition, offset = env.send(b"poison", msg_id=mid)
    dlq = env.consumer.dlq_topic
    assert dlq == f"TXSTREAM_DLQ_{env.consumer.consumer_group}"
    records = wait_until(lambda: [r for r in read_topic(env.kafka, dlq)
                                  if header_dict(r.headers).get(H.UNIQ_KEY) == mid], 20)
    (rec,) = records
    h = header_dict(rec.headers)
    assert rec.value == b"poison"
    assert str(MAX_RECONSUME + 1) in h[H.DLQ_REASON] and "max_reconsume_times" in h[H.DLQ_REASON]
    assert h[H.DLQ_ORIGIN_TOPIC] == env.topic
    assert h["RECONSUME_TIME"] == str(MAX_RECONSUME)
    assert [c[1] for c in env.script.calls_of(mid)] == list(range(MAX_RECONSUME + 1))
    time.sleep(RETRY_DELAY_S * 2)
    assert len(env.script.calls_of(mid)) == MAX_RECONSUME + 1  # and then no more
    wait_until(lambda: (env.committed(partition) or 0) >= offset + 1, timeout_s=10)


def test_a_message_released_twice_reaches_the_listener_once(env: Env) -> None:
    mid = uuid.uuid4().hex.upper()
    copies = [env.send(b"once", msg_id=mid),
              env.send(b"once", msg_id=mid),  # the coordinator replayed its release
              env.send(b"once", msg_id=mid, keys="another-key")]  # even in another partition
    env.handled(*copies)
    assert len(env.script.calls_of(mid)) == 1
    assert env.consumer.stats["duplicates"] >= 2


def test_offset_is_committed_only_after_success(env: Env) -> None:
    mid = uuid.uuid4().hex.upper()
    gate = threading.Event()
    env.script.gates[mid] = gate
    env.script.plans[mid] = ["block"]
    _, partition, offset = env.send(b"slow", msg_id=mid)
    try:
        _consumed(env, mid)
        time.sleep(0.3)
        assert (env.committed(partition) or 0) <= offset
    finally:
        gate.set()
    wait_until(lambda: (env.committed(partition) or 0) >= offset + 1, timeout_s=10)


def test_consumer_state_errors(kafka: KafkaSettings) -> None:
    c = PushConsumer("cg_state", kafka.bootstrap_servers)
    with pytest.raises(ClientStateError, match="subscribe"):
        c.start()
    c.subscribe("some_topic")
    with pytest.raises(ClientStateError, match="listener"):
        c.start()
    with pytest.raises(ConfigError):
        c.subscribe("bad topic!")
    with pytest.raises(ConfigError, match="own retry"):
        c.subscribe(c.retry_topic)
    with pytest.raises(ConfigError):
        PushConsumer("bad group!", kafka.bootstrap_servers)
    with pytest.raises(ConfigError, match="retry delays"):
        PushConsumer("cg", kafka.bootstrap_servers, retry_delay_s=-1)


def test_consumer_options_are_checked(kafka: KafkaSettings) -> None:
    with pytest.raises(ConfigError, match="consume_thread_max must be an integer >= "
                                          "consume_thread_min"):
        PushConsumer("cg", kafka.bootstrap_servers, consume_thread_min=4, consume_thread_max=2)
    with pytest.raises(ConfigError, match="consume_thread_min must be an integer >= 1"):
        PushConsumer("cg", kafka.bootstrap_servers, consume_thread_min=0)
    with pytest.raises(ConfigError, match="pull_threshold_for_queue"):
        PushConsumer("cg", kafka.bootstrap_servers, pull_threshold_for_queue=0)
    with pytest.raises(ConfigError, match="consume_from_where must be one of"):
        PushConsumer("cg", kafka.bootstrap_servers, consume_from_where="SOMEWHERE")
    c = PushConsumer("cg", kafka.bootstrap_servers, consume_from_where="CONSUME_FROM_TIMESTAMP")
    assert c.consume_from_where is TIMESTAMP
    d = PushConsumer("cg", kafka.bootstrap_servers)
    assert (d.consume_thread_min, d.consume_thread_max, d.consume_from_where) == (20, 20, LAST)
    assert (d.retry_topic, d.dlq_topic) == ("TXSTREAM_RETRY_cg", "TXSTREAM_DLQ_cg")


def test_pool_grows_to_its_maximum_while_work_waits_then_shrinks_back() -> None:
    pool = ConsumePool(1, 3, "ConsumeMessageThread_unit", keep_alive_s=0.2).start()
    barrier = threading.Barrier(4)  # three jobs and this test: all three run at once
    names: list[str] = []

    def job() -> None:
        names.append(threading.current_thread().name)
        barrier.wait(10)

    jobs = [Job(job) for _ in range(3)]
    try:
        for j in jobs:
            pool.submit(j)
        barrier.wait(10)
        assert all(j.done.wait(10) for j in jobs)
        assert pool.threads <= 3
        assert sorted(names) == [f"ConsumeMessageThread_unit_{i}" for i in (1, 2, 3)]
        wait_until(lambda: pool.threads == 1, timeout_s=10, interval_s=0.05)
        queued = Job(job)
        pool.shutdown()
        pool.submit(queued)  # after shutdown: cancelled, never run
        assert queued.done.is_set() and len(names) == 3
    finally:
        pool.shutdown()


def test_listener_runs_on_pool_threads_concurrently(kafka: KafkaSettings, unique: str) -> None:
    topic, group, n, threads, sleep_s = f"{unique}_conc", f"{unique}_cg", 12, 4, 0.4
    for i in range(n):  # one partition: its messages too are consumed concurrently
        send(kafka, topic, f"m{i}".encode(), partition=0)
    lock = threading.Lock()
    running, peak = 0, 0
    names: set[str] = set()
    spans: list[tuple[float, float]] = []

    def listener(msgs: list[Message]) -> ConsumeStatus:
        nonlocal running, peak
        began = time.monotonic()
        with lock:
            running += 1
            peak = max(peak, running)
            names.add(threading.current_thread().name)
        time.sleep(sleep_s)  # the work
        with lock:
            running -= 1
            spans.append((began, time.monotonic()))
        return OK

    consumer = start(kafka, group, topic, listener, consume_thread_min=threads,
                     consume_thread_max=threads, consume_from_where=FIRST)
    try:
        wait_until(lambda: len(spans) == n, timeout_s=30)
        wait_until(lambda: committed(kafka, group, topic, 0) == n, timeout_s=10)
    finally:
        consumer.shutdown()
    elapsed = max(e for _, e in spans) - min(b for b, _ in spans)
    assert peak == threads
    assert n / threads * sleep_s * 0.9 <= elapsed < n * sleep_s / 2, elapsed
    assert len(names) == threads
    assert all(name.startswith(f"ConsumeMessageThread_{group}_") for name in names), names


def test_a_slow_message_holds_back_the_commit_and_is_delivered_again(
    kafka: KafkaSettings, unique: str
) -> None:
    topic, group = f"{unique}_slow", f"{unique}_cg"
    sent = [send(kafka, topic, f"m{i}".encode(), partition=0) for i in range(6)]
    slow = sent[1]
    gate = threading.Event()
    done: list[str] = []

    def first(msgs: list[Message]) -> ConsumeStatus:
        (msg,) = msgs
        if msg.msg_id == slow[0]:
            gate.wait(30)
            return OK
        done.append(msg.msg_id or "")
        return OK

    a = start(kafka, group, topic, first, consume_thread_min=4, consume_thread_max=4,
              consume_from_where=FIRST, drain_timeout_s=0.5)
    try:
        # Consumed out of order: all but the slow one. Only what lies before it is committed.
        wait_until(lambda: len(done) == 5, timeout_s=30)
        wait_until(lambda: committed(kafka, group, topic, 0) == slow[2], timeout_s=10)
    finally:
        a.shutdown()  # gives up on the slow one after drain_timeout_s: left uncommitted
    assert committed(kafka, group, topic, 0) == slow[2]
    gate.set()  # the abandoned call ends now; it no longer counts for the group

    again: list[str] = []
    b = start(kafka, group, topic, lambda msgs: again.extend(m.msg_id for m in msgs) or OK)
    try:
        wait_until(lambda: committed(kafka, group, topic, 0) == len(sent), timeout_s=30)
    finally:
        b.shutdown()
    # Kafka keeps one offset per partition: the unfinished message comes again, and so do
    # the ones after it; the one before it, committed, does not.
    assert sorted(again) == sorted(mid for mid, _, _ in sent[1:])


def test_messages_in_flight_per_partition_are_bounded(kafka: KafkaSettings,
                                                      unique: str) -> None:
    topic, group, n = f"{unique}_bound", f"{unique}_cg", 10
    for i in range(n):
        send(kafka, topic, f"m{i}".encode(), partition=0)
    gate, cond = threading.Event(), threading.Condition()
    entered: list[str] = []

    def listener(msgs: list[Message]) -> ConsumeStatus:
        with cond:
            entered.extend(m.msg_id or "" for m in msgs)
            cond.notify_all()
        gate.wait(30)
        return OK

    consumer = start(kafka, group, topic, listener, consume_thread_min=8, consume_thread_max=8,
                     pull_threshold_for_queue=3, consume_from_where=FIRST)
    try:
        with cond:
            assert cond.wait_for(lambda: len(entered) >= 3, 30)
            # Eight threads are free, but only three messages were taken from the partition.
            assert not cond.wait_for(lambda: len(entered) > 3, 1.0)
        gate.set()
        wait_until(lambda: len(entered) == n, timeout_s=30)
        wait_until(lambda: committed(kafka, group, topic, 0) == n, timeout_s=10)
    finally:
        gate.set()
        consumer.shutdown()
    assert len(set(entered)) == n


def test_a_slow_message_bounds_how_far_its_partition_runs_ahead(kafka: KafkaSettings,
                                                                unique: str) -> None:
    topic, group = f"{unique}_span", f"{unique}_cg"
    sent = [send(kafka, topic, f"m{i}".encode(), partition=0)[0] for i in range(10)]
    gate, cond = threading.Event(), threading.Condition()
    consumed: list[str] = []

    def listener(msgs: list[Message]) -> ConsumeStatus:
        (msg,) = msgs
        if msg.msg_id == sent[0]:
            gate.wait(30)
        with cond:
            consumed.append(msg.msg_id or "")
            cond.notify_all()
        return OK

    consumer = start(kafka, group, topic, listener, consume_thread_min=4, consume_thread_max=4,
                     consume_concurrently_max_span=4, consume_from_where=FIRST)
    try:
        with cond:
            assert cond.wait_for(lambda: set(consumed) == set(sent[1:4]), 30)
            # Offset 4 is as far from the unfinished offset 0 as the span allows.
            assert not cond.wait_for(lambda: len(consumed) > 3, 1.0)
        gate.set()
        wait_until(lambda: committed(kafka, group, topic, 0) == len(sent), timeout_s=30)
    finally:
        gate.set()
        consumer.shutdown()
    assert sorted(consumed) == sorted(sent)


def test_a_new_group_starts_at_the_last_offset_then_resumes_at_its_commits(
    kafka: KafkaSettings, unique: str
) -> None:
    topic, group = f"{unique}_last", f"{unique}_cg"
    send(kafka, topic, b"before", partition=0)
    seen: list[bytes] = []

    def listener(msgs: list[Message]) -> ConsumeStatus:
        seen.extend(m.body for m in msgs)
        return OK

    consumer = start(kafka, group, topic, listener)  # CONSUME_FROM_LAST_OFFSET by default
    try:
        _, _, offset = send(kafka, topic, b"after", partition=0)
        wait_until(lambda: committed(kafka, group, topic, 0) == offset + 1, timeout_s=20)
        # Where it started was committed, also where it consumed nothing.
        wait_until(lambda: committed(kafka, group, topic, 1) == 0, timeout_s=10)
    finally:
        consumer.shutdown()
    assert seen == [b"after"]

    seen.clear()
    send(kafka, topic, b"while down 0", partition=0)
    send(kafka, topic, b"while down 1", partition=1)
    again = start(kafka, group, topic, listener)
    try:
        wait_until(lambda: len(seen) >= 2, timeout_s=20)
        wait_until(lambda: committed(kafka, group, topic, 1) == 1, timeout_s=10)
    finally:
        again.shutdown()
    assert sorted(seen) == [b"while down 0", b"while down 1"]


@pytest.mark.parametrize("where", [FIRST, TIMESTAMP])
def test_first_offset_and_timestamp_start_positions(kafka: KafkaSettings, unique: str,
                                                    where: ConsumeFromWhere) -> None:
    topic, group = f"{unique}_from", f"{unique}_cg"
    send(kafka, topic, b"old", partition=0)
    # Stored after "old" was acknowledged: tansu looks a timestamp up by when it stored each
    # record (Kafka by the record's own timestamp, set when it was sent: the same order here).
    between = int(time.time() * 1000) + 1
    while int(time.time() * 1000) <= between:
        time.sleep(0.001)  # the clock, not another thread: nothing to wait on instead
    _, _, offset = send(kafka, topic, b"new", partition=0)
    send(kafka, topic, b"new elsewhere", partition=1)
    seen: list[bytes] = []
    consumer = start(kafka, group, topic, lambda msgs: seen.extend(m.body for m in msgs) or OK,
                     consume_from_where=where, consume_timestamp=between)
    try:
        wait_until(lambda: committed(kafka, group, topic, 0) == offset + 1, timeout_s=20)
        wait_until(lambda: committed(kafka, group, topic, 1) == 1, timeout_s=10)
    finally:
        consumer.shutdown()
    expected = [b"new", b"new elsewhere"] + ([b"old"] if where is FIRST else [])
    assert sorted(seen) == sorted(expected)


def test_start_offsets_from_the_brokers_answers() -> None:
    tps = [TopicPartition("t", p) for p in range(4)]
    ends = {tps[0]: 10, tps[1]: 5, tps[2]: 0, tps[3]: 7}
    found = {
        tps[0]: OffsetAndTimestamp(3, 1_700_000_000_000, 0),  # the first record at or after
        tps[1]: OffsetAndTimestamp(0, -1, 0),  # tansu's answer when there is none
        tps[2]: None,  # Kafka's answer when there is none
        tps[3]: OffsetAndTimestamp(9, 1_700_000_000_000, 0),  # stored past the end read
    }
    assert start_offsets(TIMESTAMP, tps, ends, found) == {tps[0]: 3, tps[1]: 5, tps[2]: 0,
                                                          tps[3]: 7}
    assert start_offsets(LAST, tps, ends, found) == ends
    assert start_offsets(FIRST, tps, ends, found) == {}


def test_a_rebalance_waits_for_the_messages_being_consumed_and_commits_them(
    kafka: KafkaSettings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic, group = f"{unique}_rebal", f"{unique}_cg"
    x, _, x_offset = send(kafka, topic, b"x", partition=0)
    revoking = threading.Event()
    revoke = CommitOnRevoke.on_partitions_revoked

    async def spy(self: CommitOnRevoke, revoked: object) -> None:
        if revoked:
            revoking.set()
        await revoke(self, revoked)

    monkeypatch.setattr(CommitOnRevoke, "on_partitions_revoked", spy)
    a_seen: list[str] = []
    b_seen: list[str] = []

    def slow(msgs: list[Message]) -> ConsumeStatus:
        a_seen.extend(m.msg_id or "" for m in msgs)
        assert revoking.wait(30)  # still being consumed when the group rebalances
        time.sleep(0.5)  # the work goes on a while after the revocation started
        return OK

    a = start(kafka, group, topic, slow, consume_from_where=FIRST)
    b = None
    try:
        wait_until(lambda: a_seen == [x], timeout_s=20)
        b = start(kafka, group, topic, lambda msgs: b_seen.extend(m.msg_id for m in msgs) or OK,
                  consume_from_where=FIRST)
        wait_until(lambda: committed(kafka, group, topic, 0) == x_offset + 1, timeout_s=20)
        wait_until(lambda: a.assignment and b.assignment, timeout_s=20)
    finally:
        for c in (b, a):
            if c is not None:
                c.shutdown()
    # Committed on revocation once consumed: neither its next owner nor this consumer
    # (dropping it as a duplicate) got it again.
    assert a_seen == [x] and x not in b_seen
    assert a.stats["duplicates"] == 0 and a.stats["consumed"] == 1


def test_a_consumer_of_a_topic_that_does_not_exist_yet_gets_its_partitions(
    own_kafka_cluster: Any, unique: str
) -> None:
    """Apache Kafka (its defaults: one partition a topic) creates a topic on the metadata
    request that names it. Joined before that look-up, one such join in two to eight was
    assigned no partition and never rejoined (kafka-python's assignment snapshot). Ten in a
    row all get theirs."""
    with own_kafka_cluster() as broker:
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        for i in range(10):
            topic = f"{unique}_new{i}"
            consumer = start(kafka, f"{unique}_cg{i}", topic, lambda msgs: OK)
            try:
                assert {tp.topic for tp in consumer.assignment} >= {topic}
            finally:
                consumer.shutdown()
