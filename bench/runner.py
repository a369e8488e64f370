"""The whole benchmark, phase after phase, on one broker: what ``txstream bench`` runs."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.ceiling import measure_ceiling
from bench.connector import connector_conf, measure_floor_kafka
from bench.coordinator_phases import measure_latency, measure_throughput
from bench.cpu import CpuMeter, cpu_times, steal_pct
from bench.fair import ORDER, WARM_UP_TRANSACTIONS, compare, throughput_run
from bench.floor import batch_cost, measure_floor, rows_per_batch
from bench.harness import Harness
from bench.pending_scale import PointResult, run_point, run_point_isolated
from bench.raw_pipe import PipeResult, run_raw_pipe
from bench.recovery import measure_recovery
from bench.report import ALL_PHASES, PHASES, load_average, machine, targets
from bench.workload import BulkProducer, Workload, create_topics
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, partition_ends, wait_for_broker
from txstream.streaming.engine.config import RunConfig
from txstream.topics import Topics

__all__ = ["BenchOptions", "run_bench", "PHASES", "fresh_workload", "prepare_topics",
           "fixed_cost", "FLOOR_RATE"]

FLOOR_RATE = 50.0  # tx/s of the floor phase when no other phase offered a rate


@dataclass(frozen=True)
class BenchOptions:
    transactions: int = 20_000
    rate: float | None = None  # None: half the measured throughput
    pending: tuple[int, ...] = (10_000, 100_000)
    stores: tuple[str, ...] = ("default",)
    latency_seconds: float = 30.0
    pending_rate: float = 200.0
    pending_seconds: float = 20.0
    unknown_every: int = 10
    idle_seconds: float = 10.0  # the coordinator with no traffic, for the CPU it uses idle
    isolate: bool = True
    point_timeout_s: float = 3600.0
    phases: tuple[str, ...] = PHASES
    recovery_restarts: int = 3


def fresh_workload(tag: str) -> Workload:
    """Names of their own (topics, group) for one phase."""
    prefix = f"{tag}{uuid.uuid4().hex[:8]}_"
    return Workload(Topics.with_prefix(prefix), f"{prefix}group", f"{prefix}real")


def prepare_topics(settings: KafkaSettings, workload: Workload, n: int,
                   partitions: int) -> None:
    """Create the workload's topics and put ``n`` committed transactions in them."""
    create_topics(settings, [*workload.topics.system(), workload.real_topic,
                             workload.topics.check(workload.group)], partitions)
    producer = BulkProducer(settings)
    try:
        producer.send(workload.committed("tp", n))
        producer.flush()
    finally:
        producer.close()


def _raw_pipe(settings: KafkaSettings, n: int, partitions: int,
              say: Callable[[str], None]) -> dict[str, PipeResult]:
    """The raw pipe with 1 and with 2 processes, by the number of processes."""
    out: dict[str, PipeResult] = {}
    for processes in (1, min(2, partitions)):
        if str(processes) in out:
            continue
        workload = fresh_workload("raw")
        prepare_topics(settings, workload, n, partitions)
        result = run_raw_pipe(settings, workload.topics,
                              partition_ends(settings, workload.topics.end), processes)
        out[str(processes)] = result
        say(f"raw pipe, {processes} process(es): {result.tx_per_s:,.0f} tx/s")
    return out


def _empty() -> dict[str, Any]:
    """Every field, unmeasured: a skipped phase leaves its fields null, never missing."""
    none = {"p50": None, "p99": None, "max": None, "count": 0}
    return {"raw_pipe": {}, "raw_pipe_tx_per_s": None, "tx_per_s": None, "ratio": None,
            "ceiling_tx_per_s": None, "ceiling_ratio": None,
            "ceiling_commit_to_visible_ms": dict(none), "ceiling": None,
            "steal_pct": {}, "cpu": {}, "cpu_ratio": None,
            "throughput": None, "offered_tx_per_s": None, "commit_to_visible_ms": dict(none),
            "check_lateness_ms": dict(none), "coordinator_late_ms": dict(none),
            "latency": None, "batch_ms_vs_pending": [], "floor": None, "fixed_cost": None,
            "fair": None, "coordinator_to_ceiling": None, "coordinator_to_ceiling_cpu": None,
            "recovery": None}


