"""Answering the coordinator's back-checks for one producer group.

Every producer of a group joins one Kafka consumer group on the group's check topic, so each
request reaches one of them. A request is answered on the check executor; its offset is
committed only once the answer (an end event with ``from_check``) was acknowledged by the
broker. A request whose answer failed, or that the full executor refused, is fetched again.

All consumer calls happen on the one polling thread (kafka-python's consumer is not
thread-safe); executor threads only report back through :class:`_Offsets`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from typing import Any

from kafka import ConsumerRebalanceListener, TopicPartition
from kafka.structs import OffsetAndMetadata

from txstream.errors import MalformedRecord
from txstream.kafka import KafkaSettings, make_consumer
from txstream.message import Message
from txstream.wire import decode_check

__all__ = ["CheckResponder"]

log = logging.getLogger(__name__)

Answer = Callable[[Message, int], None]  # raises when the answer was not acknowledged


class _Offsets:
    """Per partition: what may be committed. Thread-safe.

    The commit point is the lowest offset still being answered, or past the last record taken
    when none is. A failed answer pins the commit point at its offset until the polling thread
    rewinds the partition to it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inflight: dict[TopicPartition, set[int]] = {}
        self._next: dict[TopicPartition, int] = {}
        self._failed: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}

    def take(self, tp: TopicPartition, offset: int, inflight: bool = True) -> bool:
        with self._lock:
            if tp in self._failed:
                return False  # rewind first, or later offsets would be committed past it
            if inflight:
                self._inflight.setdefault(tp, set()).add(offset)
            self._next[tp] = offset + 1
            return True

    def finish(self, tp: TopicPartition, offset: int, ok: bool) -> None:
        with self._lock:
            self._inflight.get(tp, set()).discard(offset)
            if not ok:
                self._failed[tp] = min(offset, self._failed.get(tp, offset))
                self._next[tp] = min(self._next.get(tp, offset), offset)

    def rewind(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            self._next[tp] = offset

    def pop_failed(self) -> dict[TopicPartition, int]:
        with self._lock:
            failed, self._failed = self._failed, {}
            return failed

    def busy(self, tps: set[TopicPartition]) -> bool:
        with self._lock:
            return any(self._inflight.get(tp) for tp in tps)

    def to_commit(self, tps: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        with self._lock:
            out = {}
            for tp, nxt in self._next.items():
                if tps is not None and tp not in tps:
                    continue
                point = min([nxt, *self._inflight.get(tp, ())])
                if self._committed.get(tp) != point:
                    out[tp] = point
            return out

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        with self._lock:
            self._committed.update(offsets)

    def forget(self, tps: set[TopicPartition]) -> None:
        with self._lock:
            for d in (self._inflight, self._next, self._failed, self._committed):
                for tp in tps:
                    d.pop(tp, None)


class CheckResponder(ConsumerRebalanceListener):
    """The check-answering loop of one producer (started and stopped by it)."""

    def __init__(
        self,
        *,
        topic: str,
        group_id: str,
        settings: KafkaSettings,
        answer: Answer,
        executor: Executor,
        connect_timeout_ms: int,
        drain_timeout_s: float,
        poll_timeout_ms: int = 100,
        consumer_options: dict[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self._settings = settings
        self._answer = answer
        self._executor = executor
        self._connect_timeout_ms = connect_timeout_ms
        self._drain_timeout_s = drain_timeout_s
        self._poll_timeout_ms = poll_timeout_ms
        self._consumer_options = consumer_options or {}
        self._offsets = _Offsets()
        self._futures: set[Future[None]] = set()
        self._futures_lock = threading.Lock()
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Any = None
        self.answered = 0  # checks answered and acknowledged (for metrics and tests)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self._consumer = make_consumer(
            self._settings,
            group_id=self.group_id,
            bootstrap_timeout_ms=self._connect_timeout_ms,
            max_poll_records=200,
            **self._consumer_options,
        )
        self._consumer.subscribe([self.topic], listener=self)
        self._thread = threading.Thread(
            target=self._run, name=f"txstream-check-{self.group_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop taking requests, finish the answers being given, commit, leave the group."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def assignment(self) -> frozenset[TopicPartition]:
        return self._assignment

    # --- rebalance callbacks (called inside poll, on the polling thread) ----------------------

    def on_partitions_revoked(self, revoked: Any) -> None:
        tps = set(revoked)
        # Let answers in flight finish so their offsets are committed while still ours;
        # otherwise the next owner answers the same check again (harmless, but wasted).
        deadline = time.monotonic() + self._drain_timeout_s
        while self._offsets.busy(tps) and time.monotonic() < deadline:
            time.sleep(0.01)
        self._commit(tps)
        self._offsets.forget(tps)
        self._assignment = frozenset(self._assignment - tps)

    def on_partitions_assigned(self, assigned: Any) -> None:
        self._offsets.forget(set(assigned))
        self._assignment = frozenset(self._assignment | set(assigned))
        log.info("check consumer %s assigned %s", self.group_id, sorted(tp.partition
                                                                      for tp in assigned))

    # --- the polling thread -------------------------------------------------------------------

    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                try:
                    self._rewind_failed()
                    self._commit()
                    batch = consumer.poll(timeout_ms=self._poll_timeout_ms)
                    refused = False
                    for tp, records in batch.items():
                        refused |= self._take(tp, records)
                    if refused:
                        time.sleep(0.05)  # the executor is full: give it time to refetch
                except Exception:
                    # Keep answering: a producer that silently stopped would leave its
                    # transactions to be discarded. What was not taken is fetched again.
                    log.exception("check consumer of %s failed; retrying", self.group_id)
                    self._stop.wait(1.0)
        finally:
            self._drain()
            try:
                consumer.close()
            except Exception:
                log.warning("closing the check consumer of %s failed", self.group_id,
                            exc_info=True)

    def _take(self, tp: TopicPartition, records: list[Any]) -> bool:
        """Submit ``records`` in order; return True if the executor refused one."""
        for rec in records:
            try:
                msg, check_times = decode_check(rec.key, rec.value, rec.headers)
            except MalformedRecord as exc:
                log.warning("skipping malformed check request %s-%d@%d: %s",
                            rec.topic, rec.partition, rec.offset, exc.reason)
                if not self._offsets.take(tp, rec.offset, inflight=False):
                    return False
                continue
            if not self._offsets.take(tp, rec.offset):
                return False  # an earlier answer failed: rewind before going on
            try:
                future = self._executor.submit(self._answer_one, tp, rec.offset, msg, check_times)
            except Exception as exc:  # full (RejectedExecution) or shut down
                log.info("check executor refused %s (%s); will fetch it again",
                         msg.transaction_id, exc)
                self._offsets.finish(tp, rec.offset, ok=True)
                self._offsets.rewind(tp, rec.offset)
                self._consumer.seek(tp, rec.offset)
                return True
            with self._futures_lock:
                self._futures.add(future)
            future.add_done_callback(self._forget_future)
        return False

    def _forget_future(self, future: Future[None]) -> None:
        with self._futures_lock:
            self._futures.discard(future)

    def _answer_one(self, tp: TopicPartition, offset: int, msg: Message, check_times: int) -> None:
        ok = False
        try:
            self._answer(msg, check_times)
            ok = True
            with self._futures_lock:
                self.answered += 1
        except Exception as exc:
            log.warning("answer to check %d of %s not acknowledged (%s); will retry",
                        check_times, msg.transaction_id, exc)
        finally:
            self._offsets.finish(tp, offset, ok)

    def _rewind_failed(self) -> None:
        for tp, offset in self._offsets.pop_failed().items():
            if tp in self._assignment:
                self._consumer.seek(tp, offset)
                self._offsets.rewind(tp, offset)

    def _commit(self, tps: set[TopicPartition] | None = None) -> None:
        offsets = self._offsets.to_commit(tps)
        if not offsets:
            return
        try:
            self._consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})
            self._offsets.committed(offsets)
        except Exception as exc:  # a rebalance in progress: the next owner answers again
            log.info("check offset commit for %s failed: %s", self.group_id, exc)

    def _drain(self) -> None:
        with self._futures_lock:
            futures = list(self._futures)
        waiting = []
        for future in futures:
            # Not started: leave it uncommitted for another producer of the group.
            if not future.cancel():
                waiting.append(future)
        cancelled = [f for f in futures if f.cancelled()]
        if cancelled:
            log.info("shutdown: %d queued check(s) left to other producers", len(cancelled))
        wait_futures(waiting, timeout=self._drain_timeout_s)
        self._commit()
