"""How big: micro-batch time and memory with P pending transactions held in state.

A point: P half messages with a check immunity far beyond the run (so no timer fires and
each stays pending) are loaded into a fresh coordinator; then a fixed rate of committed
transactions is offered, and the durations of its micro-batches are taken (the busy ones, which
read input, and any idle ones), with the RSS of the Spark JVM and every Python process under
it. Idle, no timer is due, so no batch should run (txstream.timer_schedule); before the timer
schedule, idle batches ran back to back, each scanning every key's timeout.

Each point runs in its own process by default (``python -m bench.pending_scale``): a JVM's heap
only grows, so the memory of a point measured after a bigger one would be the bigger one's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.batches import parts_p50, percentile
from bench.coordinator_phases import measure_latency
from bench.cpu import cpu_times, steal_pct
from bench.harness import Harness
from bench.workload import BulkProducer, Workload, create_topics
from txstream.kafka import KafkaSettings
from txstream.streaming.engine.config import RunConfig
from txstream.topics import Topics

__all__ = ["PointResult", "run_point", "run_point_isolated", "IMMUNITY_S"]

IMMUNITY_S = 6 * 3600  # first check of a loaded transaction: far after the run ends
# RunConfig fields a point sets itself or rebuilds from the spec.
_NOT_PASSED = {"kafka", "topics", "policy", "checkpoint_dir", "query_name"}


@dataclass
class PointResult:
    pending: int
    state_store: str
    load_seconds: float
    busy_batch_ms_p50: float | None
    idle_batch_ms_p50: float | None
    busy_batches: int
    idle_batches: int
    rows_per_busy_batch: float | None
    commit_to_visible_ms_p50: float | None
    rss_mb: float
    state_memory_mb: float
    # CPU seconds of the JVM and its Python workers per busy batch: the work a batch costs,
    # which the machine's other load does not inflate as it does wall time.
    cpu_ms_per_busy_batch: float | None = None
    # The hypervisor's share of the machine's CPU while the rate was offered (bench.cpu): a
    # point whose batches grew with it ran on a slower machine, not on more state.
    steal_pct: float | None = None
    # The median of each part of Spark's durationMs over the busy batches (latestOffset is
    # the source's high-watermark fetch; addBatch the read, the operator and the sink).
    busy_batch_parts_ms_p50: dict[str, float | None] | None = None
    # The JVM's heap after a full collection at the end (bench.procmem.live_heap_mb): what
    # holding the pending transactions costs, where RSS keeps the loading's peak.
    live_heap_mb: float | None = None
    error: str | None = None


def _load(settings: KafkaSettings, workload: Workload, pending: int) -> None:
    producer = BulkProducer(settings)
    born = int(time.time() * 1000)
    chunk = 20_000
    try:
        for start in range(0, pending, chunk):
            producer.send(workload.half(workload.txid("held", i), born, IMMUNITY_S)
                          for i in range(start, min(pending, start + chunk)))
        producer.flush()
    finally:
        producer.close()


def run_point(config: RunConfig, pending: int, rate: float, seconds: float,
              load_timeout_s: float = 3600) -> PointResult:
    """One point, in this process; ``config`` names the broker, store and other settings."""
    settings = config.kafka
    prefix = f"p{uuid.uuid4().hex[:8]}_"
    workload = Workload(Topics.with_prefix(prefix), "bench-held", f"{prefix}real")
    checkpoint = Path(tempfile.mkdtemp(prefix="txstream-bench-cp-"))
    cfg = config.with_(topics=workload.topics, checkpoint_dir=checkpoint,
                       query_name=f"bench-pending-{prefix}")
    create_topics(settings, [*workload.topics.system(), workload.real_topic,
                             workload.topics.check(workload.group)], cfg.topic_partitions)
    _load(settings, workload, pending)
    harness = Harness(cfg)
    try:
        started = time.monotonic()
        harness.start()
        harness.wait(lambda: harness.total("input_rows") >= pending, load_timeout_s,
                     f"{pending} pending transactions loaded")
        load_s = time.monotonic() - started
        assert harness.log is not None
        mark = harness.log.mark()
        time.sleep(3)  # idle: nothing is due, so no batch should run
        idle = [b.duration_ms for b in harness.log.of(cfg.query_name, mark) if not b.input_rows]
        mark = harness.log.mark()
        cpu_before, machine_before = harness.cpu_s(), cpu_times()
        latency = measure_latency(harness, settings, workload, rate, seconds, unknown_every=0)
        cpu, machine_after = harness.cpu_s() - cpu_before, cpu_times()
        after = harness.log.of(cfg.query_name, mark)
        busy = [b for b in after if b.input_rows]
        last = harness.batches[-1]
        return PointResult(
            pending=pending,
            state_store=cfg.state_store,
            load_seconds=load_s,
            busy_batch_ms_p50=percentile([b.duration_ms for b in busy], 0.5),
            idle_batch_ms_p50=percentile(idle, 0.5),
            busy_batches=len(busy),
            idle_batches=len(idle),
            rows_per_busy_batch=(sum(b.input_rows for b in busy) / len(busy)) if busy else None,
            commit_to_visible_ms_p50=latency.commit_to_visible_ms["p50"],
            rss_mb=harness.rss_mb(),
            state_memory_mb=last.state_memory_bytes / 2**20,
            # Idle batches in the window cost CPU too; spread over the batches that had input.
            cpu_ms_per_busy_batch=cpu * 1000 / len(busy) if busy else None,
            steal_pct=steal_pct(machine_before, machine_after),
            busy_batch_parts_ms_p50=parts_p50(busy),
            live_heap_mb=harness.live_heap_mb(),
        )
    finally:
        harness.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)


def run_point_isolated(config: RunConfig, pending: int, rate: float, seconds: float,
                       timeout_s: float) -> PointResult:
    """:func:`run_point` in a fresh Python process (and so a fresh JVM)."""
    spec = {
        "bootstrap_servers": config.kafka.bootstrap_servers,
        "config": {k: v for k, v in dataclasses.asdict(config.policy).items()},
        # Every plain setting of the config under test (a field left out here would silently
        # fall back to its default in the point's process).
        "run": {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                if f.name not in _NOT_PASSED},
        "pending": pending, "rate": rate, "seconds": seconds,
    }
    try:
        proc = subprocess.run([sys.executable, "-m", "bench.pending_scale", json.dumps(spec)],
                              capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _failed(pending, config.state_store, f"no result within {timeout_s:.0f}s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return PointResult(**json.loads(line))
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return _failed(pending, config.state_store,
                   f"exit code {proc.returncode}: {' | '.join(tail)[:400]}")


def _failed(pending: int, store: str, why: str) -> PointResult:
    return PointResult(pending, store, 0.0, None, None, 0, 0, None, None, 0.0, 0.0, error=why)


def main(argv: list[str] | None = None) -> int:
    from txstream.state.policy import Policy

    parser = argparse.ArgumentParser(description="one point of txstream bench's pending curve")
    parser.add_argument("spec", help="JSON written by run_point_isolated")
    spec: dict[str, Any] = json.loads(parser.parse_args(argv).spec)
    config = RunConfig(kafka=KafkaSettings(bootstrap_servers=spec["bootstrap_servers"]),
                       policy=Policy(**spec["config"]), **spec["run"])
    try:
        result = run_point(config, spec["pending"], spec["rate"], spec["seconds"])
    except Exception as exc:  # reported to the parent as this point's error
        result = _failed(spec["pending"], config.state_store, f"{type(exc).__name__}: {exc}")
    print(json.dumps(dataclasses.asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