def run_bench(config: RunConfig, options: BenchOptions,
              say: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              ) -> dict[str, Any]:
    """Run the phases against ``config.kafka`` (or an embedded broker) and return the figures.

    ``config`` carries the coordinator's settings under test (trigger, buckets, partitions,
    store, batch size, policy); topics and checkpoints are the benchmark's own.
    """
    result: dict[str, Any] = {"machine": machine(), "load_average_start": load_average(),
                              **_empty()}
    if "connector" in options.phases:  # on the class path before the session's JVM starts
        config = connector_conf(config)
    with ExitStack() as stack:
        meter = stack.enter_context(CpuMeter())
        if config.kafka.bootstrap_servers.startswith("embedded:"):
            broker = stack.enter_context(EmbeddedBroker())
            config = config.with_(kafka=KafkaSettings(bootstrap_servers=broker.bootstrap_servers))
        wait_for_broker(config.kafka)
        run: dict[str, Callable[[], None]] = {
            "pipe": lambda: _pipe(config, options, result, meter, say),
            "coordinator": lambda: _coordinator(config, options, result, stack, meter, say),
            "ceiling": lambda: _ceiling(config, options, result, meter, say),
            "floor": lambda: _floor(config, options, result, meter, say),
            "pending": lambda: _pending(config, options, result, say),
            "connector": lambda: _connector(config, options, result, meter, say),
            "recovery": lambda: _recovery(config, options, result, say),
        }
        fair = {"coordinator", "ceiling"} <= set(options.phases)
        for phase in ALL_PHASES:
            if phase in options.phases:
                if fair and phase == "coordinator":
                    _warm_up(config, options, meter, say)
                before = cpu_times()
                run[phase]()
                result["steal_pct"][phase] = steal_pct(before, cpu_times())
                if fair and phase == "ceiling":
                    _fair(config, options, result, meter, say)
        result["load_average_end"] = load_average()
    pipe_cpu, coordinator_cpu = result["cpu"].get("pipe"), result["cpu"].get("coordinator")
    if pipe_cpu and coordinator_cpu and coordinator_cpu["us_per_tx"] > 0:
        result["cpu_ratio"] = pipe_cpu["us_per_tx"] / coordinator_cpu["us_per_tx"]
    result["fixed_cost"] = fixed_cost(result)
    result["config"] = _settings(config, options)
    result["targets"] = targets(result)
    return result


def _settings(config: RunConfig, options: BenchOptions) -> dict[str, Any]:
    """The settings a run measured, as its JSON reports them."""
    return {
        "transactions": options.transactions, "trigger_ms": config.trigger_ms,
        "key_window_ms": config.key_window_ms, "key_shards": config.key_shards,
        "buckets": config.buckets, "shuffle_partitions": config.shuffle_partitions,
        "state_store": config.state_store, "jit": config.jit,
        "max_offsets_per_trigger": config.max_offsets_per_trigger,
        "topic_partitions": config.topic_partitions, "history": config.history,
        "transaction_timeout_ms": config.policy.transaction_timeout,
        "timer_lead_ms": config.policy.timer_lead,
        "unknown_every": options.unknown_every, "pending_rate": options.pending_rate,
        "phases": list(options.phases),
    }


def _pipe(config: RunConfig, options: BenchOptions, result: dict[str, Any], meter: CpuMeter,
          say: Callable[[str], None]) -> None:
    say(f"raw pipe: {options.transactions} transactions, no Spark")
    runs = _raw_pipe(config.kafka, options.transactions, config.topic_partitions, say)
    result["raw_pipe"] = {k: r.tx_per_s for k, r in runs.items()}
    best = max(runs.values(), key=lambda r: r.tx_per_s)
    result["raw_pipe_tx_per_s"] = best.tx_per_s
    result["cpu"]["pipe"] = meter.use(best.started_ms, best.started_ms + best.seconds * 1000,
                                      best.transactions)


def _recovery(config: RunConfig, options: BenchOptions, result: dict[str, Any],
              say: Callable[[str], None]) -> None:
    say(f"recovery: a cold start, then {options.recovery_restarts} SIGKILLs and restarts")
    result["recovery"] = measure_recovery(config.kafka, options.recovery_restarts,
                                          config.topic_partitions, say).as_dict()


