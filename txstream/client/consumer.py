"""RocketMQ's ``DefaultMQPushConsumer`` (clustering mode, concurrent listener) over Kafka.

One thread polls the Kafka consumer (kafka-python's consumer is not thread-safe) and hands
batches of up to ``consume_batch_max_size`` messages to a thread pool, as Java's
``ConsumeMessageConcurrentlyService`` does (:mod:`txstream.client.consume_service`).

At-least-once: a partition's offset is committed only up to its lowest message not yet
consumed, filtered out, dropped as a duplicate or durably handed to the retry or dead-letter
topic (:mod:`txstream.client.offsets`); a message consumed out of order never lets an earlier one's
offset be committed. A failed message does not hold up its partition: it comes back from the
group's retry topic after its delay (:mod:`txstream.client.retry`). A retry record read before it is
due is held until it is, while the records behind it are read on
(:mod:`txstream.client.retry_hold`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from txstream.client.consume_from import ConsumeFromWhere, StartPositions
from txstream.client.consume_partitions import Partitions, wait_jobs
from txstream.client.consume_pool import ConsumePool
from txstream.client.consume_service import ConsumeService, Item, decode
from txstream.client.dedup import DedupCache
from txstream.client.listener import MessageListener
from txstream.client.offsets import OffsetTracker
from txstream.client.options import (
    check_counts,
    now_ms,
    producer_options,
    resolve_settings,
    timeout_ms,
)
from txstream.client.retry import Subscription, due_ms, retry_delays
from txstream.errors import ClientStateError, ConfigError, MalformedRecord
from txstream.kafka import KafkaSettings, make_consumer, make_producer
from txstream.kafka.group import CommittingConsumer
from txstream.kafka.protocols import Consumer, ConsumerRecord, Producer, TopicPartition
from txstream.message import Message
from txstream.topics import DLQ_PREFIX, RETRY_PREFIX, validate_group, validate_topic
from txstream.wire import header_dict

__all__ = ["PushConsumer"]

log = logging.getLogger(__name__)


class PushConsumer:
    """A push consumer of one consumer group (a Kafka consumer group of the same name).

    Options (keyword only): ``kafka`` or its pieces, ``kafka_config`` (a properties file) and
    ``kafka_properties`` (Kafka's names), as for TransactionProducer; ``topic_prefix``
    (prefixes the retry and dead-letter topics); ``max_reconsume_times`` (16);
    ``retry_delay_s`` (one delay or one per attempt; default RocketMQ's 10 s .. 2 h);
    ``consume_thread_min`` / ``consume_thread_max`` (20 / 20): the listener's threads;
    ``consume_batch_max_size`` (1): messages per listener call;
    ``pull_threshold_for_queue`` (1000): a partition stops being fetched while this many of
    its messages are taken and not yet consumed (retry records held until due too);
    ``consume_concurrently_max_span`` (2000): ... or while its oldest message not yet
    consumed is this far behind the newest taken (a retry record held is requeued instead);
    ``consume_from_where`` (``CONSUME_FROM_LAST_OFFSET``) and ``consume_timestamp`` (epoch
    ms; default half an hour before start, as Java): where the group starts reading a
    partition it has no committed offset for (:mod:`txstream.client.consume_from`);
    ``drain_timeout_s`` (30): how long shutdown waits for the listener calls running;
    ``dedup_capacity`` / ``dedup_ttl_s`` (100000 ids / 1 h); ``send_timeout_s``;
    ``connect_timeout_s``; ``poll_timeout_s``.

    Messages of one partition are consumed concurrently, not in order, as with Java's
    ``MessageListenerConcurrently``; ``consume_thread_min=consume_thread_max=1`` consumes them
    one at a time in partition order. A rebalance waits (a few seconds at most) for the
    messages of revoked partitions being consumed, commits, and leaves the rest, not started,
    to the partitions' next owner; so does shutdown, for ``drain_timeout_s``.

    RocketMQ's ``%RETRY%<group>`` and ``%DLQ%<group>`` are ``TXSTREAM_RETRY_<group>`` and
    ``TXSTREAM_DLQ_<group>`` here (Kafka topic names cannot hold ``%``), after the
    ``topic_prefix``: ``retry_topic`` and ``dlq_topic``.
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
        consume_thread_min: int = 20,
        consume_thread_max: int = 20,
        consume_batch_max_size: int = 1,
        pull_threshold_for_queue: int = 1000,
        consume_concurrently_max_span: int = 2000,
        consume_from_where: ConsumeFromWhere | str = ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
        consume_timestamp: int | None = None,
        drain_timeout_s: float = 30.0,
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
        check_counts(max_reconsume_times=(max_reconsume_times, 0),
                     consume_thread_min=(consume_thread_min, 1),
                     consume_batch_max_size=(consume_batch_max_size, 1),
                     pull_threshold_for_queue=(pull_threshold_for_queue, 1),
                     consume_concurrently_max_span=(consume_concurrently_max_span, 1))
        check_counts(consume_thread_max=(consume_thread_max, consume_thread_min))
        self.max_reconsume_times = max_reconsume_times
        self._delays = retry_delays(retry_delay_s)
        self.consume_thread_min, self.consume_thread_max = consume_thread_min, consume_thread_max
        self._batch_max = consume_batch_max_size
        self.consume_from_where = ConsumeFromWhere.of(consume_from_where)
        self.consume_timestamp = consume_timestamp
        self._drain_s = timeout_ms(drain_timeout_s, "drain_timeout_s") / 1000
        self._dedup = DedupCache(dedup_capacity, dedup_ttl_s)
        self._send_timeout_ms = timeout_ms(send_timeout_s, "send_timeout_s")
        self._connect_timeout_ms = timeout_ms(connect_timeout_s, "connect_timeout_s")
        self._poll_timeout_ms = timeout_ms(poll_timeout_s, "poll_timeout_s")
        self._subs: dict[str, Subscription] = {}
        self._listener: MessageListener | None = None
        self._offsets = OffsetTracker()
        self._parts = Partitions(self._offsets, pull_threshold_for_queue,
                                 consume_concurrently_max_span)
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._pool: ConsumePool | None = None
        self._service: ConsumeService | None = None
        self._starts: StartPositions | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started = False
        self.stats = {"consumed": 0, "retried": 0, "dead_lettered": 0, "duplicates": 0,
                      "filtered": 0, "requeued": 0}

    # --- configuration ------------------------------------------------------------------------

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive messages of ``topic`` whose tag matches ``expression`` (``*``: all)."""
        self._require_not_started("subscribe")
        validate_topic(topic)
        if topic in (self.retry_topic, self.dlq_topic):
            raise ConfigError(f"{topic} is this group's own retry or dead-letter topic")
        self._subs[topic] = Subscription(topic, expression or "*")

    def register_message_listener(self, listener: MessageListener) -> None:
        """``listener(messages)`` returns CONSUME_SUCCESS or RECONSUME_LATER. It is called
        from several threads at once (``consume_thread_max``)."""
        self._require_not_started("register a listener")
        if not callable(listener):
            raise ConfigError("the message listener must be callable")
        self._listener = listener

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this consumer reads (assigned, and where to start found)."""
        return self._parts.reading

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> PushConsumer:
        self._require_not_started("start")
        if not self._subs:
            raise ClientStateError("subscribe to a topic before start()")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        role = f"consumer-{self.consumer_group}"
        self._producer = make_producer(self.settings, role=role, **producer_options(
            self.settings, self._send_timeout_ms, self._connect_timeout_ms))
        try:
            self._consumer = make_consumer(
                self.settings, role=role, group_id=self.consumer_group,
                bootstrap_timeout_ms=self._connect_timeout_ms,
                max_poll_records=max(100, self._batch_max),
            )
            self._service = ConsumeService(
                group=self.consumer_group, listener=self._listener, producer=self._producer,
                offsets=self._offsets, retry_topic=self.retry_topic, dlq_topic=self.dlq_topic,
                delays=self._delays, max_reconsume_times=self.max_reconsume_times,
                dedup=self._dedup, send_timeout_ms=self._send_timeout_ms, stats=self.stats)
            group = CommittingConsumer(self._consumer, self._offsets, self,
                                       name=f"consumer {self.consumer_group}",
                                       drain_s=self._drain_s)
            topics = [*self._subs, self.retry_topic]
            for topic in topics:
                # A producer's metadata request names the topic: a broker that creates topics
                # on first use creates it now, before the group assigns its partitions.
                try:
                    self._producer.partitions_for(topic)
                except Exception as exc:  # not created (auto-creation off): joined later
                    log.info("consumer %s: topic %s not known yet (%s)", self.consumer_group,
                             topic, exc)
            group.subscribe(topics)
        except BaseException:
            self._producer.close(timeout=1)
            raise
        timestamp = self.consume_timestamp
        self._starts = StartPositions(
            self.settings, self.consume_from_where,
            now_ms() - 30 * 60 * 1000 if timestamp is None else timestamp,
            role=f"{role}-start", timeout_s=self._connect_timeout_ms / 1000)
        self._pool = ConsumePool(self.consume_thread_min, self.consume_thread_max,
                                 f"ConsumeMessageThread_{self.consumer_group}").start()
        self._started = True
        self._thread = threading.Thread(
            target=group.run, args=(self._stop,),
            name=f"txstream-consumer-{self.consumer_group}", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop fetching, wait for the listener calls running (``drain_timeout_s``), commit,
        leave the group. Messages fetched but not started go to the group's next owner of
        their partition. Idempotent."""
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

    # --- the polling thread -------------------------------------------------------------------

    def before_poll(self) -> int:
        assert self._service is not None
        self._rewind_failed()
        self._position_new()
        self._parts.requeue_past_span(self._service.requeue)
        self._release_due()
        self._apply_pauses()
        return self._parts.held.wait_ms(self._poll_timeout_ms, now_ms())  # until the next due

    @property
    def _group_consumer(self) -> Consumer:
        """The Kafka consumer (made by :meth:`start`), on the polling thread."""
        assert self._consumer is not None
        return self._consumer

    def take(self, tp: TopicPartition, records: list[ConsumerRecord]) -> bool:
        if tp in self._parts.reading:
            self._dispatch(tp, records)
        return False

    def owned(self) -> set[TopicPartition]:
        return set(self._parts.reading)

    def settle(self, tps: set[TopicPartition], timeout_s: float) -> None:
        self._parts.settle(tps, timeout_s)

    def drop(self, tps: set[TopicPartition]) -> None:
        assert self._service is not None
        self._service.release(self._parts.unfinished_ids(tps))
        self._parts.forget(tps)

    def assigned(self, tps: set[TopicPartition]) -> None:
        if tps:
            self._group_consumer.pause(*tps)  # not fetched until _position_new found their starts
            self._parts.assigned(tps)

    def finish(self) -> None:
        assert self._pool is not None
        self._pool.shutdown()  # not started: left uncommitted, for the group's next owner
        wait_jobs(self._parts.jobs_of(), self._drain_s)

    def leave(self) -> None:
        assert self._starts is not None
        self._starts.close()

    def _dispatch(self, tp: TopicPartition, records: list[ConsumerRecord]) -> None:
        is_retry = tp.topic == self.retry_topic
        sub = None if is_retry else self._subs.get(tp.topic)
        epoch = self._offsets.epoch(tp)
        chunk: list[Item] = []
        try:
            for rec in records:
                if self._parts.full(tp, rec.offset):
                    self._group_consumer.seek(tp, rec.offset)  # fetched again when it may be taken
                    break
                if not self._take(tp, rec, is_retry, sub, chunk):
                    break  # a failed message waits to be fetched again first
                if len(chunk) >= self._batch_max:
                    self._submit(tp, epoch, chunk)
                    chunk = []
        except Exception:  # a bug or a lost broker: never skip what was not taken
            log.exception("consumer %s failed on %s; fetching again", self.consumer_group, tp)
            nxt = self._offsets.pending(tp)[2]
            self._group_consumer.seek(tp, records[0].offset if nxt is None else nxt)
        finally:
            self._submit(tp, epoch, chunk)

    def _take(self, tp: TopicPartition, rec: ConsumerRecord, is_retry: bool,
              sub: Subscription | None,
              chunk: list[Item]) -> bool:
        """Take ``rec``: into ``chunk`` to be consumed, held until due, or handled here; False
        if refused."""
        assert self._service is not None
        try:
            msg = decode(rec, is_retry)
        except MalformedRecord as exc:
            return self._service.dead_letter_malformed(tp, rec, exc)
        if sub is not None and not sub.matches(msg.tags):
            self._service.count("filtered")
            return self._offsets.take(tp, rec.offset, inflight=False)
        due = due_ms(header_dict(rec.headers)) if is_retry else 0
        if due > now_ms():
            if not self._offsets.take(tp, rec.offset):
                return False
            self._parts.held.hold(tp, due, rec, msg)  # in flight: not committed past
            return True
        return self._claim(tp, rec, msg, chunk, taken=False)

    def _claim(self, tp: TopicPartition, rec: ConsumerRecord, msg: Message, chunk: list[Item], *,
               taken: bool) -> bool:
        """Into ``chunk``, or dropped as a duplicate. ``taken``: the record is in flight
        already (a retry record held until due)."""
        assert self._service is not None
        if not self._service.claim(msg.msg_id):
            self._service.count("duplicates")
            log.debug("duplicate %s dropped", msg.msg_id)
            if taken:
                self._offsets.finish(tp, rec.offset, True)
                return True
            return self._offsets.take(tp, rec.offset, inflight=False)
        if not taken and not self._offsets.take(tp, rec.offset):
            self._service.release([msg.msg_id])
            return False
        chunk.append((rec, msg))
        return True

    def _submit(self, tp: TopicPartition, epoch: int, chunk: list[Item]) -> None:
        if not chunk:
            return
        assert self._pool is not None and self._service is not None
        service = self._service
        self._pool.submit(self._parts.job(tp, lambda: service.consume(tp, epoch, chunk),
                                          [m.msg_id for _, m in chunk]))

    def _release_due(self) -> None:
        """Consume the held retry records that are due."""
        for tp, items in self._parts.held.pop_due(now_ms()).items():
            epoch = self._offsets.epoch(tp)
            chunk: list[Item] = []
            for rec, msg in items:
                self._claim(tp, rec, msg, chunk, taken=True)
                if len(chunk) >= self._batch_max:
                    self._submit(tp, epoch, chunk)
                    chunk = []
            self._submit(tp, epoch, chunk)

    def _apply_pauses(self) -> None:
        want = self._parts.to_pause()
        paused = set(self._group_consumer.paused())
        if want - paused:
            self._group_consumer.pause(*(want - paused))
        if paused - want:
            self._group_consumer.resume(*(paused - want))

    def _position_new(self) -> None:
        new = self._parts.unpositioned
        if not new:
            return
        assert self._starts is not None
        try:
            starts = self._starts.starts(self._group_consumer, new, self.retry_topic)
        except Exception as exc:
            log.warning("consumer %s cannot find where to start %s (%s); trying again",
                        self.consumer_group, sorted(new), exc)
            return
        for tp, offset in starts.committed.items():
            self._group_consumer.seek(tp, offset)
            self._offsets.rewind(tp, offset)
            self._offsets.committed({tp: offset})
        for tp, offset in starts.chosen.items():
            self._group_consumer.seek(tp, offset)
            self._offsets.rewind(tp, offset)  # committed: a restart resumes there too
        if starts.beginning:
            self._group_consumer.seek_to_beginning(*starts.beginning)
        self._parts.positioned(new)
        log.info("consumer %s reads %s (%d started at %s)", self.consumer_group, sorted(new),
                 len(starts.chosen), self.consume_from_where.name)

    def _rewind_failed(self) -> None:
        for tp, offset in self._offsets.pop_failed().items():
            if tp in self._parts.reading:
                self._group_consumer.seek(tp, offset)
                self._offsets.rewind(tp, offset)
                for later in self._parts.held.drop_from(tp, offset):  # read and held again
                    self._offsets.finish(tp, later, True)
