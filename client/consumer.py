"""RocketMQ's ``DefaultMQPushConsumer`` (clustering mode) over Kafka.

At-least-once: a record's offset is committed only once its message was consumed, filtered
out, dropped as a duplicate, or durably handed to the retry or dead-letter topic. The listener
runs on one thread, in partition order; a failed message does not hold up its partition, it
comes back from the group's retry topic after its delay (:mod:`client.retry`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.structs import OffsetAndMetadata

from client.dedup import DedupCache
from client.listener import ConsumeStatus, MessageListener
from client.options import now_ms, producer_options, resolve_settings, timeout_ms
from client.retry import (
    DLQ_PREFIX,
    RETRY_PREFIX,
    ROCKETMQ_DELAYS_S,
    RetryHeaders,
    Subscription,
    dead_letter_record,
    retry_delay_s,
    retry_record,
)
from txstream.errors import ClientStateError, ConfigError, MalformedRecord, SendFailed
from txstream.kafka import KafkaSettings, make_consumer, make_producer
from txstream.message import Message
from txstream.topics import validate_group, validate_topic
from txstream.wire import Record, decode_visible, header_dict

__all__ = ["PushConsumer"]

log = logging.getLogger(__name__)

_Item = tuple[Any, Message]  # (ConsumerRecord, decoded message)


class _Redeliver(Exception):
    """A chunk could not be handed to the retry topic: fetch it again from ``offset``."""

    def __init__(self, offset: int) -> None:
        self.offset = offset


class PushConsumer(ConsumerRebalanceListener):
    """A push consumer of one consumer group (a Kafka consumer group of the same name).

    Options (keyword only): ``kafka`` or its pieces; ``topic_prefix`` (prefixes the retry and
    dead-letter topics); ``max_reconsume_times`` (16); ``retry_delay_s`` (one delay or one per
    attempt; default RocketMQ's 10 s .. 2 h); ``consume_batch_max_size`` (1);
    ``dedup_capacity`` / ``dedup_ttl_s`` (100000 ids / 1 h); ``send_timeout_s``;
    ``connect_timeout_s``; ``poll_timeout_s``. A new group starts at the earliest offset.
    """

    def __init__(
        self,
        consumer_group: str,
        bootstrap_servers: str | None = None,
        *,
        kafka: KafkaSettings | None = None,
        topic_prefix: str = "",
        max_reconsume_times: int = 16,
        retry_delay_s: float | Sequence[float] | None = None,
        consume_batch_max_size: int = 1,
        dedup_capacity: int = 100_000,
        dedup_ttl_s: float = 3600.0,
        send_timeout_s: float = 3.0,
        connect_timeout_s: float = 10.0,
        poll_timeout_s: float = 0.2,
        **kafka_options: Any,
    ) -> None:
        self.consumer_group = validate_group(consumer_group)
        self.settings = resolve_settings(bootstrap_servers, kafka, kafka_options)
        try:
            self.retry_topic = validate_topic(f"{topic_prefix}{RETRY_PREFIX}{consumer_group}")
            self.dlq_topic = validate_topic(f"{topic_prefix}{DLQ_PREFIX}{consumer_group}")
        except ConfigError as exc:
            raise ConfigError(f"group and topic prefix too long or invalid: {exc}") from None
        if max_reconsume_times < 0 or consume_batch_max_size < 1:
            raise ConfigError("max_reconsume_times must be >= 0, consume_batch_max_size >= 1")
        if retry_delay_s is None:
            delays: tuple[float, ...] = ROCKETMQ_DELAYS_S
        elif isinstance(retry_delay_s, (int, float)):
            delays = (float(retry_delay_s),)
        else:
            delays = tuple(float(d) for d in retry_delay_s)
        if not delays or any(d < 0 for d in delays):
            raise ConfigError("retry delays must be non-negative seconds")
        self.max_reconsume_times = max_reconsume_times
        self._delays = delays
        self._batch_max = consume_batch_max_size
        self._dedup = DedupCache(dedup_capacity, dedup_ttl_s)
        self._send_timeout_ms = timeout_ms(send_timeout_s, "send_timeout_s")
        self._connect_timeout_ms = timeout_ms(connect_timeout_s, "connect_timeout_s")
        self._poll_timeout_ms = timeout_ms(poll_timeout_s, "poll_timeout_s")
        self._subs: dict[str, Subscription] = {}
        self._listener: MessageListener | None = None
        self._paused: dict[TopicPartition, int] = {}  # retry partition -> due (epoch ms)
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._consumer: Any = None
        self._producer: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = False
        self.stats = {"consumed": 0, "retried": 0, "dead_lettered": 0, "duplicates": 0,
                      "filtered": 0}

    # --- configuration ------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive messages of ``topic`` whose tag matches ``expression`` (``*``: all)."""
        self._require_not_started("subscribe")
        validate_topic(topic)
        if topic in (self.retry_topic, self.dlq_topic):
            raise ConfigError(f"{topic} is this group's own retry or dead-letter topic")
        self._subs[topic] = Subscription(topic, expression or "*")

    def register_message_listener(self, listener: MessageListener) -> None:
        """``listener(messages)`` returns CONSUME_SUCCESS or RECONSUME_LATER."""
        self._require_not_started("register a listener")
        if not callable(listener):
            raise ConfigError("the message listener must be callable")
        self._listener = listener

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        return self._assignment

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PushConsumer:
        self._require_not_started("start")
        if not self._subs:
            raise ClientStateError("subscribe to a topic before start()")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        self._producer = make_producer(
            self.settings,
            **producer_options(self.settings, self._send_timeout_ms, self._connect_timeout_ms),
        )
        try:
            self._consumer = make_consumer(
                self.settings,
                group_id=self.consumer_group,
                bootstrap_timeout_ms=self._connect_timeout_ms,
                max_poll_records=max(100, self._batch_max),
            )
            self._consumer.subscribe([*self._subs, self.retry_topic], listener=self)
        except BaseException:
            self._producer.close(timeout=1)
            raise
        self._started = True
        self._thread = threading.Thread(
            target=self._run, name=f"txstream-consumer-{self.consumer_group}", daemon=True
        )
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Finish the messages being consumed, commit, leave the group. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._producer is not None:
            self._producer.close(timeout=self._send_timeout_ms / 1000)
            self._producer = None

    def __enter__(self) -> PushConsumer:
        return self if self._started else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def _require_not_started(self, what: str) -> None:
        if self._started or self._stop.is_set():
            raise ClientStateError(f"cannot {what}: consumer {self.consumer_group} was started")

    # --- rebalance callbacks (inside poll, on the consumer thread) -----------------------------

    def on_partitions_revoked(self, revoked: Any) -> None:
        # Nothing is in flight here: every polled record was handled and committed first.
        for tp in revoked:
            self._paused.pop(tp, None)
        self._assignment = frozenset(self._assignment - set(revoked))

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._assignment = frozenset(self._assignment | set(assigned))

    # --- the consumer thread ------------------------------------------------------------------

    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                try:
                    self._resume_due()
                    batch = consumer.poll(timeout_ms=self._poll_timeout_ms)
                except Exception:
                    log.exception("consumer %s poll failed; retrying", self.consumer_group)
                    self._stop.wait(1.0)
                    continue
                for tp, records in batch.items():
                    if self._stop.is_set():
                        break  # not committed: fetched again by whoever owns it next
                    self._handle(tp, records)
        finally:
            try:
                consumer.close()
            except Exception:
                log.warning("closing consumer %s failed", self.consumer_group, exc_info=True)

    def _resume_due(self) -> None:
        now = now_ms()
        for tp, due in list(self._paused.items()):
            if due <= now:
                del self._paused[tp]
                if tp in self._assignment:
                    self._consumer.resume(tp)

    def _handle(self, tp: TopicPartition, records: list[Any]) -> None:
        is_retry = tp.topic == self.retry_topic
        sub = self._subs.get(tp.topic)
        chunk: list[_Item] = []
        done: int | None = None  # the offset to commit: every record before it is handled
        try:
            for rec in records:
                if is_retry and self._not_due(tp, rec):
                    break
                try:
                    msg = self._decode(rec, is_retry)
                except MalformedRecord as exc:
                    self._consume(chunk)
                    chunk = []
                    try:
                        self._dead_letter(rec, rec.topic, 0, f"malformed record: {exc.reason}")
                    except SendFailed:
                        raise _Redeliver(rec.offset) from None
                    done = rec.offset + 1
                    continue
                if sub is not None and not is_retry and not sub.matches(msg.tags):
                    self.stats["filtered"] += 1
                elif msg.msg_id is not None and (
                    msg.msg_id in self._dedup or any(m.msg_id == msg.msg_id for _, m in chunk)
                ):
                    self.stats["duplicates"] += 1
                    log.debug("duplicate %s dropped", msg.msg_id)
                else:
                    chunk.append((rec, msg))
                    if len(chunk) >= self._batch_max:
                        self._consume(chunk)
                        chunk = []
                done = rec.offset + 1
            self._consume(chunk)
        except Exception as exc:
            if isinstance(exc, _Redeliver):
                offset = exc.offset
            else:  # a bug or a lost broker: never skip what was not handled
                log.exception("consumer %s failed on %s; fetching again", self.consumer_group,
                              tp)
                offset = chunk[0][0].offset if chunk else (
                    done if done is not None else records[0].offset)
            self._consumer.seek(tp, offset)
            done = offset
            time.sleep(0.2)  # do not spin on a failing write
        if done is not None:
            self._commit(tp, done)

    def _not_due(self, tp: TopicPartition, rec: Any) -> bool:
        try:
            due = int(header_dict(rec.headers).get(RetryHeaders.DUE_MS) or 0)
        except (MalformedRecord, ValueError):
            return False  # undecodable: handled (dead-lettered) as malformed below
        if due <= now_ms():
            return False
        # Fetch it again when due; later retry records are due no earlier, roughly.
        self._consumer.seek(tp, rec.offset)
        self._consumer.pause(tp)
        self._paused[tp] = due
        return True

    def _decode(self, rec: Any, is_retry: bool) -> Message:
        topic, reconsume = rec.topic, 0
        if is_retry:
            h = header_dict(rec.headers)
            topic = h.get(RetryHeaders.ORIGIN_TOPIC) or ""
            if not topic:
                raise MalformedRecord(f"retry record without {RetryHeaders.ORIGIN_TOPIC}")
            try:
                reconsume = int(h.get(RetryHeaders.RECONSUME_TIMES) or 0)
            except ValueError:
                raise MalformedRecord(f"bad {RetryHeaders.RECONSUME_TIMES}") from None
        msg = decode_visible(topic, rec.key, rec.value, rec.headers)
        for name in RetryHeaders.ALL:
            msg.properties.pop(name, None)
        msg.reconsume_times = reconsume
        msg.queue_id, msg.queue_offset = rec.partition, rec.offset
        return msg

    def _consume(self, chunk: list[_Item]) -> None:
        if not chunk:
            return
        msgs = [m for _, m in chunk]
        assert self._listener is not None
        try:
            status = self._listener(msgs)
        except Exception:
            log.exception("message listener of %s failed on %s; reconsume later",
                          self.consumer_group, [m.msg_id for m in msgs])
            status = ConsumeStatus.RECONSUME_LATER
        if status == ConsumeStatus.CONSUME_SUCCESS:
            self._dedup.add(m.msg_id for m in msgs)
            self.stats["consumed"] += len(msgs)
            return
        if status != ConsumeStatus.RECONSUME_LATER:
            log.warning("message listener of %s returned %r; reconsume later",
                        self.consumer_group, status)
        for rec, msg in chunk:
            try:
                self._redeliver(rec, msg)
            except SendFailed as exc:
                log.warning("cannot hand %s to the retry topic: %s", msg.msg_id, exc)
                raise _Redeliver(chunk[0][0].offset) from None

    def _redeliver(self, rec: Any, msg: Message) -> None:
        attempt = msg.reconsume_times + 1
        if attempt > self.max_reconsume_times:
            reason = (f"not consumed after {attempt} deliveries "
                      f"(max_reconsume_times={self.max_reconsume_times})")
            self._dead_letter(rec, msg.topic, msg.reconsume_times, reason)
            self._dedup.add([msg.msg_id])
            return
        due = now_ms() + int(retry_delay_s(self._delays, attempt) * 1000)
        self._send(retry_record(self.retry_topic, rec.key, rec.value, rec.headers or (),
                                msg.topic, attempt, due))
        self.stats["retried"] += 1

    def _dead_letter(self, rec: Any, origin: str, reconsume: int, reason: str) -> None:
        log.warning("dead-lettering %s-%d@%d to %s: %s", rec.topic, rec.partition, rec.offset,
                    self.dlq_topic, reason)
        self._send(dead_letter_record(self.dlq_topic, rec.key, rec.value, rec.headers or (),
                                      origin, rec.partition, rec.offset, reconsume, reason))
        self.stats["dead_lettered"] += 1

    def _send(self, record: Record) -> None:
        try:
            self._producer.send(record.topic, key=record.key, value=record.value,
                                headers=list(record.headers)).get(
                timeout=self._send_timeout_ms / 1000 + 1)
        except Exception as exc:
            raise SendFailed(f"{record.topic}: {type(exc).__name__}: {exc}") from exc

    def _commit(self, tp: TopicPartition, offset: int) -> None:
        try:
            self._consumer.commit({tp: OffsetAndMetadata(offset, "", -1)})
        except Exception as exc:  # a rebalance took the partition: its next owner redelivers
            log.info("offset commit %s@%d failed: %s", tp, offset, exc)
