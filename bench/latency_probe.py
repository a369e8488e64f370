"""Prints the coordinator's start-up and latency figures on this machine.

    .venv/bin/python bench/latency_probe.py [--transactions 40] [--rate 5]

Starts an embedded broker and the coordinator, then measures: SparkSession start, time to the
first micro-batch, commit -> visible (from the producer's acknowledged commit to the record
arriving at an assigned consumer) and how late back-checks are written after their deadline
(from the history topic's ``check_sent`` notes). Numbers only; no assertions.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import TopicPartition

from state.policy import Policy
from streaming.config import RunConfig
from streaming.run import Coordinator
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, make_consumer, make_producer
from txstream.message import Decision, EndEvent, Message
from txstream.topics import Topics
from txstream.wire import Record, decode_history, encode_end, encode_half

__all__ = ["main"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=40)
    parser.add_argument("--rate", type=float, default=5.0)
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        kafka = KafkaSettings(broker.bootstrap_servers)
        topics = Topics.with_prefix(f"p{uuid.uuid4().hex[:6]}_")
        policy = Policy(transaction_timeout=2000, check_interval=2000, check_max=2)
        config = RunConfig(kafka=kafka, topics=topics, policy=policy,
                           checkpoint_dir=Path(tempfile.mkdtemp()) / "cp")
        started = time.monotonic()
        coordinator = Coordinator(config)
        from streaming.session import build_session

        build_session()
        session_s = time.monotonic() - started
        coordinator.start()
        while coordinator.listener.stats.batches < 1:
            time.sleep(0.05)
        first_batch_s = time.monotonic() - started

        real = topics.half + "_real"
        acked: dict[str, float] = {}
        seen: dict[str, float] = {}
        consumer = make_consumer(kafka)
        producer = make_producer(kafka, linger_ms=0)
        producer.send(real, b"warm").get(10)
        tp = TopicPartition(real, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=50).values():
                    for r in records:
                        if r.key and r.key.decode() in acked:
                            seen.setdefault(r.key.decode(), time.time())

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        for i in range(args.transactions):
            txid = f"tx{i}"
            now = int(time.time() * 1000)
            msg = Message(real, b"x" * 200, keys=txid, transaction_id=txid, msg_id=txid,
                          producer_group="probe", born_timestamp=now)
            _send(producer, encode_half(msg, topics))
            end = EndEvent(txid, "probe", Decision.COMMIT_MESSAGE,
                           born_timestamp=int(time.time() * 1000))
            _send(producer, encode_end(end, topics))
            acked[txid] = time.time()
            time.sleep(1 / args.rate)
        # One unknown transaction to time the back-checks.
        msg = Message(real, b"u", transaction_id="unknown", msg_id="unknown",
                      producer_group="probe", born_timestamp=int(time.time() * 1000))
        _send(producer, encode_half(msg, topics))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(seen) < len(acked):
            time.sleep(0.1)
        time.sleep(7)  # three checks of the unknown one: 2 s, then every 2 s
        stop.set()
        reader.join()
        late = _check_lateness(kafka, topics)
        phases = _batch_phases(coordinator.query.recentProgress)
        coordinator.stop()
        latencies = [(seen[t] - acked[t]) * 1000 for t in seen]
        print(f"session start            {session_s:6.1f} s")
        print(f"first micro-batch        {first_batch_s:6.1f} s after start")
        print(f"commit -> visible (n={len(latencies)}, {args.rate:g} tx/s)  p50 "
              f"{statistics.median(latencies):.0f} ms  p90 {_pct(latencies, 0.9):.0f} ms  "
              f"max {max(latencies):.0f} ms")
        print(f"back-check lateness (n={len(late)})  p50 {statistics.median(late):.0f} ms  "
              f"max {max(late):.0f} ms")
        for label, figures in phases.items():
            shown = "  ".join(f"{k} {v:.0f}" for k, v in figures.items())
            print(f"{label:24s} {shown} (ms, p50)")


def _batch_phases(progress: list[Any]) -> dict[str, dict[str, float]]:
    """Median of each part of Spark's ``durationMs``, for batches with input and without."""
    groups: dict[str, list[dict[str, int]]] = {"busy batch": [], "idle batch": []}
    for p in progress:
        label = "busy batch" if p.numInputRows else "idle batch"
        groups[label].append(dict(p.durationMs))
    return {label: {k: statistics.median(d.get(k, 0) for d in rows)
                    for k in sorted({k for d in rows for k in d})}
            for label, rows in groups.items() if rows}


def _send(producer: Any, record: Record) -> None:
    producer.send(record.topic, key=record.key, value=record.value,
                  headers=list(record.headers)).get(10)


def _check_lateness(kafka: KafkaSettings, topics: Topics) -> list[float]:
    consumer = make_consumer(kafka)
    parts = consumer.partitions_for_topic(topics.history) or set()
    tps = [TopicPartition(topics.history, p) for p in parts]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    late: list[float] = []
    for _ in range(20):
        for records in consumer.poll(timeout_ms=200).values():
            for r in records:
                for note in decode_history(r.value, r.key):
                    if note.get("event") == "check_sent":
                        late.append(float(str(note["late_ms"])))
    return late


if __name__ == "__main__":
    main()
