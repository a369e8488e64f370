"""The limit: the same broker and Kafka client moving the same records, without Spark.

Each pipe process reads one partition of the half topic and the same partition of the end
topic (a transaction's records share their key, so they share the partition number), pairs a
half message with its commit by key, and writes the visible record to the real topic with the
producer settings the coordinator's sink uses (acks=all, idempotent). Two records in, one out,
per transaction; no decoding beyond finding the real topic: nothing a coordinator could skip.

Run with one process per partition (the coordinator also runs one task per core), and with a
single process; the faster is the limit.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any

from txstream.kafka import KafkaSettings, make_consumer
from txstream.sinks.kafka_sink import make_sink_producer
from txstream.topics import Topics
from txstream.wire import H

__all__ = ["PipeResult", "run_raw_pipe"]

_REAL_TOPIC = H.REAL_TOPIC
_DROP = frozenset({H.TRAN_MSG, H.REAL_TOPIC})


@dataclass(frozen=True)
class PipeResult:
    transactions: int
    processes: int
    seconds: float
    started_ms: float  # wall clock, for the CPU the span used (bench.cpu)

    @property
    def tx_per_s(self) -> float:
        return self.transactions / self.seconds if self.seconds > 0 else 0.0


def _pipe(settings: KafkaSettings, topics: Topics, partitions: list[int], expected: int,
          ready: Any, go: Any, done: Any) -> None:
    """One pipe process: forward committed half messages of ``partitions`` until ``expected``."""
    from kafka import TopicPartition

    consumer = make_consumer(settings, fetch_max_wait_ms=5, max_poll_records=10_000)
    producer = make_sink_producer(settings)
    tps = [TopicPartition(t, p) for t in (topics.half, topics.end) for p in partitions]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    halves: dict[bytes, Any] = {}
    early: set[bytes] = set()
    released = 0
    ready.put(True)
    go.wait()

    def release(rec: Any) -> None:
        topic = ""
        headers = []
        for name, value in rec.headers:
            if name == _REAL_TOPIC:
                topic = value.decode()
            elif name not in _DROP:
                headers.append((name, value))
        producer.send(topic, key=rec.key, value=rec.value, headers=headers)

    while released < expected:
        for tp, records in consumer.poll(timeout_ms=50).items():
            if tp.topic == topics.half:
                for rec in records:
                    if rec.key in early:
                        early.discard(rec.key)
                        release(rec)
                        released += 1
                    else:
                        halves[rec.key] = rec
            else:
                for rec in records:
                    half = halves.pop(rec.key, None)
                    if half is None:
                        early.add(rec.key)
                    else:
                        release(half)
                        released += 1
    producer.flush()
    done.put(released)
    producer.close()
    consumer.close()


def run_raw_pipe(settings: KafkaSettings, topics: Topics, per_partition: dict[int, int],
                 processes: int) -> PipeResult:
    """Time the pipe over records already in the topics; ``per_partition``: tx per partition."""
    ctx = mp.get_context("spawn")  # no inherited client threads or sockets
    parts = sorted(per_partition)
    groups = [parts[i::processes] for i in range(processes)]
    ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_pipe, args=(settings, topics, g, sum(per_partition[p] for p in g),
                                        ready, go, done), daemon=True)
        for g in groups if g
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            ready.get(timeout=120)
        started, started_ms = time.perf_counter(), time.time() * 1000
        go.set()
        total = sum(done.get(timeout=600) for _ in procs)
        elapsed = time.perf_counter() - started
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    return PipeResult(total, len(procs), elapsed, started_ms)
