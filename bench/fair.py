"""The coordinator against its ceiling, on equal terms: both warm, in an A-B-B-A order.

A query measured first runs in a cold JVM, and this VM's speed drifts over minutes: a single
run of each favours whichever runs second. So both queries first run a short warm-up backlog
in the session (JIT, Python workers, the first plans), then the throughput of each is taken
twice in the order coordinator, ceiling, ceiling, coordinator, so that a drift weighs on both
alike. Each run is on a fresh backlog, topics and checkpoint; its CPU per transaction (the
whole machine's, steal excluded: :mod:`bench.cpu`) is kept beside its rate, since CPU moves
least with the VM.

``coordinator_to_ceiling`` is the ratio of the two mean rates; ``..._cpu`` the ratio of the
ceiling's CPU per transaction to the coordinator's (1.0: the core costs nothing).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from statistics import mean
from typing import Any

from bench.ceiling import ForwardingCoordinator
from bench.coordinator_phases import ThroughputResult, measure_throughput
from bench.cpu import CpuMeter
from bench.harness import Harness
from bench.workload import Workload
from txstream.streaming.engine.config import RunConfig
from txstream.streaming.engine.coordinator import Coordinator

__all__ = ["ORDER", "WARM_UP_TRANSACTIONS", "Run", "throughput_run", "compare"]

ORDER = ("coordinator", "ceiling", "ceiling", "coordinator")
WARM_UP_TRANSACTIONS = 2_000


@dataclasses.dataclass(frozen=True)
class Run:
    """One throughput run of one query."""

    query: str  # "coordinator" or "ceiling"
    tx_per_s: float
    us_per_tx: float | None
    throughput: ThroughputResult


def throughput_run(config: RunConfig, query: str, n: int, meter: CpuMeter,
                   workload_for: Callable[[str, int], Workload]) -> Run:
    """Start ``query`` on a fresh backlog of ``n`` committed transactions, time their release,
    stop it. ``workload_for(tag, n)`` makes the topics and fills them."""
    workload = workload_for("fair", n)
    checkpoint = Path(tempfile.mkdtemp(prefix="txstream-bench-fair-"))
    cfg = config.with_(topics=workload.topics, checkpoint_dir=checkpoint,
                       query_name=f"{query}-{uuid.uuid4().hex[:6]}")
    make: Callable[[RunConfig], Coordinator] = (
        Coordinator if query == "coordinator"
        else (lambda c: ForwardingCoordinator(c, workload)))
    harness = Harness(cfg, make)
    try:
        tp = measure_throughput(harness, config.kafka, workload, n, timeout_s=max(600, n / 20))
    finally:
        harness.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    cpu = meter.use(*tp.span_ms, tp.measured_transactions)
    return Run(query, tp.tx_per_s, cpu["us_per_tx"] if cpu else None, tp)


def compare(runs: list[Run]) -> dict[str, Any]:
    """The fair comparison's fields for the JSON, from the runs of :data:`ORDER`."""
    def of(query: str, field: str) -> list[float]:
        return [getattr(r, field) for r in runs if r.query == query
                and getattr(r, field) is not None]

    rates = {q: of(q, "tx_per_s") for q in ("coordinator", "ceiling")}
    cpus = {q: of(q, "us_per_tx") for q in ("coordinator", "ceiling")}
    out: dict[str, Any] = {
        "order": [r.query for r in runs],
        "tx_per_s": {q: [round(x, 1) for x in v] for q, v in rates.items()},
        "us_per_tx": {q: [round(x, 1) for x in v] for q, v in cpus.items()},
        "coordinator_to_ceiling": None, "coordinator_to_ceiling_cpu": None,
    }
    if rates["coordinator"] and rates["ceiling"]:
        out["coordinator_to_ceiling"] = round(mean(rates["coordinator"])
                                              / mean(rates["ceiling"]), 3)
    if cpus["coordinator"] and cpus["ceiling"]:
        out["coordinator_to_ceiling_cpu"] = round(mean(cpus["ceiling"])
                                                  / mean(cpus["coordinator"]), 3)
    return out
