"""Answering the coordinator's back-checks for one producer group.

Every producer of a group joins one Kafka consumer group on the group's check topic, so each
request reaches one of them. A request is answered on the check executor; its offset is
committed only once the answer (an end event with ``from_check``) was acknowledged by the
broker. A request whose answer failed, or that the full executor refused, is fetched again.

A request that is superseded is not answered (the rule: :mod:`txstream.client.check_choice`): one
past its ``CHECK_VALID_UNTIL`` by more than ``grace_ms`` on the coordinator's clock (the
newest request timestamp read), or one older than a request for the same transaction read
with it or before it. The producer's own clock decides nothing; one that differs from the
request timestamps by more than the grace is reported (a warning, at most once a minute).

All consumer calls happen on the one polling thread (kafka-python's consumer is not
thread-safe); executor threads only report back through the offset tracker. The poll loop,
its commits and the rebalance listener are the Kafka module's
(:class:`txstream.kafka.group.CommittingConsumer`); this is its member.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as wait_futures
from typing import Any

from txstream.client.check_choice import CheckChoice, Fetched, Verdict
from txstream.client.offsets import OffsetTracker
from txstream.errors import MalformedRecord
from txstream.kafka import Consumer, ConsumerRecord, KafkaSettings, TopicPartition, make_consumer
from txstream.kafka.group import CommittingConsumer
from txstream.message import Message
from txstream.outputs import CheckRequest, decode_check

__all__ = ["CheckResponder"]

log = logging.getLogger(__name__)

Answer = Callable[[Message, int], None]  # raises when the answer was not acknowledged

# How often a producer whose clock differs from the coordinator's says so.
_CLOCK_WARNING_INTERVAL_S = 60.0


def _clock_ms() -> int:
    """The producer's clock, as the rule is given it (looked up at each call: tests shift it)."""
    return int(time.time() * 1000)


