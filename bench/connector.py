"""The connector phase: Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10)
under the floor's query, beside the floor's two I/O variants (:mod:`bench.floor`).

``floor_kafka``: Spark's Kafka source reading a topic filled beforehand, ``rows`` records a
batch (``maxOffsetsPerTrigger``), so batches run back to back as the floor's do, the same
counting ``applyInPandasWithState``, and Spark's Kafka sink writing one record a key. Set beside
``floor`` (built-in source and sink that do no I/O) and ``floor_python_io`` (pyspark's Python
data source API, which txstream's source and sink use), it says what the connector costs a
batch, and what moving txstream's data through it could save. Measure it on Apache Kafka: on
tansu, whose ListOffsets answers are wrong, it reads, but slowly. Each variant's first batch is
given too: in a new query it carries the planning the Python API does in Python processes.

The connector's jars are fetched by ``scripts/setup.sh`` (``deploy/spark-kafka/pom.xml``) and
must be on the session's class path before its JVM starts (:func:`connector_conf`).
"""

from __future__ import annotations

import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.cpu import CpuMeter
from bench.floor import FloorResult, count_rows, floor_result, measure_span
from bench.harness import logged_session
from bench.workload import create_topics
from txstream.errors import ConfigError
from txstream.kafka import make_producer
from txstream.streaming.engine.config import RunConfig

__all__ = ["connector_jars", "connector_conf", "measure_floor_kafka"]

# Batches the topic is filled for: the warm-up's and the span's, with room to spare.
_BATCHES_FILLED = 600


def connector_jars(prefix: str = sys.prefix) -> list[str]:
    """The connector's jars in this venv (``<venv>/spark-kafka/jars``)."""
    folder = Path(prefix) / "spark-kafka" / "jars"
    jars = sorted(str(p) for p in folder.glob("*.jar"))
    if not any("spark-sql-kafka" in j for j in jars):
        raise ConfigError(f"Spark's Kafka connector is not in {folder}: run scripts/setup.sh")
    return jars


def connector_conf(config: RunConfig) -> RunConfig:
    """``config`` with the connector on the session's class path (``spark.jars``)."""
    return config.with_(spark_conf=(*config.spark_conf, ("spark.jars", ",".join(
        connector_jars()))))


def _fill(config: RunConfig, topic: str, count: int) -> None:
    producer = make_producer(config.kafka, linger_ms=20, batch_size=1 << 20)
    try:
        for i in range(count):
            producer.send(topic, key=str(i % config.buckets).encode(), value=str(i).encode())
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)


def _start(spark: Any, config: RunConfig, rows: int, source: str, sink: str, name: str,
           checkpoint: str) -> Any:
    from pyspark.sql.streaming.state import GroupStateTimeout

    servers = config.kafka.bootstrap_servers
    keyed = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers)
             .option("subscribe", source).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", rows).load()
             .selectExpr("CAST(key AS STRING) AS k", "value"))
    counted = keyed.groupBy("k").applyInPandasWithState(
        count_rows, "k string, rows long", "rows long", "append",
        GroupStateTimeout.ProcessingTimeTimeout)
    return (counted.selectExpr("k AS key", "CAST(rows AS STRING) AS value").writeStream
            .format("kafka").option("kafka.bootstrap.servers", servers).option("topic", sink)
            .option("checkpointLocation", checkpoint).outputMode("append").queryName(name)
            .trigger(processingTime=f"{config.trigger_ms} milliseconds").start())


def measure_floor_kafka(config: RunConfig, rows: int, seconds: float, meter: CpuMeter
                        ) -> FloorResult:
    """The floor through the connector, as :func:`bench.floor.measure_floor` measures it."""
    unique = uuid.uuid4().hex[:6]
    source, sink, name = f"bench_fk_in_{unique}", f"bench_fk_out_{unique}", f"bench-fk-{unique}"
    create_topics(config.kafka, [source, sink], config.topic_partitions)
    _fill(config, source, rows * _BATCHES_FILLED)
    spark, log = logged_session(config)
    checkpoint = tempfile.mkdtemp(prefix="txstream-bench-floor-kafka-")
    query = _start(spark, config, rows, source, sink, name, checkpoint)
    span = measure_span(query, log, name, seconds, checkpoint)
    if not any(b.input_rows for b in span.batches):
        raise ConfigError(f"Spark's Kafka source read nothing from {source} on "
                          f"{config.kafka.bootstrap_servers}: measure it on Apache Kafka "
                          "(txstream broker --kafka, then txstream bench --bootstrap-servers)")
    return floor_result(rows, seconds, span, meter)
