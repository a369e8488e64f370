"""``TransactionTestDriver``: an application's listeners against a coordinator in memory.

What Kafka Streams' ``TopologyTestDriver`` is to a topology: the coordinator's real code (its
source, per-key step, timers, sink and recovery) run by :class:`~txstream.testing.spark_model.
SparkModel`, Spark's micro-batch contract without Spark, over the in-memory Kafka
(:mod:`txstream.kafka.memory`), on a virtual clock. The application's producers are real
:class:`~txstream.client.producer.TransactionProducer` objects talking to that broker; the
driver hands them their group's back-checks, as their check consumers would, so a test needs no
thread and no wait: time moves only in :meth:`TransactionTestDriver.advance`.

The broker answers as Apache Kafka does, and the coordinator writes in Kafka transactions (its
default there): what :meth:`TransactionTestDriver.visible` returns is what a
``read_committed`` consumer is handed.
"""

from __future__ import annotations

import itertools
import random
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from txstream.client.check_choice import CheckChoice, Fetched, Verdict
from txstream.client.consume_service import decode
from txstream.client.listener import LocalTransactionState, TransactionListener
from txstream.client.producer import TransactionProducer, TransactionSendResult
from txstream.errors import MalformedRecord, TxStreamError
from txstream.headers import header_dict
from txstream.kafka.memory import MemoryBroker, StoredRecord
from txstream.kafka.memory_registry import register, unregister
from txstream.message import Message
from txstream.outputs import decode_check
from txstream.sinks.kafka_sink import SinkOptions
from txstream.sources.kafka_io import SourceOptions
from txstream.state.keys import KeyLayout
from txstream.state.policy import Policy
from txstream.streaming.engine.key_step import KeyStep
from txstream.testing.spark_model import SimCrash, SparkModel
from txstream.topics import Topics
from txstream.wire import H, decode_half

__all__ = ["TransactionTestDriver", "Discarded", "ProducerKilled"]

_NAMES = itertools.count(1)
# Micro-batches in a row at one instant before the driver gives up: a loop that never
# settles is a defect to show, not to wait on.
_MAX_BATCHES = 200


class ProducerKilled(BaseException):
    """The producer's process died here (a BaseException: the client's own ``except
    Exception`` does not take it for a listener's failure)."""


@dataclass(frozen=True)
class Discarded:
    """A half message the coordinator gave up on, as its discard topic holds it."""

    transaction_id: str
    message: Message
    reason: str
    check_times: int


class _Member:
    """One producer of a group, as the driver runs it."""

    def __init__(self, producer: TransactionProducer, listener: TransactionListener,
                 grace_ms: int) -> None:
        self.producer = producer
        self.listener = listener
        self.choice = CheckChoice(grace_ms)  # each producer process judges requests itself
        self.alive = True
        self.die_after_local_transaction = False


class _Hosted(TransactionListener):
    """The application's listener, with the driver's kill point after the local transaction."""

    def __init__(self, member: _Member) -> None:
        self.member = member

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        state = self.member.listener.execute_local_transaction(msg, arg)
        if self.member.die_after_local_transaction:
            self.member.alive = False
            raise ProducerKilled(f"producer of {msg.producer_group} killed after the local "
                                 f"transaction of {msg.transaction_id}, before its end event")
        return state

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return self.member.listener.check_local_transaction(msg)


