"""RocketMQ's ``TransactionMQProducer`` over Kafka.

``send_message_in_transaction`` writes the half message and waits for the broker to store it,
runs the local transaction only then, and writes the end event, waiting for its
acknowledgement too (RocketMQ sends it one-way). While started, the producer answers the
coordinator's back-checks for its group (:mod:`txstream.client.checker`).

A half message whose acknowledgement did not come may have been stored all the same
(:class:`SendInDoubt`): a listener answers its back-check by transaction id, and finds none,
since its local transaction never ran.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from concurrent.futures import Executor
from dataclasses import dataclass
from enum import Enum
from types import TracebackType
from typing import Any

from txstream.client.checker import CheckResponder
from txstream.client.executor import BoundedExecutor
from txstream.client.listener import LocalTransactionState, TransactionListener, call_for_state
from txstream.client.options import (
    new_message_id,
    now_ms,
    producer_options,
    resolve_settings,
    resolve_topics,
    timeout_ms,
)
from txstream.client.renewal import ProducerRenewal
from txstream.client.send_errors import not_sent, producer_state_reset, send_failure
from txstream.client.validate import validate_message
from txstream.errors import ClientStateError, SendFailed, SendInDoubt
from txstream.kafka import KafkaSettings, RecordMetadata, make_producer
from txstream.kafka.provision import ensure_check_topic
from txstream.message import EndEvent, Message
from txstream.topics import Topics, validate_group
from txstream.wire import Record, encode_end, encode_half

__all__ = ["TransactionProducer", "TransactionSendResult", "SendStatus"]

log = logging.getLogger(__name__)

# A producer none of whose sends was acknowledged for this long (or three send timeouts, if
# longer) is replaced (txstream.client.renewal).
RENEW_AFTER_S = 10.0


class SendStatus(str, Enum):
    """RocketMQ's ``SendStatus``; a half message that was not acknowledged raises instead."""

    SEND_OK = "SEND_OK"


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """What ``send_message_in_transaction`` did. ``topic`` is the message's (real) topic;
    ``half_topic`` / ``half_partition`` / ``half_offset`` say where its half message was
    stored, as RocketMQ's result gives the half message's queue and queue offset
    (``queue_id`` and ``queue_offset`` here too).

    ``end_acknowledged`` is False when the end event could not be written: the outcome is then
    settled by a back-check, as in RocketMQ when its one-way end request is lost.
    """

    send_status: SendStatus
    msg_id: str
    transaction_id: str
    local_transaction_state: LocalTransactionState
    topic: str
    half_topic: str
    half_partition: int
    half_offset: int
    end_acknowledged: bool = True

    @property
    def queue_id(self) -> int:
        return self.half_partition

    @property
    def queue_offset(self) -> int:
        return self.half_offset

    def __str__(self) -> str:  # RocketMQ's SendResult.toString(), for the examples and CLI
        return (f"TransactionSendResult [sendStatus={self.send_status.value}, "
                f"msgId={self.msg_id}, topic={self.topic}, localTransactionState="
                f"{self.local_transaction_state.value}, messageQueue=MessageQueue "
                f"[topic={self.half_topic}, queueId={self.half_partition}], "
                f"queueOffset={self.half_offset}]")


class _State(Enum):
    CREATED = "created"
    RUNNING = "running"
    SHUT_DOWN = "shut down"


