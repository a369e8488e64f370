"""The simulated world: a virtual clock, an in-memory broker, the coordinator's topics."""

from __future__ import annotations

import random
from bisect import bisect_left
from typing import Any, NamedTuple

from txstream.kafka.memory import MemoryBroker
from txstream.kafka.memory_registry import register, unregister
from txstream.topics import Topics

__all__ = ["World", "T0", "Rec"]

# Virtual time starts years before the wall clock: code that compares a deadline with the wall
# clock (the sink holding a record until its deadline) then never waits for real.
T0 = 1_600_000_000_000


class Rec(NamedTuple):
    """A record as a consumer gets it (what the oracle and the actors read)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    timestamp: int


class World:
    """Time (ms, virtual, advanced by the schedule only) and the broker everything talks to."""

    def __init__(self, seed: int, rng: random.Random, *, partitions: int = 2,
                 in_flight: float = 0.2, stale: float = 0.2, like_tansu: bool = True,
                 committed: bool = False) -> None:
        """``committed``: the coordinator writes in Kafka transactions, and what the actors
        and the oracle read is what read_committed consumers are handed."""
        self.seed = seed
        self.committed = committed
        self.now = T0
        self.topics = Topics.with_prefix("sim_")
        make = MemoryBroker.like_tansu if like_tansu else MemoryBroker
        self.broker = make(f"sim-{seed}-{id(self)}", lambda: self.now,
                           random.Random(rng.getrandbits(64)),
                           in_flight_probability=in_flight, stale_fetch_probability=stale,
                           wait=self._waited)
        register(self.broker)
        self.broker_down = False
        self.recreated = False  # the half topic was deleted and made again
        self.slack_ms = 0  # how late a timer may run (batch cadence), set by the schedule
        for topic in (self.topics.half, self.topics.end):
            self.broker.create_topic(topic, partitions)

    def _waited(self, ms: int) -> None:
        """A client's poll waited ``ms`` for the broker (nothing came): time moves on, so a
        reader's wait ends on the virtual clock, as the schedule's faults do."""
        self.now += ms

    @property
    def settings(self) -> Any:
        return self.broker.settings

    def close(self) -> None:
        unregister(self.broker.name)

    def set_down(self, down: bool) -> None:
        self.broker_down = down
        self.broker.down = down

    # --- reading what is there (the oracle's and the actors' view, not a client's) --------

    def _records(self, topic: str, partition: int) -> list[Rec]:
        """What a reader sees: a read_committed one (every reader, with transactions) sees
        neither aborted records nor any at or past the last stable offset. A high watermark
        held back (a ``stall``) is seen through: what it holds back is handed out later."""
        stored = self.broker.records(topic, partition)
        if self.committed:
            stable = self.broker.last_stable_offset(topic, partition, held=False)
            aborted = self.broker.transactions_of(topic, partition).aborted
            stored = [r for r in stored if r.offset < stable and r.offset not in aborted]
        return [Rec(topic, partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)
                for r in stored]

    def visible(self, topic: str, partition: int) -> list[Rec]:
        """The partition's records a reader is handed now."""
        return self._records(topic, partition)

    def all_records(self, topic: str) -> list[Rec]:
        out: list[Rec] = []
        for partition in range(self.broker.partition_count(topic) or 0):
            out.extend(self._records(topic, partition))
        return out

    def record_at(self, topic: str | None, partition: int, offset: int) -> Rec | None:
        if topic is None or partition < 0 or offset < 0:
            return None
        if partition >= (self.broker.partition_count(topic) or 0):
            return None
        for rec in self._records(topic, partition):
            if rec.offset == offset:
                return rec
        return None

    def read_new(self, topic: str, positions: dict[tuple[str, int], int]
                 ) -> dict[int, list[Rec]]:
        """The records of ``topic`` after ``positions`` (moved on), by partition."""
        out: dict[int, list[Rec]] = {}
        for partition in range(self.broker.partition_count(topic) or 0):
            at = positions.get((topic, partition), 0)
            end = (self.broker.last_stable_offset(topic, partition, held=False)
                   if self.committed else self.broker.end_offset(topic, partition))
            if end <= at:
                continue
            stored = self._records(topic, partition)
            first = bisect_left(stored, at, key=lambda r: r.offset)
            new = stored[first:]
            if new:
                out[partition] = new
            # Past markers and aborted records too, as a consumer's position moves.
            positions[(topic, partition)] = end
        return out
