"""The two sides of RocketMQ's transaction example, as ``txstream demo`` runs them.

The producer sends "Hello RocketMQ 0".."9" (tags TagA..TagE, keys KEY0..KEY9); every local
transaction answers UNKNOW and records i % 3, and the back-checks answer 0 -> UNKNOW,
1 -> COMMIT, 2 -> ROLLBACK. The consumer prints every body it receives. ``examples/`` holds
the same example as standalone scripts for readers of the client library.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Sequence

from txstream.client import (
    BoundedExecutor,
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    PushConsumer,
    TransactionListener,
    TransactionProducer,
    TxStreamError,
)
from txstream.kafka import KafkaSettings

__all__ = ["SeedListener", "run_producer", "run_consumer", "TAGS"]

TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")
_CHECK_ANSWERS = {0: LocalTransactionState.UNKNOW, 1: LocalTransactionState.COMMIT_MESSAGE,
                  2: LocalTransactionState.ROLLBACK_MESSAGE}


class SeedListener(TransactionListener):
    """The seed's listener (its "local database" is a dict in memory), counting what it does
    and remembering each transaction's body for the demo's summary."""

    def __init__(self) -> None:
        self._index = itertools.count()
        self._lock = threading.Lock()
        self.local_trans: dict[str, int] = {}
        self.bodies: dict[str, str] = {}
        self.executed = 0
        self.checks_answered = 0

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        txid = msg.transaction_id or ""
        with self._lock:
            self.local_trans[txid] = next(self._index) % 3
            self.bodies[txid] = msg.body_text
            self.executed += 1
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        with self._lock:
            self.checks_answered += 1
            status = self.local_trans.get(msg.transaction_id or "")
        # As in the seed: a transaction this process does not know is committed.
        return _CHECK_ANSWERS.get(status, LocalTransactionState.COMMIT_MESSAGE)  # type: ignore[arg-type]


def run_producer(settings: KafkaSettings, *, topic: str, topic_prefix: str, group: str,
                 stop: threading.Event, out: Callable[[str], None], listener: SeedListener,
                 count: int = 10) -> None:
    """Send the example's messages, then answer back-checks until ``stop`` is set."""
    # The seed's ThreadPoolExecutor(2, 5, ..., ArrayBlockingQueue(2000)).
    executor = BoundedExecutor(max_workers=5, queue_size=2000)
    producer = TransactionProducer(group, listener=listener, executor=executor, kafka=settings,
                                   topic_prefix=topic_prefix)
    producer.start()
    try:
        for i in range(count):
            msg = Message(topic, f"Hello RocketMQ {i}".encode(), tags=TAGS[i % len(TAGS)],
                          keys=f"KEY{i}")
            try:
                out(str(producer.send_message_in_transaction(msg, None)))
            except TxStreamError as exc:
                out(f"send of message {i} failed: {exc}")
            time.sleep(0.01)
        stop.wait()
    finally:
        producer.shutdown()
        executor.shutdown()


def run_consumer(settings: KafkaSettings, *, topic: str, topic_prefix: str, group: str,
                 stop: threading.Event, out: Callable[[str], None],
                 on_message: Callable[[Message], None], started: threading.Event) -> None:
    """Print every body released to ``topic`` until ``stop`` is set (from several threads:
    ``out`` and ``on_message`` must be thread-safe)."""

    def listener(msgs: Sequence[Message]) -> ConsumeStatus:
        for msg in msgs:
            out(f"Consumer===  MessageBody: {msg.body_text}")
            on_message(msg)
        return ConsumeStatus.CONSUME_SUCCESS

    # ``started`` is set before the group has joined (seconds on a small broker) and the
    # producer starts then: from the last offset, RocketMQ's default, a message released in
    # between would be skipped. From the first offset a new group misses none.
    consumer = PushConsumer(group, kafka=settings, topic_prefix=topic_prefix,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(listener)
    consumer.start()
    out("Consumer===Successful start-up!")
    started.set()
    try:
        stop.wait()
    finally:
        consumer.shutdown()
