"""Helpers for the tests of the in-memory broker (txstream.kafka.memory)."""

from __future__ import annotations

import random
import uuid
from typing import Any

from kafka import TopicPartition

from txstream.kafka import make_consumer
from txstream.kafka.memory import MemoryBroker

__all__ = ["Clock", "new_broker", "fill", "assigned", "offsets"]


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
