"""The ceiling phase: the coordinator's query with txstream's own logic taken out.

The same streaming query as the coordinator (``txstream-events`` source,
``groupBy(state_key).applyInPandasWithState`` with a processing-time timeout, observed counters,
``txstream-records`` sink, same session and settings) over the same backlog, with the core
swapped for a function that only forwards each commit to the real topic as a message of the
workload's body size: no decoding, no state, no timers, no history. Its throughput is what
Spark, pyspark and the Kafka client cost by themselves in this design, so
``ceiling_tx_per_s / raw_pipe_tx_per_s`` bounds the ``ratio`` any core could reach on this
machine; its commit → visible latency at the coordinator's offered rate is the floor of the
coordinator's.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from bench.coordinator_phases import (
    LatencyResult,
    ThroughputResult,
    measure_latency,
    measure_throughput,
)
from bench.harness import Harness
from bench.workload import Workload
from txstream.schema import EventKind, Kind, OutputRow
from txstream.state.bucket import Bucket
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator
from txstream.streaming.engine.key_metrics import Counted, KeyTally
from txstream.streaming.engine.operator import in_replay_order, output_frame
from txstream.streaming.engine.query import (
    event_stream,
    prepare_checkpoint,
    record_writer,
    stateful_outputs,
)
from txstream.streaming.engine.records import (
    coordinator_tag,
    output_rows,
    record_id,
    timer_row,
)
from txstream.topics import Topics
from txstream.wire import H, pack_headers

__all__ = ["forwarding_function", "ForwardingCoordinator", "measure_ceiling"]



def forwarding_function(real_topic: str, topics: Topics, body_bytes: int
                        ) -> Callable[[tuple[Any, ...], Iterator[pd.DataFrame], Any],
                                      Iterator[pd.DataFrame]]:
    """A stand-in for the coordinator's function: each end record goes to ``real_topic`` at
    once, with a body of ``body_bytes`` and the end's headers plus the transaction id and a
    record id (about what a release carries); half messages are read and dropped, nothing is
    kept. Only for workloads that commit every transaction."""
    tag = coordinator_tag(topics)
    body = b"\0" * body_bytes

    def forward(key: tuple[Any, ...], frames: Iterator[pd.DataFrame],
                state: Any) -> Iterator[pd.DataFrame]:
        now = int(state.getCurrentProcessingTimeMs())
        ends = [(k, h) for kind, _p, _o, k, _v, h, error, _t in in_replay_order(frames)
                if kind == EventKind.END and error is None and k]
        if not ends:
            return
        rows = []
        tally = KeyTally(now)
        for number, (k, h) in enumerate(ends):
            rid = record_id(tag, int(key[0]), now, number)
            headers = h + pack_headers(((H.TRANSACTION_ID, k), (H.RECORD_ID, rid.encode())))
            rows.append(OutputRow(Kind.VISIBLE, real_topic, k, body, headers, rid, now, None,
                                  None, None))
            tally.count(Counted.COMMITS, None, real_topic)
        # The batch log counts releases from the keys' tallies, as the coordinator's.
        rows += output_rows([timer_row(int(key[0]), None, tally.summary(int(key[0]), Bucket()))],
                            [None], now)
        yield output_frame(rows)

    return forward


class ForwardingCoordinator(Coordinator):
    """The coordinator's query, session and life cycle, with :func:`forwarding_function`
    for the core."""

    def __init__(self, config: RunConfig, workload: Workload) -> None:
        super().__init__(config)
        self.workload = workload

    def start_query(self, spark: Any) -> Any:
        w = self.workload
        function = forwarding_function(w.real_topic, w.topics, w.body_bytes)
        timers = prepare_checkpoint(spark, self.config)
        outputs = stateful_outputs(event_stream(spark, self.config, timers), function)
        return record_writer(outputs, self.config, timers).start()


def measure_ceiling(config: RunConfig, workload: Workload, n: int, rate: float | None,
                    seconds: float
                    ) -> tuple[ThroughputResult, LatencyResult]:
    """The stand-in's throughput over ``workload``'s backlog of ``n`` committed transactions
    (already in its topics), then its commit → visible latency at ``rate`` tx/s (None: half
    its throughput) for ``seconds``, both measured as the coordinator's are."""
    checkpoint = Path(tempfile.mkdtemp(prefix="txstream-bench-ceiling-"))
    cfg = config.with_(topics=workload.topics, checkpoint_dir=checkpoint,
                       query_name=f"ceiling-{uuid.uuid4().hex[:6]}")
    harness = Harness(cfg, lambda c: ForwardingCoordinator(c, workload))
    try:
        tp = measure_throughput(harness, config.kafka, workload, n, timeout_s=max(600, n / 20))
        offered = rate or max(1.0, round(tp.tx_per_s / 2))
        # Every transaction commits: the stand-in answers no check.
        return tp, measure_latency(harness, config.kafka, workload, offered, seconds, 0)
    finally:
        harness.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
