"""How fast and how late: sustained throughput, commit -> visible latency, back-check lateness.

Throughput: N committed transactions are in the half and end topics before the query starts;
the rate is taken from the visible records' timestamps (the sink's send time), from the end of
the first micro-batch that released anything to the last visible record, so the cold start
(Python workers, first planning) is not counted and the count matches the time span.

Latency: a producer offers a fixed rate like the client library does (acks=all, idempotent),
and a consumer on the real topic notes when each released message arrives. One transaction in
``unknown_every`` answers UNKNOW instead of committing; its first back-check must come
``transaction_timeout`` after it was born, and how much later it came is its lateness.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from bench.batches import parts_p50, percentile
from bench.harness import BenchFailed, Harness
from bench.workload import RecordWatcher, Workload, now_ms
from txstream.kafka import KafkaSettings, make_producer, partition_ends, read_topic
from txstream.message import Decision
from txstream.outputs import decode_history
from txstream.state.effects import NoteKind
from txstream.wire import H

__all__ = ["ThroughputResult", "LatencyResult", "measure_throughput", "measure_latency",
           "summary", "Offered", "offer_load"]


def summary(values: list[float]) -> dict[str, float | int | None]:
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99),
            "max": max(values) if values else None, "count": len(values)}


@dataclass
class ThroughputResult:
    transactions: int
    tx_per_s: float
    measured_transactions: int
    measured_seconds: float
    batches: int
    batch_ms_p50: float | None
    batch_parts_ms_p50: dict[str, float | None]
    span_ms: tuple[float, float]  # the measured span, wall clock (for bench.cpu)


def _header(record: Any, name: str) -> str | None:
    for key, value in record.headers:
        if key == name:
            return bytes(value).decode("utf-8", "replace")
    return None


def measure_throughput(harness: Harness, settings: KafkaSettings, workload: Workload,
                       n: int, timeout_s: float) -> ThroughputResult:
    """Start ``harness`` on a backlog of ``n`` committed transactions; time their release.

    The visible records are read after the run, not during it: a consumer running alongside
    would take CPU from the coordinator that the raw pipe's figure never pays.
    """
    harness.start()
    harness.wait(lambda: harness.total("released") >= n, timeout_s,
                 f"{n} released transactions")
    stamps = [int(rec.timestamp) for rec in read_topic(settings, workload.real_topic, 60)]
    if len(stamps) < n:
        raise BenchFailed(f"{n} released but only {len(stamps)} visible records found")
    batches = [b for b in harness.batches if b.input_rows]
    first = next(b for b in harness.batches if b.released)
    ordered = sorted(stamps)
    n0 = first.released
    if n0 < len(ordered):
        span_ms = (float(ordered[n0 - 1]), float(ordered[-1]))
        measured = len(ordered) - n0
    else:  # all released by one batch (a small N): its duration is the only span there is
        span_ms = (ordered[-1] - first.duration_ms, float(ordered[-1]))
        measured = len(ordered)
    span_s = (span_ms[1] - span_ms[0]) / 1000
    return ThroughputResult(
        transactions=n,
        tx_per_s=measured / span_s if span_s > 0 else 0.0,
        measured_transactions=measured,
        measured_seconds=span_s,
        batches=len(batches),
        batch_ms_p50=percentile([b.duration_ms for b in batches[1:]], 0.5),
        batch_parts_ms_p50=parts_p50(batches[1:]),
        span_ms=span_ms,
    )


@dataclass
class LatencyResult:
    offered_tx_per_s: float
    seconds: float
    transactions: int  # offered: committed and unknown
    committed: int
    visible: int
    commit_to_visible_ms: dict[str, Any]
    checks: int
    check_lateness_ms: dict[str, Any]
    coordinator_late_ms: dict[str, Any]
    batch_ms_p50: float | None
    batch_parts_ms_p50: dict[str, float | None]
    offer_span_ms: tuple[float, float]  # when the load was offered, wall clock (for bench.cpu)
    # CPUs this process (the load's producer, the reader of what comes back) kept busy meanwhile:
    # part of the machine's CPU at the offered rate that is the benchmark's, not the query's.
    load_generator_cores: float
    missing: list[str] = field(default_factory=list)
    batches: int = 0  # micro-batches from the offer's start until everything came back
    batches_without_input: int = 0  # of which ran only for timers


class Offered:
    """What the latency phase sent and what came back, keyed by transaction id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.born: dict[str, int] = {}
        self.acked: dict[str, float] = {}
        self.visible: dict[str, float] = {}
        self.checks: dict[str, int] = {}  # txid -> timestamp of its first check
        self.unknown: set[str] = set()

    def on_record(self, rec: Any, at: float) -> None:
        txid = _header(rec, H.TRANSACTION_ID)
        with self.lock:
            if txid is not None:  # a visible record: only they carry the transaction id header
                self.visible.setdefault(txid, at)
            elif _header(rec, H.CHECK_TIMES) == "1" and rec.key is not None:
                self.checks.setdefault(rec.key.decode(), int(rec.timestamp))


