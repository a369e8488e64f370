"""The recovery demo's clients: producers of one group sending at a steady rate, and a consumer.

The mix: commits, rollbacks, and UNKNOW answers settled by back-checks (half of them commit).
The producers share one :class:`~txstream.streaming.cli.recovery_ledger.Ledger`, so any of them
answers a check about any transaction of the group. The consumer (``PushConsumer``, a group of
its own, from the first offset) reads the real topic as an application would.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence

from txstream.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    Message,
    PushConsumer,
    SendFailed,
    SendInDoubt,
    TransactionProducer,
    TxStreamError,
)
from txstream.kafka import KafkaSettings
from txstream.streaming.cli.recovery_ledger import PLANS, Ledger, LedgerListener, Plan
from txstream.topics import Topics

__all__ = ["Traffic", "ReleaseConsumer", "MIX"]

# plan -> share of the transactions
MIX = {"commit": 0.45, "rollback": 0.25, "unknown-commit": 0.15, "unknown-rollback": 0.15}


class Traffic:
    """``producers`` TransactionProducers of ``group``, sending ``rate`` transactions a second
    to ``topic`` on a thread of their own between :meth:`begin` and :meth:`stop_sending`."""

    def __init__(self, settings: KafkaSettings, topics: Topics, *, group: str, topic: str,
                 ledger: Ledger, rate: float, producers: int = 2, seed: int = 43) -> None:
        self.topic, self.rate, self.ledger = topic, rate, ledger
        listener = LedgerListener(ledger)
        self._producers = [TransactionProducer(group, kafka=settings, topics=topics,
                                               listener=listener) for _ in range(producers)]
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.not_sent = 0  # refused before it was stored: nothing to settle
        self.errors: list[str] = []

    def start(self) -> Traffic:
        """Connect the producers (each joins the group's check consumers)."""
        for producer in self._producers:
            producer.start()
        return self

    def begin(self) -> None:
        self._thread = threading.Thread(target=self._run, name="recovery-traffic", daemon=True)
        self._thread.start()

    def _plan(self) -> Plan:
        roll, total = self._rng.random(), 0.0
        for name, share in MIX.items():
            total += share
            if roll < total:
                return PLANS[name]
        return PLANS["commit"]

    def _send(self, i: int) -> None:
        plan = self._plan()
        producer = self._producers[i % len(self._producers)]
        msg = Message(self.topic, f"order {i}".encode(), keys=f"order-{i}")
        try:
            result = producer.send_message_in_transaction(msg, plan)
        except SendInDoubt as exc:  # maybe stored: its check is answered ROLLBACK
            if exc.transaction_id:
                self.ledger.in_doubt(exc.transaction_id)
            return
        except SendFailed:
            self.not_sent += 1
            return
        if plan.first is plan.outcome and result.end_acknowledged:
            self.ledger.told(result.transaction_id)

    def _run(self) -> None:
        started, i = time.monotonic(), 0
        while not self._stop.is_set():
            try:
                self._send(i)
            except TxStreamError as exc:  # the verdict says it; the traffic goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            i += 1
            due = started + i / self.rate
            late = time.monotonic() - due
            if late > 1.0:  # a stalled broker: keep the rate from now on, no burst after it
                started += late
            self._stop.wait(max(0.0, due - time.monotonic()))

    def stop_sending(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    @property
    def checks_answered(self) -> int:
        return sum(p.checks_answered for p in self._producers)

    def close(self) -> None:
        """Stop sending, then shut the producers down (they answer checks until then)."""
        self.stop_sending()
        for producer in self._producers:
            try:
                producer.shutdown()
            except TxStreamError:
                pass


class ReleaseConsumer:
    """A consumer of the real topic: each message it was handed, by transaction id."""

    def __init__(self, settings: KafkaSettings, topics: Topics, topic: str) -> None:
        self.received: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._consumer = PushConsumer(
            f"recovery_demo_{uuid.uuid4().hex[:6]}", kafka=settings, topic_prefix=topics.prefix,
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
        self._consumer.subscribe(topic, "*")
        self._consumer.register_message_listener(self._take)

    def _take(self, msgs: Sequence[Message]) -> ConsumeStatus:
        with self._lock:
            for msg in msgs:
                self.received[msg.transaction_id or msg.msg_id or ""] += 1
        return ConsumeStatus.CONSUME_SUCCESS

    def start(self) -> ReleaseConsumer:
        self._consumer.start()
        return self

    @property
    def duplicates_dropped(self) -> int:
        return int(self._consumer.stats["duplicates"])

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.received)

    def close(self) -> None:
        self._consumer.shutdown()
