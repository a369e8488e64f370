"""The coordinator: one streaming query from the half/end topics to every output topic.

    txstream-events (half + end topics), each record with its state key      [state.keys]
      -> groupBy(state_key).applyInPandasWithState(ProcessingTimeTimeout)   [streaming.operator]
      -> observe(per-kind counters)                                      [streaming.progress]
      -> txstream-records (real topics, check topics, discard, dead letter, history)

An idle query runs a micro-batch only when a timer is due: the sink keeps a schedule of the
keys' timeouts in the checkpoint, and the source moves its offset when one has come
(txstream.timer_schedule; Spark's no-data batches are off, streaming.session).

The state update and the sink's writes commit together per micro-batch: a batch whose writes
are not all acknowledged fails and is replayed from the checkpoint with the state it started
with, so a back-check counts only once it was delivered and nothing is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from state.keys import KeyLayout
from streaming.config import RunConfig
from streaming.operator import coordinator_function
from txstream.errors import ConfigError
from txstream.schema import HISTORY_COUNTED, OUTPUT_SCHEMA, STATE_SCHEMA, Kind
from txstream.timer_schedule import SCHEDULE_FILE

__all__ = ["build_stream", "start_coordinator", "pin_layout", "LAYOUT_FILE", "OBSERVATION"]

OBSERVATION = "txstream"


def _observed_metrics() -> list[Any]:
    """Per-batch counters, delivered to StreamingQueryListeners on the driver."""
    from pyspark.sql import functions as F

    def count(condition: Any, name: str) -> Any:
        return F.count(F.when(condition, 1)).alias(name)

    kind = F.col("kind")

    def history(event: str, name: str) -> Any:
        return F.coalesce(F.sum(F.col(HISTORY_COUNTED[event])), F.lit(0)).alias(name)

    return [
        count(kind == Kind.VISIBLE, "released"),
        count(kind == Kind.CHECK, "checks_sent"),
        count(kind == Kind.DISCARD, "discarded"),
        count(kind == Kind.DEAD_LETTER, "dead_letters"),
        history("half", "halves"),
        history("rolled_back", "rolled_back"),
        history("rejected", "rejected"),
        history("duplicate", "duplicates"),
        history("expired", "expired"),
        F.max(F.when(kind == Kind.CHECK, F.col("lag_ms"))).alias("check_late_max_ms"),
        F.sum(F.when(kind == Kind.CHECK, F.col("lag_ms"))).alias("check_late_sum_ms"),
        F.max(F.when(kind == Kind.VISIBLE, F.col("lag_ms"))).alias("visible_lag_max_ms"),
        F.sum(F.when(kind == Kind.VISIBLE, F.col("lag_ms"))).alias("visible_lag_sum_ms"),
        count((kind == Kind.VISIBLE) & F.col("lag_ms").isNotNull(), "visible_lag_count"),
    ]


def build_stream(spark: Any, config: RunConfig, function: Callable[..., Any] | None = None
                 ) -> Any:
    """The coordinator's DataStreamWriter, not yet started. ``function``: what runs per state
    key, by default the coordinator's own (:func:`streaming.operator.coordinator_function`);
    the benchmark swaps in a stand-in to measure the query without the core (bench.ceiling)."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from sources.kafka_source import register

    register(spark)  # both data sources: the events source and the records sink
    kafka = json.dumps(config.kafka.as_dict())
    timer_file = str(config.checkpoint_dir / SCHEDULE_FILE)
    reader = (
        spark.readStream.format("txstream-events")
        .option("kafka", kafka)
        .option("half_topic", config.topics.half)
        .option("end_topic", config.topics.end)
        .option("topic_partitions", str(config.topic_partitions))
        .option("key_layout", json.dumps(config.layout.as_dict()))
        .option("read_tasks", str(spark.sparkContext.defaultParallelism))
        .option("timer_file", timer_file)
    )
    if config.max_offsets_per_trigger:
        reader = reader.option("max_offsets_per_trigger", str(config.max_offsets_per_trigger))
    outputs = (
        reader.load()
        .groupBy("state_key")
        .applyInPandasWithState(
            function or coordinator_function(config.policy, config.topics),
            OUTPUT_SCHEMA,
            STATE_SCHEMA,
            "append",
            GroupStateTimeout.ProcessingTimeTimeout,
        )
        .observe(OBSERVATION, *_observed_metrics())
    )
    if not config.history:
        outputs = outputs.filter(F.col("kind") != Kind.HISTORY)
    return (
        outputs.writeStream.format("txstream-records")
        .option("kafka", kafka)
        .option("replay_check", str(config.replay_check).lower())
        .option("timer_file", timer_file)
        .option("checkpointLocation", str(config.checkpoint_dir))
        .outputMode("append")
        .queryName(config.query_name)
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
    )


LAYOUT_FILE = "txstream.json"


def pin_layout(config: RunConfig) -> None:
    """Record the state-key layout in the checkpoint, and refuse to run against another one.

    A transaction's state lives under the key :func:`state.keys.state_key` gives its id: with
    another layout its end event would reach a key that never saw its half message. Spark cannot
    tell (the state's key is just a number), so txstream does.
    """
    config.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    path = config.checkpoint_dir / LAYOUT_FILE
    wanted = config.layout.as_dict()
    if path.exists():
        try:
            pinned = json.loads(path.read_text())
            KeyLayout(**pinned)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path} is damaged or from an older txstream ({exc}); it records "
                              "the state-key layout: start a new checkpoint") from None
        if pinned != wanted:
            flags = {"window_ms": "--key-window {}ms", "shards": "--key-shards {}",
                     "fallback_buckets": "--buckets {}", "partitions": "--shuffle-partitions {}"}
            use = " ".join(flags[k].format(v) for k, v in pinned.items())
            raise ConfigError(
                f"checkpoint {config.checkpoint_dir} was written with another state-key layout "
                f"({pinned}, not {wanted}): run with {use}, or start a new checkpoint")
        return
    path.write_text(json.dumps(wanted) + "\n")


def start_coordinator(spark: Any, config: RunConfig,
                      function: Callable[..., Any] | None = None) -> Any:
    """Start the coordinator query on ``spark``; returns the StreamingQuery."""
    pin_layout(config)
    return build_stream(spark, config, function).start()
