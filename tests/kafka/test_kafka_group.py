"""The committing group member (txstream.kafka.group): what its listener commits on a
revocation and on a loss, and what its loop commits when it stops.

A real broker evicts a member only after its session timeout, and kafka-python calls
``on_partitions_lost`` then from its IO thread: the listener is driven here directly, against
the client library's real offset tracker, with a consumer that records its commits. The
loop's commits against a real broker are the client tests' (tests/client/test_client_checks.py,
tests/client/test_client_consumer.py).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from kafka import TopicPartition

from txstream.client.offsets import OffsetTracker
from txstream.kafka.group import CommitOnRevoke, CommittingConsumer

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


class _Consumer:
    """Records commits; polls nothing."""

    config = {"session_timeout_ms": 6000}

    def __init__(self) -> None:
        self.commits: list[dict[Any, int]] = []
        self.closed = False

    async def commit_async(self, offsets: dict[Any, Any]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})

    def commit(self, offsets: dict[Any, Any]) -> None:
        self.commits.append({tp: meta.offset for tp, meta in offsets.items()})

    def poll(self, timeout_ms: int) -> dict[Any, list[Any]]:
        return {}

    def close(self) -> None:
        self.closed = True


class _Member:
    def __init__(self, owned: set[Any]) -> None:
        self._owned = owned
        self.calls: list[tuple[str, Any]] = []

    def before_poll(self) -> int:
        return 1

    def take(self, tp: Any, records: list[Any]) -> bool:
        return False

    def owned(self) -> set[Any]:
        return set(self._owned)

    def settle(self, tps: set[Any], timeout_s: float) -> None:
        self.calls.append(("settle", (frozenset(tps), timeout_s)))

    def drop(self, tps: set[Any]) -> None:
        self.calls.append(("drop", frozenset(tps)))
        self._owned -= tps

    def assigned(self, tps: set[Any]) -> None:
        self.calls.append(("assigned", frozenset(tps)))

    def finish(self) -> None:
        self.calls.append(("finish", None))

    def leave(self) -> None:
        self.calls.append(("leave", None))


def _group(drain_s: float = 30.0) -> tuple[CommittingConsumer, _Consumer, _Member,
                                           OffsetTracker]:
    offsets = OffsetTracker()
    for tp, last in ((A, 4), (B, 9)):  # both read up to `last`, all finished
        offsets.rewind(tp, 0)
        for offset in range(last + 1):
            offsets.take(tp, offset, inflight=False)
    consumer, member = _Consumer(), _Member({A, B})
    return CommittingConsumer(consumer, offsets, member, name="g", drain_s=drain_s), \
        consumer, member, offsets


def test_a_revoked_partition_settles_within_half_the_session_then_is_committed_and_dropped(
) -> None:
    group, consumer, member, _ = _group(drain_s=30.0)
    asyncio.run(CommitOnRevoke(group).on_partitions_revoked([A]))
    assert consumer.commits == [{A: 5}]
    assert member.calls == [("settle", (frozenset({A}), 3.0)), ("drop", frozenset({A}))]


def test_a_lost_partition_is_dropped_without_a_commit() -> None:
    """Another member owns it already: a commit would overwrite its progress."""
    group, consumer, member, offsets = _group()
    asyncio.run(CommitOnRevoke(group).on_partitions_lost([A]))
    assert consumer.commits == []
    assert member.calls == [("settle", (frozenset({A}), 0.0)), ("drop", frozenset({A}))]
    assert offsets.to_commit({B}) == {B: 10}  # the partition kept is untouched


def test_only_the_members_own_partitions_are_committed_on_revocation() -> None:
    group, consumer, member, _ = _group()
    member._owned = {B}  # A assigned but not positioned yet: nothing of it is ours to commit
    asyncio.run(CommitOnRevoke(group).on_partitions_revoked([A, B]))
    assert consumer.commits == [{B: 10}]


def test_stopping_finishes_the_work_commits_leaves_then_closes() -> None:
    group, consumer, member, _ = _group()
    stop = threading.Event()
    stop.set()
    group.run(stop)
    assert [name for name, _ in member.calls] == ["finish", "leave"]
    assert consumer.commits == [{A: 5, B: 10}] and consumer.closed
