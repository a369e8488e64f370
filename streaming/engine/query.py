"""The coordinator: one streaming query from the half/end topics to every output topic.

    txstream-events (half + end topics), each record with its state key      [state.keys]
      -> groupBy(state_key).applyInPandasWithState(ProcessingTimeTimeout)
                                                        [streaming.engine.operator]
      -> observe(the keys' tallies)            [streaming.engine.progress, metric_totals]
      -> txstream-records (real topics, check topics, discard, dead letter, history)

The query is built from three pieces, each usable alone: :func:`event_stream` (the source),
:func:`stateful_outputs` (the stateful operator around a per-key function) and
:func:`record_writer` (the sink). :func:`build_stream` joins them around the coordinator's own
function.

An idle query runs a micro-batch only when a timer is due: the sink keeps a schedule of the
keys' timeouts, and the source moves its offset when one has come
(docs/decisions/0003-timer-schedule.md; Spark's no-data batches are off). A quiet source asks
the broker less often (docs/decisions/0028-idle-wait.md).

The state update and the sink's writes commit together per micro-batch: a batch whose writes
are not all acknowledged fails and is replayed from the checkpoint with the state it started
with, so a back-check counts only once it was delivered and nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from txstream.options import to_options
from txstream.schema import OUTPUT_SCHEMA, STATE_SCHEMA, Kind
from txstream.sinks.kafka_sink import SinkOptions
from txstream.sources.idle import IDLE_WAIT_MS
from txstream.sources.kafka_io import SourceOptions
from txstream.streaming.engine.checkpoint import Checkpoint, pin_layout
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.key_metrics import KEY_SUMMARIES
from txstream.streaming.engine.operator import coordinator_function
from txstream.streaming.engine.timers import restore_schedule

__all__ = ["register", "source_options", "event_stream", "stateful_outputs", "record_writer",
           "build_stream", "prepare_checkpoint", "resolve_transactions", "start_coordinator",
           "OBSERVATION",
           "KEY_SUMMARIES"]

OBSERVATION = "txstream"

log = logging.getLogger(__name__)


def _observed_metrics() -> list[Any]:
    """Each key's tally of the batch, from its timer row (streaming.engine.key_metrics),
    delivered to StreamingQueryListeners on the driver."""
    from pyspark.sql import functions as F

    return [
        F.collect_list(F.when(F.col("kind") == Kind.TIMER, F.col("value").cast("string")))
        .alias(KEY_SUMMARIES),
    ]


def register(spark: Any) -> None:
    """Register ``txstream-events`` and ``txstream-records`` on ``spark`` (per session)."""
    from txstream.sinks.kafka_sink import KafkaRecordSink
    from txstream.sources.kafka_source import KafkaEventSource

    spark.dataSource.register(KafkaEventSource)
    spark.dataSource.register(KafkaRecordSink)


def source_options(config: RunConfig, timer_file: Path | None, read_tasks: int
                   ) -> SourceOptions:
    """What the coordinator's source is given of its configuration."""
    return SourceOptions(
        kafka=config.kafka,
        half_topic=config.topics.half,
        end_topic=config.topics.end,
        topic_partitions=config.topic_partitions,
        key_layout=config.layout,
        read_tasks=read_tasks,
        max_offsets_per_trigger=config.max_offsets_per_trigger or None,
        timer_file=str(timer_file) if timer_file else None,
        journal_topic=config.topics.history,
        idle_wait_ms=IDLE_WAIT_MS,
        fail_on_data_loss=config.fail_on_data_loss,
    )


def event_stream(spark: Any, config: RunConfig, timer_file: Path | None) -> Any:
    """The half and end topics as a stream of ``EventRow`` (``txstream-events``), with the
    progress time as its watermark; with a ``timer_file``, a batch also runs when a timer in
    it is due."""
    register(spark)
    options = source_options(config, timer_file, spark.sparkContext.defaultParallelism)
    # The progress time of each batch (a PROGRESS row, sources.progress) becomes the query's
    # event-time watermark, which Spark hands to every state key's call of the next batch:
    # how far the end topic has been read (docs/decisions/0022-trusted-time.md).
    return (spark.readStream.format("txstream-events").options(**to_options(options)).load()
            .withWatermark("ends_read", "0 seconds"))