def _pending(config: RunConfig, options: BenchOptions, result: dict[str, Any],
             say: Callable[[str], None]) -> None:
    if not options.pending:
        return
    if options.isolate:
        _stop_jvm()  # the points start JVMs of their own: this one would only take memory
    result["batch_ms_vs_pending"] = [
        dataclasses.asdict(p) for p in _pending_curve(config, options, say)
    ]


def _coordinator(config: RunConfig, options: BenchOptions, result: dict[str, Any],
                 stack: ExitStack, meter: CpuMeter, say: Callable[[str], None]) -> None:
    """Throughput over a backlog, then latency and check lateness at a fixed offered rate."""
    n = options.transactions
    workload = fresh_workload("co")
    checkpoint = Path(tempfile.mkdtemp(prefix="txstream-bench-cp-"))
    stack.callback(shutil.rmtree, checkpoint, True)
    cfg = config.with_(topics=workload.topics, checkpoint_dir=checkpoint,
                       query_name=f"bench-{uuid.uuid4().hex[:6]}")
    say(f"coordinator: loading a backlog of {n} committed transactions")
    prepare_topics(config.kafka, workload, n, cfg.topic_partitions)
    harness = Harness(cfg)
    stack.callback(harness.stop)
    say("coordinator: starting; throughput over the backlog")
    tp = measure_throughput(harness, config.kafka, workload, n, timeout_s=max(600, n / 20))
    result["tx_per_s"] = tp.tx_per_s
    if result["raw_pipe_tx_per_s"]:
        result["ratio"] = tp.tx_per_s / result["raw_pipe_tx_per_s"]
    result["throughput"] = dataclasses.asdict(tp)
    result["cpu"]["coordinator"] = meter.use(*tp.span_ms, tp.measured_transactions)
    say(f"coordinator: {tp.tx_per_s:,.0f} tx/s (ratio {result['ratio'] or 0:.2f})")

    rate = options.rate or max(1.0, round(tp.tx_per_s / 2))
    say(f"latency: offering {rate:,.0f} tx/s for {options.latency_seconds:.0f} s")
    lat = measure_latency(harness, config.kafka, workload, rate, options.latency_seconds,
                          options.unknown_every)
    result["cpu"]["coordinator_at_rate"] = meter.use(*lat.offer_span_ms, lat.transactions)
    # With a 0 s trigger and processing-time timeouts Spark runs batches back to back even
    # with no input: what that costs a machine with nothing to do.
    say(f"coordinator: idle for {options.idle_seconds:.0f} s")
    idle_from = time.time() * 1000
    time.sleep(options.idle_seconds)
    result["cpu"]["coordinator_idle"] = meter.use(idle_from, time.time() * 1000, 0)
    harness.stop()
    result["offered_tx_per_s"] = rate
    result["commit_to_visible_ms"] = lat.commit_to_visible_ms
    result["check_lateness_ms"] = lat.check_lateness_ms
    result["coordinator_late_ms"] = lat.coordinator_late_ms
    result["latency"] = dataclasses.asdict(lat)
    say(f"latency: commit->visible p50 {lat.commit_to_visible_ms['p50']} ms, "
        f"check lateness p99 {lat.check_lateness_ms['p99']} ms")


def _ceiling(config: RunConfig, options: BenchOptions, result: dict[str, Any],
             meter: CpuMeter, say: Callable[[str], None]) -> None:
    """The same query and backlog with the core swapped for a forwarder (bench.ceiling)."""
    n = options.transactions
    workload = fresh_workload("ceil")
    say(f"ceiling: loading a backlog of {n} committed transactions")
    prepare_topics(config.kafka, workload, n, config.topic_partitions)
    say("ceiling: the coordinator's query with a forwarding function instead of the core")
    # At the coordinator's offered rate, so that the two latencies compare.
    tp, lat = measure_ceiling(config, workload, n, options.rate or result["offered_tx_per_s"],
                              options.latency_seconds)
    result["ceiling_tx_per_s"] = tp.tx_per_s
    if result["raw_pipe_tx_per_s"]:
        result["ceiling_ratio"] = tp.tx_per_s / result["raw_pipe_tx_per_s"]
    result["ceiling_commit_to_visible_ms"] = lat.commit_to_visible_ms
    result["cpu"]["ceiling"] = meter.use(*tp.span_ms, tp.measured_transactions)
    result["cpu"]["ceiling_at_rate"] = meter.use(*lat.offer_span_ms, lat.transactions)
    result["ceiling"] = {"throughput": dataclasses.asdict(tp), "latency": dataclasses.asdict(lat)}
    say(f"ceiling: {tp.tx_per_s:,.0f} tx/s (ratio {result['ceiling_ratio'] or 0:.2f}); "
        f"commit->visible p50 {lat.commit_to_visible_ms['p50']} ms at "
        f"{lat.offered_tx_per_s:,.0f} tx/s")


