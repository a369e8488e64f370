"""Consuming messages on the pool threads, like Java's ``ConsumeMessageConcurrentlyService``.

A batch is handed to the listener; consumed, its ids are remembered (duplicates dropped);
not consumed, each message goes to the group's retry topic with its delay, or after
``max_reconsume_times`` to the dead-letter topic. Only then is the batch finished in the
:class:`OffsetTracker`; a batch that could not be handed over pins its partition's commit
point, and the polling thread fetches it again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from txstream.client.dedup import DedupCache
from txstream.client.listener import ConsumeStatus, MessageListener
from txstream.client.offsets import OffsetTracker
from txstream.client.options import now_ms
from txstream.client.retry import RetryHeaders, dead_letter_record, retry_delay_s, retry_record
from txstream.errors import MalformedRecord, SendFailed
from txstream.kafka import ConsumerRecord, Producer, TopicPartition
from txstream.message import Message
from txstream.outputs import decode_visible
from txstream.wire import Record, header_dict

__all__ = ["ConsumeService", "decode", "Item"]

log = logging.getLogger(__name__)

Item = tuple[ConsumerRecord, Message]  # a record, and its decoded message


def decode(rec: ConsumerRecord, is_retry: bool) -> Message:
    """The message of a released record, or of a retry record (with its reconsume count)."""
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


class ConsumeService:
    """What the pool threads do with a batch, and the ids consumed or being consumed."""

    def __init__(self, *, group: str, listener: MessageListener, producer: Producer,
                 offsets: OffsetTracker, retry_topic: str, dlq_topic: str,
                 delays: Sequence[float], max_reconsume_times: int, dedup: DedupCache,
                 send_timeout_ms: int, stats: dict[str, int]) -> None:
        self.group = group
        self.retry_topic = retry_topic
        self.dlq_topic = dlq_topic
        self._listener = listener
        self._producer = producer
        self._offsets = offsets
        self._delays = delays
        self._max_reconsume = max_reconsume_times
        self._send_timeout_ms = send_timeout_ms
        self._lock = threading.Lock()  # guards the dedup cache, the ids in flight, the stats
        self._dedup = dedup
        self._inflight_ids: set[str] = set()
        self.stats = stats

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    def claim(self, msg_id: str | None) -> bool:
        """False for a duplicate: an id consumed, or being consumed, already. Otherwise the id
        is in flight until its batch is consumed or handed to the retry topic."""
        if msg_id is None:
            return True
        with self._lock:
            if msg_id in self._inflight_ids or msg_id in self._dedup:
                return False
            self._inflight_ids.add(msg_id)
            return True

    def release(self, msg_ids: Sequence[str | None]) -> None:
        with self._lock:
            self._inflight_ids.difference_update(m for m in msg_ids if m)

    def consume(self, tp: TopicPartition, epoch: int, items: list[Item]) -> None:
        """Run on a pool thread: the listener, then redelivery of what it did not consume."""
        msgs = [m for _, m in items]
        ids = [m.msg_id for m in msgs]
        try:
            status = self._listener(msgs)
        except Exception:
            log.exception("message listener of %s failed on %s; reconsume later",
                          self.group, ids)
            status = ConsumeStatus.RECONSUME_LATER
        if status == ConsumeStatus.CONSUME_SUCCESS:
            with self._lock:
                self._dedup.add(ids)
                self._inflight_ids.difference_update(m for m in ids if m)
                self.stats["consumed"] += len(msgs)
            for rec, _ in items:
                self._offsets.finish(tp, rec.offset, True, epoch)
            return
        if status != ConsumeStatus.RECONSUME_LATER:
            log.warning("message listener of %s returned %r; reconsume later", self.group,
                        status)
        # Before the retry record exists: it must not be taken for a duplicate of itself.
        self.release(ids)
        handed = True
        for rec, msg in items:
            if handed:
                try:
                    self._redeliver(rec, msg)
                except Exception as exc:  # SendFailed, or a bug: never skip the message
                    log.warning("cannot hand %s to the retry topic (%s); fetching it again",
                                msg.msg_id, exc)
                    handed = False
            self._offsets.finish(tp, rec.offset, handed, epoch)

    def _redeliver(self, rec: ConsumerRecord, msg: Message) -> None:
        attempt = msg.reconsume_times + 1
        if attempt > self._max_reconsume:
            reason = (f"not consumed after {attempt} deliveries "
                      f"(max_reconsume_times={self._max_reconsume})")
            self.dead_letter(rec, msg.topic, msg.reconsume_times, reason)
            with self._lock:
                self._dedup.add([msg.msg_id])
            return
        due = now_ms() + int(retry_delay_s(self._delays, attempt) * 1000)
        self._send(retry_record(self.retry_topic, rec.key, rec.value, rec.headers or (),
                                msg.topic, attempt, due))
        self.count("retried")

    def requeue(self, rec: ConsumerRecord) -> None:
        """Write a retry record again, as it is (when it is due, its attempt), at the end of
        its partition; raise SendFailed if not acknowledged."""
        headers = tuple((k, v or b"") for k, v in rec.headers or ())
        self._send(Record(self.retry_topic, rec.key, rec.value, headers), rec.partition)
        self.count("requeued")

    def dead_letter_malformed(self, tp: TopicPartition, rec: ConsumerRecord, exc: MalformedRecord
                              ) -> bool:
        """Take ``rec``, which cannot be decoded, to the dead-letter topic; False if it was not
        taken or not acknowledged (then its partition is rewound to it)."""
        if not self._offsets.take(tp, rec.offset):
            return False
        try:
            self.dead_letter(rec, rec.topic, 0, f"malformed record: {exc.reason}")
        except SendFailed:
            self._offsets.finish(tp, rec.offset, False)  # rewound, and dead-lettered again
            return False
        self._offsets.finish(tp, rec.offset, True)
        return True

    def dead_letter(self, rec: ConsumerRecord, origin: str, reconsume: int, reason: str
                    ) -> None:
        """Write ``rec`` to the dead-letter topic; raise SendFailed if not acknowledged."""
        log.warning("dead-lettering %s-%d@%d to %s: %s", rec.topic, rec.partition, rec.offset,
                    self.dlq_topic, reason)
        self._send(dead_letter_record(self.dlq_topic, rec.key, rec.value, rec.headers or (),
                                      origin, rec.partition, rec.offset, reconsume, reason))
        self.count("dead_lettered")

    def _send(self, record: Record, partition: int | None = None) -> None:
        try:
            self._producer.send(record.topic, key=record.key, value=record.value,
                                headers=list(record.headers), partition=partition).get(
                timeout=self._send_timeout_ms / 1000 + 1)
        except Exception as exc:
            raise SendFailed(f"{record.topic}: {type(exc).__name__}: {exc}") from exc