def stateful_outputs(events: Any, function: Callable[..., Any]) -> Any:
    """``function`` run per state key with its state and a processing-time timeout, the keys'
    tallies of each batch observed (``observe``)."""
    from pyspark.sql.streaming.state import GroupStateTimeout

    return (
        events.groupBy("state_key")
        .applyInPandasWithState(function, OUTPUT_SCHEMA, STATE_SCHEMA, "append",
                                GroupStateTimeout.ProcessingTimeTimeout)
        .observe(OBSERVATION, *_observed_metrics())
    )


def record_writer(outputs: Any, config: RunConfig, timer_file: Path | None) -> Any:
    """The ``DataStreamWriter`` of ``outputs`` to Kafka (``txstream-records``), not started;
    with a ``timer_file``, each committed batch folds its keys' timeouts into it. With a
    ``transactional_id`` (:func:`resolve_transactions`) each task writes in a transaction."""
    options = SinkOptions(kafka=config.kafka, timer_file=str(timer_file) if timer_file else None,
                          dead_letter_topic=config.topics.dead_letter,
                          max_message_bytes=config.max_message_bytes,
                          half_topic=config.topics.half,
                          transactional_id=config.transactional_id)
    return (
        outputs.writeStream.format("txstream-records")
        .options(**to_options(options))
        .option("checkpointLocation", config.checkpoint_dir)
        .outputMode("append")
        .queryName(config.query_name)
        .trigger(processingTime=f"{config.trigger_ms} milliseconds")
    )


def build_stream(spark: Any, config: RunConfig, timer_file: Path | None) -> Any:
    """The coordinator's DataStreamWriter, not yet started."""
    from pyspark.sql import functions as F

    function = coordinator_function(config.policy, config.topics, config.kafka,
                                    max_record=config.max_message_bytes)
    outputs = stateful_outputs(event_stream(spark, config, timer_file), function)
    if not config.history:
        outputs = outputs.filter(F.col("kind") != Kind.HISTORY)
    return record_writer(outputs, config, timer_file)


def prepare_checkpoint(spark: Any, config: RunConfig) -> Path:
    """Pin the state-key layout in the checkpoint and bring the driver's timer schedule up to
    its last committed batch; returns the schedule file."""
    checkpoint = Checkpoint(spark, config.checkpoint_dir)
    pin_layout(checkpoint, config.layout)
    return restore_schedule(spark, checkpoint)


def resolve_transactions(spark: Any, config: RunConfig) -> tuple[RunConfig, str | None]:
    """``config`` with its ``--transactions`` choice made (probed once per checkpoint,
    streaming.engine.transactions), and the line that says it (None: made before)."""
    from txstream.kafka.transactions import probe_transactions
    from txstream.streaming.engine.transactions import choose_for_checkpoint, probe_topic

    if config.transactions == "off" or config.transactional_id is not None:
        return config, None
    choice = choose_for_checkpoint(
        spark, config.checkpoint_dir, config.transactions, config.kafka.bootstrap_servers,
        lambda: probe_transactions(config.kafka, probe_topic(config.topics.history)),
        config.topics.half)
    resolved = config.with_(transactions="on" if choice.on else "off",
                            transactional_id=choice.transactional_id)
    return resolved, choice.line


def start_coordinator(spark: Any, config: RunConfig) -> Any:
    """Start the coordinator query on ``spark``; returns the StreamingQuery."""
    config, line = resolve_transactions(spark, config)
    if line is not None:
        log.info("%s", line)
    return build_stream(spark, config, prepare_checkpoint(spark, config)).start()
