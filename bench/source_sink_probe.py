"""Throughput of the Kafka source and sink: just numbers, no assertions.

    .venv/bin/python bench/source_sink_probe.py [--records 20000] [--bootstrap-servers H:P]

Prints, for N events (half + end records, 200-byte bodies):
  - planning: latestOffset as the driver-side reader runs it (ms, p50/p90)
  - direct: read() and the sink's send_rows() in this process, no Spark (events/s)
  - spark: source only (noop sink) and source + Kafka sink, one availableNow query each over
    all N events, warm workers (events/s over the query's wall time, and inside the batch)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable

from sinks.kafka_sink import SinkOptions, send_rows
from sources.kafka_source import KafkaEventSource, register
from streaming.session import build_session
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, make_producer
from txstream.message import Decision, EndEvent, Message
from txstream.schema import EVENT_SCHEMA
from txstream.topics import Topics
from txstream.wire import encode_end, encode_half

__all__ = ["main"]


def _produce(kafka: KafkaSettings, topics: Topics, events: int) -> float:
    producer = make_producer(kafka)
    began = time.monotonic()
    for i in range(events // 2):
        msg = Message(topic="bench_real", body=b"b" * 200, tags="t", keys=f"k{i}",
                      transaction_id=f"tx{i}", producer_group="bench", born_timestamp=1)
        for rec in (encode_half(msg, topics),
                    encode_end(EndEvent(f"tx{i}", "bench", Decision.COMMIT_MESSAGE), topics)):
            producer.send(rec.topic, key=rec.key, value=rec.value, headers=list(rec.headers))
    producer.flush()
    producer.close()
    return events / (time.monotonic() - began)


def _options(kafka: KafkaSettings, topics: Topics, crcs: str) -> dict[str, str]:
    return {"kafka": json.dumps(kafka.as_dict()), "half_topic": topics.half,
            "end_topic": topics.end, "check_crcs": crcs}


def _direct(spark: Any, kafka: KafkaSettings, topics: Topics, crcs: str) -> dict[str, float]:
    """Planning and reading as Spark's Python processes do it, timed without Spark around."""
    schema = spark.createDataFrame([], EVENT_SCHEMA).schema
    reader = KafkaEventSource(_options(kafka, topics, crcs)).streamReader(schema)
    start = reader.initialOffset()
    times = []
    for _ in range(50):
        began = time.monotonic()
        end = reader.latestOffset(start, ReadAllAvailable())
        times.append((time.monotonic() - began) * 1000)
    times.sort()
    began = time.monotonic()
    rows: list[tuple[Any, ...]] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            rows.extend(zip(batch.column("transaction_id").to_pylist(),
                            batch.column("body").to_pylist(), strict=True))
    read_s = time.monotonic() - began
    out = f"{topics.half}_direct_out"
    records = [("visible", out, (tx or "").encode(), body or b"x", [{"key": "h", "value": b"v"}])
               for tx, body in rows]
    began = time.monotonic()
    send_rows(SinkOptions(kafka=kafka), records)
    send_s = time.monotonic() - began
    return {"latest_p50": times[len(times) // 2], "latest_p90": times[int(len(times) * 0.9)],
            "read": len(rows) / read_s, "send": len(records) / send_s}


def _run(
    spark: Any, kafka: KafkaSettings, topics: Topics, crcs: str, sink: bool
) -> tuple[float, float, int, float]:
    """One availableNow query over everything: events/s over its wall time and inside its
    batches, events, and the median latestOffset time Spark measured."""
    from pyspark.sql import functions as F

    events = spark.readStream.format("txstream-events")
    for key, value in _options(kafka, topics, crcs).items():
        events = events.option(key, value)
    df = events.load()
    checkpoint = tempfile.mkdtemp(prefix="txstream-bench-")
    if sink:
        out = df.select(
            F.lit("visible").alias("kind"),
            F.lit(f"{topics.half}_out").alias("topic"),
            F.col("transaction_id").cast("binary").alias("key"),
            F.coalesce(F.col("body"), F.col("decision").cast("binary")).alias("value"),
            F.array(F.struct(F.lit("src").alias("key"),
                             F.col("src_topic").cast("binary").alias("value"))).alias("headers"),
            F.col("transaction_id"),
            F.col("kind").alias("event"),
            F.lit(None).cast("bigint").alias("lag_ms"),
        )
        writer = (out.writeStream.format("txstream-records")
                  .option("kafka", json.dumps(kafka.as_dict())))
    else:
        writer = df.writeStream.format("noop")
    began = time.monotonic()
    query = writer.option("checkpointLocation", checkpoint).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    wall = time.monotonic() - began
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    batch_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    latest = statistics.median(p["durationMs"].get("latestOffset", 0)
                               for p in query.recentProgress)
    return rows / wall, rows / batch_s if batch_s else 0.0, rows, latest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000, help="events (half + end records)")
    parser.add_argument("--bootstrap-servers", help="default: start an embedded tansu broker")
    parser.add_argument("--check-crcs", default="true", choices=("true", "false"))
    args = parser.parse_args(argv)
    broker = None if args.bootstrap_servers else EmbeddedBroker().start()
    servers = args.bootstrap_servers or (broker.bootstrap_servers if broker else "")
    try:
        kafka = KafkaSettings(bootstrap_servers=servers)
        spark = build_session(app_name="txstream-bench")
        register(spark)
        run = uuid.uuid4().hex[:8]
        warm = Topics.with_prefix(f"bw{run}_")
        _produce(kafka, warm, 200)
        _run(spark, kafka, warm, args.check_crcs, sink=True)  # start and warm the Python workers

        topics = [Topics.with_prefix(f"b{i}{run}_") for i in range(3)]
        rates = [_produce(kafka, t, args.records) for t in topics]
        print(f"records: {args.records} events, check_crcs={args.check_crcs}")
        print(f"produce (kafka-python, acks=all): {statistics.median(rates):,.0f} events/s")
        direct = _direct(spark, kafka, topics[0], args.check_crcs)
        print(f"latestOffset: p50 {direct['latest_p50']:.1f} ms, p90 {direct['latest_p90']:.1f} ms")
        print(f"read() direct, no Spark: {direct['read']:,.0f} events/s")
        print(f"sink send_rows direct, no Spark: {direct['send']:,.0f} records/s")
        for name, topic_set, sink in (("source only", topics[1], False),
                                      ("source + sink", topics[2], True)):
            wall, inside, rows, latest = _run(spark, kafka, topic_set, args.check_crcs, sink)
            print(f"spark {name}: {wall:,.0f} events/s wall ({inside:,.0f} inside batches), "
                  f"{rows} events; latestOffset as Spark timed it: {latest:.0f} ms")
        spark.stop()
    finally:
        if broker is not None:
            broker.stop()


if __name__ == "__main__":
    main()