class CheckResponder:
    """The check-answering loop of one producer (started and stopped by it)."""

    def __init__(
        self,
        *,
        topic: str,
        group_id: str,
        settings: KafkaSettings,
        role: str = "checker",
        answer: Answer,
        executor: Executor,
        connect_timeout_ms: int,
        drain_timeout_s: float,
        grace_ms: int = 10_000,
        poll_timeout_ms: int = 100,
        consumer_options: dict[str, Any] | None = None,
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self._role = role  # named in the consumer's client id
        self._settings = settings
        self._answer = answer
        self._executor = executor
        self._connect_timeout_ms = connect_timeout_ms
        self.drain_timeout_s = drain_timeout_s
        self._poll_timeout_ms = poll_timeout_ms
        self._consumer_options = consumer_options or {}
        self.offsets = OffsetTracker()
        self.choice = CheckChoice(grace_ms)
        self._clock_warned_at: float | None = None
        self._futures: set[Future[None]] = set()
        self._futures_lock = threading.Lock()
        self.assignment: frozenset[TopicPartition] = frozenset()
        self.joined = threading.Event()  # the group join completed once
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.consumer: Consumer | None = None
        self.answered = 0  # checks answered and acknowledged (for metrics and tests)
        self.skipped = 0  # superseded requests not answered

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        self.consumer = make_consumer(
            self._settings,
            role=self._role,
            group_id=self.group_id,
            bootstrap_timeout_ms=self._connect_timeout_ms,
            max_poll_records=200,
            **self._consumer_options,
        )
        group = CommittingConsumer(self.consumer, self.offsets, self,
                                   name=f"check consumer {self.group_id}",
                                   drain_s=self.drain_timeout_s)
        group.subscribe([self.topic])
        self._thread = threading.Thread(
            target=group.run, args=(self._stop,), name=f"txstream-check-{self.group_id}",
            daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop taking requests, finish the answers being given, commit, leave the group."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    # --- the polling thread -------------------------------------------------------------------

    def before_poll(self) -> int:
        self._rewind_failed()
        return self._poll_timeout_ms

    def owned(self) -> set[TopicPartition]:
        return set(self.assignment)

    def settle(self, tps: set[TopicPartition], timeout_s: float) -> None:
        # Let answers in flight finish so their offsets are committed while still ours (else
        # the next owner answers the same check again: harmless, but wasted).
        deadline = time.monotonic() + timeout_s
        while self.offsets.busy(tps) and time.monotonic() < deadline:
            time.sleep(0.01)

    def drop(self, tps: set[TopicPartition]) -> None:
        self.offsets.forget(tps)
        self.assignment = frozenset(self.assignment - tps)

    def assigned(self, tps: set[TopicPartition]) -> None:
        self.offsets.forget(tps)
        self.assignment = frozenset(self.assignment | tps)
        self.choice.reset()  # what is read again from the committed offsets is answered
        self.joined.set()
        log.info("check consumer %s assigned %s", self.group_id,
                 sorted(tp.partition for tp in tps))

    def leave(self) -> None:
        self._finish_joining()

    @property
    def _group_consumer(self) -> Consumer:
        """The Kafka consumer (made by :meth:`start`), on the polling thread."""
        assert self.consumer is not None
        return self.consumer

    def _finish_joining(self) -> None:
        """A member that leaves while its join is in flight can stay in the group for good on
        some brokers (tansu completes the join after the leave and never expires the member),
        and no other producer of the group is then assigned anything. So a producer stopped
        right after it started completes its join first, then leaves (bounded)."""
        if self.joined.is_set():
            return
        deadline = time.monotonic() + self._group_consumer.config["session_timeout_ms"] / 1000 + 5
        for tp in self._group_consumer.assignment():  # take nothing more: the next owner will
            self._group_consumer.pause(tp)
        while not self.joined.is_set() and time.monotonic() < deadline:
            try:
                self._group_consumer.poll(timeout_ms=100, max_records=1)
                self._group_consumer.pause(*self._group_consumer.assignment())
            except Exception as exc:
                log.info("check consumer %s: joining before leaving failed: %s",
                         self.group_id, exc)
                return

    def take(self, tp: TopicPartition, records: list[ConsumerRecord]) -> bool:
        """Submit ``records`` in order, skipping superseded ones; return True if the executor
        refused one."""
        fetched: list[Fetched] = []
        for rec in records:
            try:
                req: CheckRequest | None = decode_check(rec.key, rec.value, rec.headers)
            except MalformedRecord as exc:
                log.warning("skipping malformed check request %s-%d@%d: %s",
                            rec.topic, rec.partition, rec.offset, exc.reason)
                req = None
            fetched.append(Fetched(req, rec.timestamp))
        choice = self.choice.choose(fetched, _clock_ms())
        self._report_clock(choice.clock_difference_ms)
        for rec, (req, _), verdict in zip(records, fetched, choice.verdicts, strict=True):
            if verdict is not Verdict.ANSWER or req is None:
                if req is not None:
                    log.debug("skipping check %d of %s: %s", req.check_times,
                              req.message.transaction_id, verdict.value)
                    self.skipped += 1
                if not self.offsets.take(tp, rec.offset, inflight=False):
                    return False  # an earlier answer failed: rewind before going on
                continue
            if not self.offsets.take(tp, rec.offset):
                return False
            if not self._submit(tp, rec.offset, req):
                return True
        return False

    def _report_clock(self, difference_ms: int | None) -> None:
        grace_ms = self.choice.grace_ms
        if difference_ms is None or abs(difference_ms) <= grace_ms:
            return
        now = time.monotonic()
        if (self._clock_warned_at is not None
                and now - self._clock_warned_at < _CLOCK_WARNING_INTERVAL_S):
            return
        self._clock_warned_at = now
        if difference_ms > 0:
            log.warning("check consumer %s: this producer's clock is %.1fs ahead of the newest "
                        "check request's timestamp (the coordinator's clock), more than the "
                        "%.0fs grace, or the request waited that long unread; requests are "
                        "judged on the coordinator's clock", self.group_id,
                        difference_ms / 1000, grace_ms / 1000)
        else:
            log.warning("check consumer %s: this producer's clock is %.1fs behind the newest "
                        "check request's timestamp (the coordinator's clock), more than the "
                        "%.0fs grace; requests are judged on the coordinator's clock",
                        self.group_id, -difference_ms / 1000, grace_ms / 1000)

    def _submit(self, tp: TopicPartition, offset: int, req: CheckRequest) -> bool:
        epoch = self.offsets.epoch(tp)
        try:
            future = self._executor.submit(self._answer_one, tp, offset, epoch, req)
        except Exception as exc:  # full (RejectedExecution) or shut down
            log.info("check executor refused %s (%s); will fetch it again",
                     req.message.transaction_id, exc)
            self.offsets.finish(tp, offset, ok=True)
            self.offsets.rewind(tp, offset)
            self.choice.reset()  # it will be read again: do not take it for a repeat
            self._group_consumer.seek(tp, offset)
            return False
        with self._futures_lock:
            self._futures.add(future)
        future.add_done_callback(self._forget_future)
        return True

    def _forget_future(self, future: Future[None]) -> None:
        with self._futures_lock:
            self._futures.discard(future)

    def _answer_one(self, tp: TopicPartition, offset: int, epoch: int, req: CheckRequest
                    ) -> None:
        ok = False
        try:
            self._answer(req.message, req.check_times)
            ok = True
            with self._futures_lock:
                self.answered += 1
        except Exception as exc:
            log.warning("answer to check %d of %s not acknowledged (%s); will retry",
                        req.check_times, req.message.transaction_id, exc)
        finally:
            self.offsets.finish(tp, offset, ok, epoch)

    def _rewind_failed(self) -> None:
        failed = self.offsets.pop_failed()
        if failed:
            self.choice.reset()  # read again: answered again
        for tp, offset in failed.items():
            if tp in self.assignment:
                self._group_consumer.seek(tp, offset)
                self.offsets.rewind(tp, offset)

    def finish(self) -> None:
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
        wait_futures(waiting, timeout=self.drain_timeout_s)
