"""Helpers for the tests of the in-memory broker (txstream.kafka.memory)."""

from __future__ import annotations

import random
import uuid
from typing import Any

from kafka import TopicPartition

from txstream.kafka import make_consumer
from txstream.kafka.memory import MemoryBroker

__all__ = ["Clock", "new_broker", "fill", "assigned", "offsets", "trace_schedule"]


class Clock:
    """The simulation's virtual clock (ms)."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def new_broker(clock: Clock, seed: int = 7, tansu: bool = False, **options: Any
               ) -> MemoryBroker:
    """A broker under a fresh name (not registered yet); no fetch stays in flight unless
    ``in_flight_probability`` says so."""
    make = MemoryBroker.like_tansu if tansu else MemoryBroker
    options.setdefault("in_flight_probability", 0.0)
    return make(f"m{uuid.uuid4().hex[:8]}", clock, random.Random(seed), **options)


def fill(broker: MemoryBroker, topic: str, count: int, partitions: int = 1, **configs: str
         ) -> None:
    """Create ``topic`` and append ``count`` records round the partitions."""
    broker.create_topic(topic, partitions, configs)
    for i in range(count):
        broker.append(topic, f"k{i}".encode(), f"v{i}".encode(), partition=i % partitions)


def assigned(broker: MemoryBroker, tp: TopicPartition, offset: int | None = 0,
             **options: Any) -> Any:
    """A consumer assigned ``tp`` and, unless ``offset`` is None, seeked there."""
    consumer = make_consumer(broker.settings, **options)
    consumer.assign([tp])
    if offset is not None:
        consumer.seek(tp, offset)
    return consumer


def offsets(batch: dict[Any, list[Any]], tp: TopicPartition) -> list[int]:
    return [r.offset for r in batch.get(tp, [])]


def trace_schedule(seed: int) -> list[Any]:
    """A schedule of appends, seeks and polls against a consumer with every quirk on."""
    quirks = {"in_flight_probability": 0.4, "stale_fetch_probability": 0.5}
    with new_broker(Clock(), seed, **quirks) as broker:
        fill(broker, "t", 4, partitions=2)
        tps = [TopicPartition("t", p) for p in (0, 1)]
        consumer = make_consumer(broker.settings, max_poll_records=3)
        consumer.assign(tps)
        steps = random.Random(seed)
        trace: list[Any] = []
        for _ in range(200):
            move = steps.random()
            if move < 0.3:
                broker.append("t", None, b"v")
            elif move < 0.35:
                consumer.seek(tps[steps.randrange(2)], 0)
            batch = consumer.poll(timeout_ms=1)
            trace.append(([(tp.partition, offsets(batch, tp)) for tp in tps],
                          [(consumer.position(tp), consumer.highwater(tp)) for tp in tps]))
        return trace