def offer_load(settings: KafkaSettings, workload: Workload, rate: float, seconds: float,
               unknown_every: int, offered: Offered) -> None:
    """Send ``rate`` transactions a second for ``seconds``, recording them in ``offered``."""
    # As the client library (acks=all, idempotent). The latency is counted from the commit's
    # acknowledgement, so batching the sends for 10 ms does not bias it; it only keeps this load
    # generator's own CPU, on the coordinator's two cores, small.
    producer = make_producer(settings, linger_ms=10)
    total = max(1, int(rate * seconds))
    started = time.perf_counter()
    try:
        i = 0
        while i < total:
            # Paced in 10 ms ticks: a sleep per transaction is thousands of wake-ups a second.
            due = min(total, int((time.perf_counter() - started) * rate) + 1)
            while i < due:
                _offer_one(producer, workload, i, unknown_every, offered)
                i += 1
            time.sleep(0.01)
        producer.flush(timeout=60)
    finally:
        producer.close(timeout=10)


def _offer_one(producer: Any, workload: Workload, i: int, unknown_every: int,
               offered: Offered) -> None:
    txid = workload.txid("lat", i)
    born = now_ms()
    half = workload.half(txid, born)
    unknown = unknown_every > 0 and i % unknown_every == unknown_every - 1
    end = workload.end(txid, Decision.UNKNOW if unknown else Decision.COMMIT_MESSAGE)
    with offered.lock:
        offered.born[txid] = born
        if unknown:
            offered.unknown.add(txid)
    producer.send(half.topic, key=half.key, value=half.value, headers=list(half.headers))
    future = producer.send(end.topic, key=end.key, value=end.value, headers=list(end.headers))
    if not unknown:
        def acked(_meta: Any, txid: str = txid) -> None:
            at = time.time() * 1000
            with offered.lock:
                offered.acked[txid] = at
        future.add_callback(acked)


def _coordinator_lateness(settings: KafkaSettings, workload: Workload, start: dict[int, int],
                          txids: set[str]) -> list[float]:
    """``late_ms`` of the first ``check_sent`` note of each transaction, from the history."""
    out = []
    for rec in read_topic(settings, workload.topics.history, 60, start):
        for note in decode_history(rec.value, rec.key):
            if (note.get("transaction_id") in txids and note.get("event") == NoteKind.CHECK_SENT
                    and note.get("check") == 1):
                out.append(float(note["late_ms"]))  # type: ignore[arg-type]
    return out


def measure_latency(harness: Harness, settings: KafkaSettings, workload: Workload,
                    rate: float, seconds: float, unknown_every: int) -> LatencyResult:
    """Offer ``rate`` tx/s for ``seconds`` to the running coordinator of ``harness``."""
    timeout_ms = harness.config.policy.transaction_timeout
    offered = Offered()
    history_start = partition_ends(settings, workload.topics.history)
    check_topic = workload.topics.check(workload.group)
    reader = RecordWatcher(settings, [workload.real_topic, check_topic], offered.on_record)
    mark = harness.log.mark() if harness.log else 0
    reader.start()
    try:
        offer_started, own_cpu = now_ms(), time.process_time()
        offer_load(settings, workload, rate, seconds, unknown_every, offered)
        offer_span_ms = (float(offer_started), float(now_ms()))
        own_cores = (time.process_time() - own_cpu) * 1000 / max(1.0, offer_span_ms[1]
                                                                 - offer_span_ms[0])
        committed = set(offered.born) - offered.unknown

        def done() -> bool:
            with offered.lock:
                return committed <= offered.visible.keys() and offered.unknown <= set(
                    offered.checks)

        # The last unknown transaction is checked transaction_timeout after it was born.
        try:
            harness.wait(done, timeout_ms / 1000 + 60, "released messages and first checks")
        except BenchFailed:
            if harness.coordinator.failure():
                raise
    finally:
        reader.stop()
    with offered.lock:
        latencies = [offered.visible[t] - offered.acked[t] for t in committed
                     if t in offered.visible and t in offered.acked]
        lateness = [offered.checks[t] - (offered.born[t] + timeout_ms)
                    for t in offered.unknown if t in offered.checks]
        missing = sorted((committed - offered.visible.keys())
                         | (offered.unknown - offered.checks.keys()))
    coordinator_late = _coordinator_lateness(settings, workload, history_start, offered.unknown)
    assert harness.log is not None
    batches = [b for b in harness.log.of(harness.config.query_name, mark)]
    return LatencyResult(
        offered_tx_per_s=rate,
        seconds=seconds,
        transactions=len(offered.born),
        committed=len(committed),
        visible=len(committed) - len([t for t in missing if t in committed]),
        commit_to_visible_ms=summary(latencies),
        checks=len(lateness),
        check_lateness_ms=summary(lateness),
        coordinator_late_ms=summary(coordinator_late),
        batch_ms_p50=percentile([b.duration_ms for b in batches], 0.5),
        batch_parts_ms_p50=parts_p50([b for b in batches if b.input_rows]),
        offer_span_ms=offer_span_ms,
        load_generator_cores=round(own_cores, 2),
        missing=missing[:10],
        batches=len(batches),
        batches_without_input=sum(1 for b in batches if not b.input_rows),
    )