def _floor(config: RunConfig, options: BenchOptions, result: dict[str, Any],
           meter: CpuMeter, say: Callable[[str], None]) -> None:
    """Spark's own per-batch cost at the offered rate (bench.floor)."""
    rate, rows = _floor_rows(options, result)
    say(f"floor: a counting applyInPandasWithState between Spark's rate-micro-batch source "
        f"and noop sink, then between Python ones that do no I/O, {rows:,} rows a batch (at "
        f"{rate:,.0f} tx/s), {options.latency_seconds:.0f} s each")
    result["floor"] = {}
    for variant, python_io in (("floor", False), ("floor_python_io", True)):
        floor = measure_floor(config, rows, options.latency_seconds, meter,
                              python_source=python_io, python_sink=python_io)
        result["floor"][variant] = dataclasses.asdict(floor)
        say(f"{variant}: busy batch p50 {floor.batch_ms_p50} ms, {floor.cores} cores, "
            f"{floor.cpu_ms_per_batch} ms CPU per batch")


def _floor_rows(options: BenchOptions, result: dict[str, Any]) -> tuple[float, int]:
    """The offered rate the floor queries stand for, and the rows a batch carries at it."""
    rate = options.rate or result["offered_tx_per_s"] or FLOOR_RATE
    coordinator = _at_rate(result["latency"], result["cpu"].get("coordinator_at_rate"))
    return rate, rows_per_batch(rate, (coordinator or {}).get("batches_per_s"))


def _connector(config: RunConfig, options: BenchOptions, result: dict[str, Any],
               meter: CpuMeter, say: Callable[[str], None]) -> None:
    """The floor's query through Spark's Kafka connector (bench.connector); first, with only
    its source or only its sink a Python one: which of the two the Python API's cost is."""
    rate, rows = _floor_rows(options, result)
    say(f"connector: the floor's query with a Python source only, a Python sink only, then "
        f"between Spark's Kafka source and sink, {rows:,} rows a batch (at {rate:,.0f} tx/s), "
        f"{options.latency_seconds:.0f} s each")
    for variant, source, sink in SPLIT:
        half = measure_floor(config, rows, options.latency_seconds, meter,
                             python_source=source, python_sink=sink)
        result["floor"] = {**(result["floor"] or {}), variant: dataclasses.asdict(half)}
        say(f"{variant}: busy batch p50 {half.batch_ms_p50} ms, {half.cpu_ms_per_batch} ms "
            f"CPU per batch, first batch {half.first_batch_ms} ms")
    floor = measure_floor_kafka(config, rows, options.latency_seconds, meter)
    result["floor"] = {**(result["floor"] or {}), "floor_kafka": dataclasses.asdict(floor)}
    say(f"floor_kafka: busy batch p50 {floor.batch_ms_p50} ms, {floor.cores} cores, "
        f"{floor.cpu_ms_per_batch} ms CPU per batch, first batch {floor.first_batch_ms} ms")


def _at_rate(latency: dict[str, Any] | None, cpu: dict[str, Any] | None
             ) -> dict[str, Any] | None:
    """One query's batches while the rate was offered: their time, its parts, and the CPU
    each cost (the machine's cores less the benchmark's own load, over batches with input)."""
    if not latency:
        return None
    span_s = (latency["offer_span_ms"][1] - latency["offer_span_ms"][0]) / 1000
    busy = latency["batches"] - latency["batches_without_input"]
    cores = None if not cpu else round(cpu["cores"] - latency["load_generator_cores"], 2)
    return {"batch_ms_p50": latency["batch_ms_p50"],
            "batch_parts_ms_p50": latency["batch_parts_ms_p50"], "cores": cores,
            "batches_per_s": round(busy / span_s, 2) if span_s > 0 else None,
            "cpu_ms_per_batch": batch_cost(cores, span_s, busy),
            "commit_to_visible_ms": latency["commit_to_visible_ms"]}