class TransactionTestDriver:
    """A coordinator, its broker and a virtual clock, in this process; a context manager.

    ``check_interval_s``, ``check_max``, ``transaction_timeout_s``: the coordinator's
    (``txstream run``'s ``--check-interval``, ``--check-max``, ``--transaction-timeout``);
    ``trigger_s``: the time between micro-batches; ``transactions``: the coordinator writes in
    Kafka transactions (False: the ordered path, as on a broker without them).
    """

    def __init__(self, *, check_interval_s: float = 60.0, check_max: int = 15,
                 transaction_timeout_s: float = 6.0, trigger_s: float = 1.0,
                 transactions: bool = True, topic_prefix: str = "", seed: int = 0) -> None:
        # The wall clock at the start: the producers stamp their messages with it.
        self.now = int(time.time() * 1000)
        self.trigger_ms = max(1, int(trigger_s * 1000))
        self.topics = Topics.with_prefix(topic_prefix) if topic_prefix else Topics()
        self.broker = MemoryBroker(f"txstream-testing-{next(_NAMES)}", lambda: self.now,
                                   random.Random(seed), in_flight_probability=0.0,
                                   stale_fetch_probability=0.0, wait=self._waited)
        register(self.broker)
        for topic in (self.topics.half, self.topics.end):
            self.broker.create_topic(topic, 2)
        # No timer lead: the sink then holds no check request until its deadline.
        self.policy = Policy(transaction_timeout=int(transaction_timeout_s * 1000),
                             check_interval=int(check_interval_s * 1000), check_max=check_max,
                             timer_lead=0)
        self._dir = tempfile.TemporaryDirectory(prefix="txstream-testing-")
        self._spark = self._model(Path(self._dir.name), transactions)
        self._groups: dict[str, list[_Member]] = {}
        self._read: dict[tuple[str, int], int] = {}  # check-topic positions
        self._crash_next: str | None = None
        self.coordinator_restarts = 0

    def _model(self, workdir: Path, transactions: bool) -> SparkModel:
        settings, topics, layout = self.broker.settings, self.topics, KeyLayout()
        timers = str(workdir / "timers.json")
        source = SourceOptions(kafka=settings, half_topic=topics.half, end_topic=topics.end,
                               key_layout=layout, timer_file=timers,
                               journal_topic=topics.history)
        sink = SinkOptions(kafka=settings, timer_file=timers,
                           dead_letter_topic=topics.dead_letter, half_topic=topics.half,
                           transactional_id=f"txstream-{topics.half}" if transactions else None)
        return SparkModel(
            source=source, sink=sink,
            step_of=lambda: KeyStep(self.policy, topics, settings),
            partitions=layout.partitions, clock=lambda: self.now, rng=random.Random(0),
            timer_file=workdir / "timers.json", max_offsets=None)

    # --- the application's side --------------------------------------------------------------

    def producer(self, group: str, listener: TransactionListener) -> TransactionProducer:
        """A started producer of ``group`` on the driver's broker; its back-checks are handed
        to ``listener`` by :meth:`advance` (one producer of the group each)."""
        member = _Member(TransactionProducer(group, kafka=self.broker.settings,
                                             topics=self.topics, answer_checks=False),
                         listener, grace_ms=10_000)
        member.producer.set_transaction_listener(_Hosted(member))
        member.producer.start()
        self._groups.setdefault(group, []).append(member)
        return member.producer

    def send(self, producer: TransactionProducer, msg: Message, arg: object = None
             ) -> TransactionSendResult:
        """``producer.send_message_in_transaction(msg, arg)``. A producer killed in it
        (:meth:`kill_producer_after_local_transaction`) is shut down: it sends nothing again."""
        try:
            return producer.send_message_in_transaction(msg, arg)
        except ProducerKilled:
            producer.shutdown()
            raise

    def kill_producer_after_local_transaction(self, producer: TransactionProducer) -> None:
        """The producer's next send runs its local transaction, then its process dies before
        the end event: the send raises :class:`ProducerKilled`, and the producer answers no
        check again. The coordinator back-checks another producer of the group."""
        self._member(producer).die_after_local_transaction = True

    def kill_producer(self, producer: TransactionProducer) -> None:
        """The producer's process dies: it sends nothing and answers no check again."""
        self._member(producer).alive = False
        producer.shutdown()

    def _member(self, producer: TransactionProducer) -> _Member:
        for member in self._groups.get(producer.producer_group, []):
            if member.producer is producer:
                return member
        raise TxStreamError("not a producer of this driver: make it with driver.producer()")

    # --- the coordinator's side ------------------------------------------------------------

    def crash_coordinator(self, mid_batch: bool = True) -> None:
        """Kill the coordinator and start it again on its checkpoint. ``mid_batch``: its next
        micro-batch dies after its sink wrote, before the batch committed (the replay must not
        release twice); else it dies now, between batches."""
        if mid_batch:
            self._crash_next = "written"
        else:
            self._spark.restart()
            self.coordinator_restarts += 1

    def new_checkpoint(self) -> None:
        """The coordinator starts over on a new checkpoint (the old one lost), on the same
        topics: it recovers what was decided from its history topic."""
        self._spark.fresh_checkpoint()
        self.coordinator_restarts += 1

    def _waited(self, ms: int) -> None:
        """A client's poll waited ``ms`` for the broker: the virtual clock moves on."""
        self.now += ms

    def advance(self, seconds: float = 0.0) -> None:
        """Run the coordinator's micro-batches and hand out back-checks until nothing is
        left to do now, then move the clock ``seconds`` on, a trigger interval at a time,
        doing the same at each."""
        target = self.now + int(seconds * 1000)
        while True:
            self._settle()
            if self.now >= target:
                return
            self.now = min(target, self.now + self.trigger_ms)

    def _settle(self) -> None:
        for _ in range(_MAX_BATCHES):
            ran = self._batch()
            answered = self._hand_out_checks()
            if not ran and not answered:
                return
        raise TxStreamError(f"the coordinator did not settle within {_MAX_BATCHES} "
                            "micro-batches at one instant")

    def _batch(self) -> bool:
        crash, self._crash_next = self._crash_next, None
        try:
            report = self._spark.step(crash)
        except SimCrash:
            self._spark.restart()
            self.coordinator_restarts += 1
            return True
        if report is None:
            self._crash_next = crash  # no batch ran: the crash waits for one
            return False
        return True

    def _hand_out_checks(self) -> bool:
        answered = False
        for group, members in self._groups.items():
            alive = [m for m in members if m.alive]
            topic = self.topics.check(group)
            for partition in range(self.broker.partition_count(topic) or 0):
                records = self._new(topic, partition)
                if records and alive:
                    member = alive[partition % len(alive)]
                    answered |= self._answer(member, records)
        return answered

    def _new(self, topic: str, partition: int) -> list[StoredRecord]:
        at = self._read.get((topic, partition), 0)
        new = [r for r in self._committed(topic, partition) if r.offset >= at]
        self._read[(topic, partition)] = self._end(topic, partition)
        return new

    def _answer(self, member: _Member, records: list[StoredRecord]) -> bool:
        fetched = []
        for rec in records:
            try:
                fetched.append(Fetched(decode_check(rec.key, rec.value, list(rec.headers)),
                                       rec.timestamp))
            except MalformedRecord:
                fetched.append(Fetched(None, rec.timestamp))
        choice = member.choice.choose(fetched, self.now)
        answered = False
        for (request, _), verdict in zip(fetched, choice.verdicts, strict=True):
            if verdict is Verdict.ANSWER and request is not None:
                member.producer.answer_check(request.message, request.check_times)
                answered = True
        return answered

    # --- what the world sees ---------------------------------------------------------------

    def _end(self, topic: str, partition: int) -> int:
        return self.broker.last_stable_offset(topic, partition, held=False)

    def _committed(self, topic: str, partition: int) -> Iterator[StoredRecord]:
        """What a read_committed reader is handed: no aborted record, none past the last
        stable offset."""
        stable = self._end(topic, partition)
        aborted = self.broker.transactions_of(topic, partition).aborted
        return (r for r in self.broker.records(topic, partition)
                if r.offset < stable and r.offset not in aborted)

    def _all(self, topic: str) -> list[Any]:
        return [r for p in range(self.broker.partition_count(topic) or 0)
                for r in self._committed(topic, p)]

    def visible(self, topic: str) -> list[Message]:
        """Every message a consumer of ``topic`` is handed now, by partition and offset."""
        out = []
        for partition in range(self.broker.partition_count(topic) or 0):
            for r in self._committed(topic, partition):
                rec = _Consumed(topic, partition, r.offset, r.key, r.value, list(r.headers))
                out.append(decode(rec, is_retry=False))  # type: ignore[arg-type]
        return out

    def discarded(self) -> list[Discarded]:
        """Every half message the coordinator discarded, with its reason."""
        out = []
        for r in self._all(self.topics.discard):
            h = header_dict(r.headers)
            msg = decode_half(r.key, r.value, r.headers)
            out.append(Discarded(msg.transaction_id or "", msg, h.get(H.DISCARD_REASON, ""),
                                 int(h.get(H.CHECK_TIMES, "0") or 0)))
        return out

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        for member in itertools.chain.from_iterable(self._groups.values()):
            member.producer.shutdown()
        unregister(self.broker.name)
        self._dir.cleanup()

    def __enter__(self) -> TransactionTestDriver:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


@dataclass
class _Consumed:
    """A record as a consumer gets it (the fields :func:`decode` reads)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
