"""Back-checks through the running coordinator when a producer group goes away and returns,
and an end event that comes just before a discard (real broker, real local Spark).

A group away for several check intervals: its returning producer is asked ``check_max`` times
per transaction (give or take one), first within seconds of its start, whatever became of the
group's last producer (left cleanly after joining, or stopped before its check consumer had
joined), and nothing is discarded before it answered.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.kafka_helpers import (
    end_record,
    half_record,
    headers_of,
    history_of,
    produce,
    read_topic,
    wait_for,
    wait_until,
)
from txstream.client import LocalTransactionState, Message, TransactionListener, TransactionProducer
from txstream.kafka import KafkaSettings
from txstream.message import Decision
from txstream.state.policy import Policy
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.query import start_coordinator
from txstream.topics import Topics

pytestmark = pytest.mark.spark

POLICY = Policy(transaction_timeout=2000, check_interval=2000, check_max=3,
                reserved_time=3_600_000, resolved_retention=120_000)
AWAY_S = 14.0  # seven check intervals
TRANSACTIONS = 3


@dataclass
class Running:
    kafka: KafkaSettings
    topics: Topics


@pytest.fixture(scope="module")
def coordinator(spark: object, kafka: KafkaSettings, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Running]:
    topics = Topics.with_prefix(f"d{uuid.uuid4().hex[:8]}_")
    config = RunConfig(kafka=kafka, topics=topics, policy=POLICY, buckets=4,
                       checkpoint_dir=tmp_path_factory.mktemp("cp"),
                       query_name=f"delivery-{uuid.uuid4().hex[:6]}")
    query = start_coordinator(spark, config)
    txid, real = f"warmup-{uuid.uuid4().hex[:8]}", f"{topics.half}_warmup"
    produce(kafka, [half_record(topics, txid, "warmup", real),
                    end_record(topics, txid, "warmup", Decision.COMMIT_MESSAGE)])
    wait_for(kafka, real, 1, timeout_s=120)
    yield Running(kafka, topics)
    query.stop()


class Unknown(TransactionListener):
    """Answers UNKNOW to everything, and records when each check came."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self._lock = threading.Lock()

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self._lock:
            times = int(msg.get_property("TRANSACTION_CHECK_TIMES") or 0)
            self.calls[msg.transaction_id or ""].append((time.monotonic(), times))
        return LocalTransactionState.UNKNOW


def _producer(run: Running, group: str, listener: TransactionListener) -> TransactionProducer:
    return TransactionProducer(group, listener=listener, kafka=run.kafka, topics=run.topics)


def _discards(run: Running, txids: set[str]) -> list[object]:
    return [r for r in read_topic(run.kafka, run.topics.discard) if r.key.decode() in txids]


@pytest.mark.parametrize("last_producer", ["left after joining", "stopped before joining"])
def test_a_group_back_after_several_intervals_gets_check_max_checks(
    coordinator: Running, last_producer: str
) -> None:
    run, group = coordinator, f"away-{uuid.uuid4().hex[:8]}"
    real = f"{run.topics.half}_{group}"
    first = _producer(run, group, Unknown()).start()
    if last_producer == "left after joining":
        wait_until(lambda: first.check_partitions, timeout_s=60)
    txids = {first.send_message_in_transaction(Message(real, f"m{i}".encode()), None)
             .transaction_id for i in range(TRANSACTIONS)}
    first.shutdown()
    time.sleep(AWAY_S)
    requests = [r for r in read_topic(run.kafka, run.topics.check(group))
                if r.key.decode() in txids]
    assert not _discards(run, txids), "discarded while nobody could answer"

    listener = Unknown()
    started = time.monotonic()
    with _producer(run, group, listener):
        wait_until(lambda: len(_discards(run, txids)) == TRANSACTIONS, timeout_s=90)
    discards = _discards(run, txids)
    assert {int(headers_of(d)["TRANSACTION_CHECK_TIMES"]) for d in discards} == {3}
    for txid in txids:
        calls = listener.calls[txid]
        assert POLICY.check_max <= len(calls) <= POLICY.check_max + 1, calls
        assert calls[0][0] - started < 10.0, "the first check came late"
    answered_before = [n for txid in txids for n in history_of(run.kafka, run.topics, txid)
                       if n["event"] == "discarded" and n.get("checks_sent", 0) < 3]
    assert not answered_before
    # Away for seven intervals, the group was sent a few requests per transaction, not seven.
    first_call = min(c[0][0] for c in listener.calls.values()) - started
    print(f"\n{last_producer}: {len(requests) / TRANSACTIONS:.1f} requests per transaction "
          f"in {AWAY_S:.0f}s away; first check {first_call:.1f}s after the producer started; "
          f"calls per transaction {sorted(len(c) for c in listener.calls.values())}")
    assert len(requests) <= 4 * TRANSACTIONS


def test_an_end_event_just_before_the_discard_deadline_wins(coordinator: Running) -> None:
    run, group = coordinator, f"late-{uuid.uuid4().hex[:8]}"
    txid, real = f"{group}-tx", f"{run.topics.half}_{group}"
    produce(run.kafka, [half_record(run.topics, txid, group, real),
                        end_record(run.topics, txid, group, Decision.UNKNOW)])
    answered: set[int] = set()

    def counted() -> bool:
        """Play the producer: answer every check at once, UNKNOW. Only an answer to the
        latest check counts, so one read after the next check was sent is answered again by
        the next answer; until ``check_max`` answers counted."""
        for r in read_topic(run.kafka, run.topics.check(group)):
            number = int(headers_of(r)["TRANSACTION_CHECK_TIMES"])
            if r.key == txid.encode() and number not in answered:
                answered.add(number)
                produce(run.kafka, [end_record(run.topics, txid, group, Decision.UNKNOW,
                                               from_check=True, check_times=number)])
        return any(n["event"] == "unknown" and n.get("checks_answered") == POLICY.check_max
                   for n in history_of(run.kafka, run.topics, txid))

    wait_until(counted, timeout_s=90)
    last = max((n for n in history_of(run.kafka, run.topics, txid)
                if n["event"] == "check_sent"), key=lambda n: n["check"])
    deadline_ms = last["next_check"]  # the discard is due then: no check follows check_max
    # Within the timer lead (500 ms) of the deadline: an early discard would beat it.
    time.sleep(max(0.0, (deadline_ms - 300) / 1000 - time.time()))
    produce(run.kafka, [end_record(run.topics, txid, group, Decision.COMMIT_MESSAGE)])
    [released] = wait_for(run.kafka, real, 1, timeout_s=30)
    assert released.value == b"body"
    time.sleep(2)
    assert not [r for r in read_topic(run.kafka, run.topics.discard) if r.key == txid.encode()]
    assert not [r for r in read_topic(run.kafka, run.topics.dead_letter)
                if r.key == txid.encode()]