# The floor's query with one Python side: (variant, Python source, Python sink).
SPLIT = (("floor_python_source", True, False), ("floor_python_sink", False, True))
FLOORS = ("floor", "floor_python_io", "floor_python_source", "floor_python_sink", "floor_kafka")


def fixed_cost(result: dict[str, Any]) -> dict[str, Any] | None:
    """Spark's floor, the ceiling (txstream's source and sink) and the coordinator side by
    side at one offered rate: where a near-empty batch's time and CPU go."""
    floors = result["floor"] or {}
    ceiling = _at_rate((result["ceiling"] or {}).get("latency"),
                       result["cpu"].get("ceiling_at_rate"))
    coordinator = _at_rate(result["latency"], result["cpu"].get("coordinator_at_rate"))
    if not (floors or ceiling or coordinator):
        return None
    fields = ("rows_per_batch", "batch_ms_p50", "batch_parts_ms_p50", "cores", "cpu_ms_per_batch",
              "first_batch_ms")
    return {"offered_tx_per_s": result["offered_tx_per_s"],
            **{variant: None if variant not in floors else {k: floors[variant][k] for k in fields}
               for variant in FLOORS},
            "ceiling": ceiling, "coordinator": coordinator,
            "idle_cores": (result["cpu"].get("coordinator_idle") or {}).get("cores")}


def _workload(settings: KafkaSettings, partitions: int) -> Callable[[str, int], Workload]:
    def make(tag: str, n: int) -> Workload:
        workload = fresh_workload(tag)
        prepare_topics(settings, workload, n, partitions)
        return workload
    return make


def _warm_up(config: RunConfig, options: BenchOptions, meter: CpuMeter,
             say: Callable[[str], None]) -> None:
    """Both queries once on a short backlog, so that neither is measured in a cold JVM."""
    n = min(WARM_UP_TRANSACTIONS, options.transactions)
    say(f"warm-up: coordinator and ceiling on {n:,} transactions each")
    for query in ("coordinator", "ceiling"):
        throughput_run(config, query, n, meter, _workload(config.kafka, config.topic_partitions))


def _fair(config: RunConfig, options: BenchOptions, result: dict[str, Any], meter: CpuMeter,
          say: Callable[[str], None]) -> None:
    """The coordinator against its ceiling, warm, in the order of ``bench.fair.ORDER``."""
    runs = []
    for query in ORDER:
        run = throughput_run(config, query, options.transactions, meter,
                             _workload(config.kafka, config.topic_partitions))
        say(f"fair comparison: {query} {run.tx_per_s:,.0f} tx/s, "
            f"{run.us_per_tx or 0:,.0f} us CPU per transaction")
        runs.append(run)
    result["fair"] = compare(runs)
    result["coordinator_to_ceiling"] = result["fair"]["coordinator_to_ceiling"]
    result["coordinator_to_ceiling_cpu"] = result["fair"]["coordinator_to_ceiling_cpu"]
    say(f"fair comparison: coordinator/ceiling {result['coordinator_to_ceiling']} by tx/s, "
        f"{result['coordinator_to_ceiling_cpu']} by CPU per transaction")


def _stop_jvm() -> None:
    from pyspark.sql import SparkSession

    from txstream.streaming.engine.session import stop_spark

    spark = SparkSession.getActiveSession()
    if spark is not None:
        stop_spark(spark)


def _pending_curve(config: RunConfig, options: BenchOptions,
                   say: Callable[[str], None]) -> list[PointResult]:
    points = []
    for store in options.stores:
        for pending in options.pending:
            cfg = config.with_(state_store=store)
            say(f"pending: {pending:,} held, {store} store"
                + (" (own process)" if options.isolate else ""))
            started = time.monotonic()
            if options.isolate:
                point = run_point_isolated(cfg, pending, options.pending_rate,
                                           options.pending_seconds, options.point_timeout_s)
            else:
                point = run_point(cfg, pending, options.pending_rate, options.pending_seconds,
                                  options.point_timeout_s)
            say(f"pending: {pending:,} {store}: busy batch p50 {point.busy_batch_ms_p50} ms, "
                f"RSS {point.rss_mb:,.0f} MB ({time.monotonic() - started:.0f} s)"
                + (f"; failed: {point.error}" if point.error else ""))
            points.append(point)
    return points