class TransactionProducer:
    """A transactional producer of one producer group.

    Options (keyword only):
      ``kafka`` (a :class:`KafkaSettings`) or its pieces (``security_protocol``,
      ``sasl_mechanism``, ``sasl_username``, ``sasl_password``, ``ssl_cafile``, ...), a
      properties file ``kafka_config`` and ``kafka_properties`` (any Kafka client property by
      Kafka's name; see :func:`txstream.client.options.resolve_settings` for which wins);
      ``topics`` (a :class:`Topics`) or ``topic_prefix``: the coordinator's system topics;
      ``send_timeout_s`` (3, RocketMQ's sendMsgTimeout): wait for each acknowledgement;
      ``connect_timeout_s`` (10): ``start()`` raises BrokerUnavailable after this;
      ``check_threads`` (2) / ``check_queue_size`` (2000): the default check executor;
      ``answer_checks`` (True): join the group's check consumers;
      ``check_grace_s`` (10): a check request this long past its ``CHECK_VALID_UNTIL`` on the
      coordinator's clock (the newest request timestamp read) is superseded and not answered;
      this producer's clock differing from the request timestamps by more is logged.
    """

    def __init__(
        self,
        producer_group: str,
        bootstrap_servers: str | None = None,
        listener: TransactionListener | None = None,
        executor: Executor | None = None,
        *,
        kafka: KafkaSettings | None = None,
        topics: Topics | None = None,
        topic_prefix: str | None = None,
        send_timeout_s: float = 3.0,
        connect_timeout_s: float = 10.0,
        check_threads: int = 2,
        check_queue_size: int = 2000,
        answer_checks: bool = True,
        check_grace_s: float = 10.0,
        **kafka_options: Any,
    ) -> None:
        self.producer_group = validate_group(producer_group)
        self.settings = resolve_settings(bootstrap_servers, kafka, kafka_options)
        self.topics = resolve_topics(topics, topic_prefix)
        self._send_timeout_ms = timeout_ms(send_timeout_s, "send_timeout_s")
        self._connect_timeout_ms = timeout_ms(connect_timeout_s, "connect_timeout_s")
        self._listener = listener
        self._executor = executor
        self._owns_executor = executor is None
        self._check_threads = check_threads
        self._check_queue_size = check_queue_size
        self._answer_checks = answer_checks
        self._check_grace_ms = timeout_ms(check_grace_s, "check_grace_s")
        self._state = _State.CREATED
        self._lock = threading.Lock()
        self._producer: ProducerRenewal | None = None
        self._checker: CheckResponder | None = None

    # --- configuration (RocketMQ's setters) --------------------------------------------------

    def set_transaction_listener(self, listener: TransactionListener) -> None:
        self._listener = listener

    def set_executor_service(self, executor: Executor) -> None:
        if self._state is not _State.CREATED:
            raise ClientStateError("set the executor before start()")
        self._executor, self._owns_executor = executor, False

    @property
    def check_topic(self) -> str:
        return self.topics.check(self.producer_group)

    @property
    def check_group_id(self) -> str:
        """The Kafka consumer group of this producer group's check consumers.

        Named after the check topic, so groups of two topic prefixes never mix.
        """
        return self.check_topic + ".checkers"

    @property
    def check_partitions(self) -> frozenset[int]:
        """The check-topic partitions this producer answers now (empty until it joined)."""
        checker = self._checker
        return frozenset(tp.partition for tp in checker.assignment) if checker else frozenset()

    @property
    def checks_answered(self) -> int:
        return self._checker.answered if self._checker else 0

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> TransactionProducer:
        with self._lock:
            if self._state is not _State.CREATED:
                raise ClientStateError(f"producer {self.producer_group} is {self._state.value}")
            if self._listener is None:
                raise ClientStateError("a transaction listener is required: set one before start()")
            renewal = ProducerRenewal(
                lambda: make_producer(
                    self.settings, role=f"producer-{self.producer_group}",
                    **producer_options(self.settings, self._send_timeout_ms,
                                       self._connect_timeout_ms)),
                after_s=max(RENEW_AFTER_S, 3 * self._send_timeout_ms / 1000))
            self._producer = renewal
            producer = renewal.producer
            try:
                # Before anyone subscribes; also when not answering: the coordinator writes
                # this group's back-checks there.
                ensure_check_topic(self.settings, self.topics, self.producer_group)
                if self._answer_checks:
                    if self._executor is None:
                        self._executor = BoundedExecutor(self._check_threads,
                                                         self._check_queue_size)
                    self._checker = CheckResponder(
                        topic=self.check_topic,
                        group_id=self.check_group_id,
                        role=f"checker-{self.producer_group}",
                        settings=self.settings,
                        answer=self.answer_check,
                        executor=self._executor,
                        connect_timeout_ms=self._connect_timeout_ms,
                        drain_timeout_s=max(30.0, 3 * self._send_timeout_ms / 1000),
                        grace_ms=self._check_grace_ms,
                    )
                    self._checker.start()
            except BaseException:
                self._checker = self._producer = None
                producer.close(timeout=1)
                raise
            self._state = _State.RUNNING
            return self

    def shutdown(self) -> None:
        """Stop taking checks, finish the answers in flight, flush and close. Idempotent."""
        with self._lock:
            if self._state is not _State.RUNNING:
                self._state = _State.SHUT_DOWN
                return
            self._state = _State.SHUT_DOWN
        if self._checker is not None:
            self._checker.stop()
        if self._owns_executor and self._executor is not None:
            self._executor.shutdown(wait=True)
        if self._producer is not None:
            self._producer.producer.close(timeout=self._send_timeout_ms / 1000)

    def __enter__(self) -> TransactionProducer:
        return self.start() if self._state is _State.CREATED else self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # --- sending ------------------------------------------------------------------------------

    def send_message_in_transaction(
        self, msg: Message, arg: object = None
    ) -> TransactionSendResult:
        """Send ``msg`` as a transactional message and run the local transaction.

        Raises InvalidMessage / ClientStateError before anything is sent; SendFailed when the
        half message was not stored (the broker refused it, or it was never sent), and
        SendInDoubt (a SendFailed) when it was sent but not acknowledged: it may have been
        stored, and is then back-checked. ``exc.transaction_id`` names it. The local
        transaction runs in neither case, so a check listener that looks the transaction id
        up in what the local transactions recorded finds nothing and answers ROLLBACK; one
        that answers by business key (``msg.keys``) would release a retried message twice.
        """
        if self._state is not _State.RUNNING:
            raise ClientStateError(f"producer {self.producer_group} is {self._state.value}: "
                                   "call start() first")
        listener = self._listener
        if listener is None:
            raise ClientStateError("no transaction listener set")
        validate_message(msg, self.topics)
        txid = new_message_id()
        half = dataclasses.replace(
            msg,
            body=bytes(msg.body),
            properties=dict(msg.properties),
            transaction_id=txid,
            msg_id=txid,
            producer_group=self.producer_group,
            born_timestamp=now_ms(),
        )
        meta = self._send(encode_half(half, self.topics), "half message", txid, msg_id=txid)
        state, remark = call_for_state(
            lambda: listener.execute_local_transaction(half, arg),
            "executeLocalTransaction", txid,
        )
        end = EndEvent(txid, self.producer_group, state, remark=remark, born_timestamp=now_ms())
        try:
            self._send(encode_end(end, self.topics), "end event", txid)
            end_ok = True
        except SendFailed as exc:
            # The local transaction has run: raising would suggest it had not. A back-check
            # settles the outcome instead.
            log.warning("local transaction %s ended %s, but the end event failed: %s",
                        txid, state.value, exc)
            end_ok = False
        return TransactionSendResult(
            send_status=SendStatus.SEND_OK,
            msg_id=txid,
            transaction_id=txid,
            local_transaction_state=state,
            topic=half.topic,
            half_topic=meta.topic,
            half_partition=meta.partition,
            half_offset=meta.offset,
            end_acknowledged=end_ok,
        )

    def answer_check(self, msg: Message, check_times: int) -> None:
        """Run the check listener and send its answer; raise if not acknowledged. The check
        consumer calls it for each request it takes; a driver that hands out the checks itself
        (``answer_checks=False``, :mod:`txstream.testing`) calls it instead.

        UNKNOW is answered too: only an answered check counts toward the coordinator's limit.
        """
        listener = self._listener
        txid = msg.transaction_id or ""
        remark: str | None
        if listener is None:
            state, remark = LocalTransactionState.UNKNOW, "no transaction listener set"
        else:
            state, remark = call_for_state(
                lambda: listener.check_local_transaction(msg), "checkLocalTransaction", txid
            )
        end = EndEvent(txid, self.producer_group, state, from_check=True,
                       check_times=check_times, remark=remark, born_timestamp=now_ms())
        self._send(encode_end(end, self.topics), f"answer to check {check_times}", txid)

    def _send(self, record: Record, what: str, txid: str, msg_id: str | None = None
              ) -> RecordMetadata:
        """Send ``record`` and wait for its acknowledgement: SendFailed if it was not stored,
        SendInDoubt if it may have been."""
        for attempt in (1, 2):
            assert self._producer is not None  # running: start() made it
            producer = self._producer.producer
            try:
                future = producer.send(
                    record.topic, key=record.key, value=record.value, headers=list(record.headers)
                )
            except Exception as exc:  # before it was handed to the I/O thread
                raise not_sent(exc, what, txid) from exc
            try:
                metadata = future.get(timeout=self._send_timeout_ms / 1000 + 1)
            except Exception as exc:
                if attempt == 1 and producer_state_reset(exc):
                    log.info("%s of %s met %s after a send in doubt: sending it again under "
                             "the producer's new epoch", what, txid, type(exc).__name__)
                    continue
                failure = send_failure(exc, what, self.settings.bootstrap_servers,
                                       self._send_timeout_ms / 1000, txid, msg_id)
                if isinstance(failure, SendInDoubt):
                    self._producer.unacknowledged(producer)
                raise failure from exc
            self._producer.acknowledged()
            return metadata
        raise AssertionError("unreachable: the second attempt returns or raises")
