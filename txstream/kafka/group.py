"""A consumer group member that commits what its caller finished: the poll loop and the
rebalance listener of the producer's check responder and of the push consumer.

The caller (a :class:`Member`) takes the records and says which partitions are its own; the
offsets to commit come from its tracker (:class:`Offsets`, ``txstream.client.offsets``). The
loop commits them before each poll, when partitions are revoked (after their work settled,
bounded) and when it stops. Partitions *lost* (the member was evicted, so another member owns
them already) are forgotten without a commit: what it would commit could overwrite the new
owner's progress.

kafka-python runs the rebalance callbacks on its IO thread while the polling thread waits in
``poll``; the listener is async, so that a commit can be awaited there (kafka-python refuses
its blocking calls on that thread). That thread also heartbeats: waiting for a revoked
partition's work stays well inside the session timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Protocol

from kafka import AsyncConsumerRebalanceListener

from txstream.kafka.protocols import (
    Consumer,
    ConsumerRecord,
    OffsetAndMetadata,
    TopicPartition,
)

__all__ = ["Member", "Offsets", "CommittingConsumer", "CommitOnRevoke", "commit_map"]

log = logging.getLogger(__name__)

KNOWN_WITHIN_S = 5.0  # how long a new member waits for its topics' partitions before joining


class Offsets(Protocol):
    """What may be committed, and what was."""

    def to_commit(self, tps: set[TopicPartition]) -> dict[TopicPartition, int]: ...

    def committed(self, offsets: dict[TopicPartition, int]) -> None: ...


class Member(Protocol):
    """The caller's side of a :class:`CommittingConsumer`."""

    def before_poll(self) -> int:
        """On the polling thread, before each poll (rewinds, positions, pauses): returns how
        long the poll may wait, in ms."""

    def take(self, tp: TopicPartition, records: list[ConsumerRecord]) -> bool:
        """Records fetched for ``tp``; True asks for a moment's pause (work refused)."""

    def owned(self) -> set[TopicPartition]:
        """The partitions whose offsets are this member's to commit now."""

    def settle(self, tps: set[TopicPartition], timeout_s: float) -> None:
        """``tps`` are revoked or lost: stop or finish their work, within ``timeout_s``."""

    def drop(self, tps: set[TopicPartition]) -> None:
        """``tps`` are no longer this member's (committed, if they were revoked)."""

    def assigned(self, tps: set[TopicPartition]) -> None:
        """``tps`` (maybe none: a join completed) are assigned."""

    def finish(self) -> None:
        """Stopping: stop or finish all work (bounded), before the last commit."""

    def leave(self) -> None:
        """Stopping: after the last commit, before the consumer closes."""


def commit_map(offsets: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndMetadata]:
    return {tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()}


class CommitOnRevoke(AsyncConsumerRebalanceListener):  # type: ignore[misc]  # untyped base
    """Revoked: the work settles (bounded), what may be committed is, then the partitions are
    dropped. Lost: dropped at once, nothing committed."""

    def __init__(self, group: CommittingConsumer) -> None:
        self._group = group

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        g, tps = self._group, set(revoked)
        if not tps:
            return
        session_s = g.consumer.config["session_timeout_ms"] / 1000
        g.member.settle(tps, min(g.drain_s, session_s / 2))
        offsets = g.offsets.to_commit(tps & g.member.owned())
        if offsets:
            try:
                await g.consumer.commit_async(commit_map(offsets))
                g.offsets.committed(offsets)
            except Exception as exc:  # the next owner takes those again
                log.info("offset commit of %s on revocation failed: %s", g.name, exc)
        g.member.drop(tps)

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._group.member.assigned(set(assigned))

    async def on_partitions_lost(self, lost: Iterable[TopicPartition]) -> None:
        tps = set(lost)
        if tps:
            self._group.member.settle(tps, 0.0)
            self._group.member.drop(tps)


class CommittingConsumer:
    """Runs ``consumer`` (a group member) for ``member``: :meth:`run` is the polling thread's
    body; it closes the consumer when ``stop`` is set. ``name`` names it in the log."""

    def __init__(self, consumer: Consumer, offsets: Offsets, member: Member, *, name: str,
                 drain_s: float) -> None:
        self.consumer, self.offsets, self.member = consumer, offsets, member
        self.name, self.drain_s = name, drain_s

    def subscribe(self, topics: Iterable[str], known_within_s: float = KNOWN_WITHIN_S) -> None:
        """Subscribe, and wait (up to ``known_within_s``) until the consumer's metadata lists
        each topic's partitions, before the first poll joins the group. kafka-python's leader
        assigns from the metadata it holds; a topic the broker created on the subscription's
        own metadata request could be assigned no partition, with a snapshot taken after the
        partitions came in, and then the group never rejoined (half of the joins on a new
        topic of Apache Kafka). A topic still unknown then (no auto-creation) is joined when
        it appears."""
        names = list(topics)
        self.consumer.subscribe(names, listener=CommitOnRevoke(self))
        deadline = time.monotonic() + known_within_s
        for topic in names:
            while not self.consumer.partitions_for_topic(topic):
                if time.monotonic() > deadline:
                    log.info("%s: topic %s has no partitions yet; joining without them",
                             self.name, topic)
                    return
                time.sleep(0.1)

    def commit(self) -> None:
        """Commit what may be, of the member's partitions (on the polling thread)."""
        offsets = self.offsets.to_commit(self.member.owned())
        if not offsets:
            return
        try:
            self.consumer.commit(commit_map(offsets))
            self.offsets.committed(offsets)
        except Exception as exc:  # a rebalance in progress: the next owner takes them again
            log.info("offset commit of %s failed: %s", self.name, exc)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    timeout_ms = self.member.before_poll()
                    self.commit()
                    batch = self.consumer.poll(timeout_ms=timeout_ms)
                    refused = False
                    for tp, records in batch.items():
                        if stop.is_set():
                            break
                        refused |= self.member.take(tp, records)
                    if refused:
                        stop.wait(0.05)  # give the work refused time to be taken again
                except Exception:
                    # Keep going: a member that silently stopped would leave its partitions
                    # unread. What was not taken is fetched again.
                    log.exception("%s failed; retrying", self.name)
                    stop.wait(1.0)
        finally:
            self._close()

    def _close(self) -> None:
        for what, step in (("finishing", self.member.finish), ("committing", self.commit),
                           ("leaving", self.member.leave), ("closing", self.consumer.close)):
            try:
                step()
            except Exception:
                log.warning("%s failed while %s", self.name, what, exc_info=True)
