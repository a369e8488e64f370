"""How a fresh coordinator settles: micro-batch time and JIT-compiler CPU, minute by minute.

``python -m bench.warmup [--minutes 8] [--rate 1000] [any flag of txstream run, e.g. --jit]``

Starts its own broker and a coordinator on fresh topics, offers ``--rate`` committed tx/s the
way the client library sends them, and prints per minute: the busy micro-batches' p50/p90
duration, the cores the JVM used, and of them the cores its just-in-time compiler threads
used. ``txstream bench`` measures a JVM in its first two minutes; this shows how much of
that is the JVM warming up, and what is left once it has (compare ``--jit c1`` and
``--jit tiered``).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.batches import percentile
from bench.coordinator_phases import Offered, offer_load
from bench.harness import Harness
from bench.procmem import spark_jvm_pid, thread_cpu_s
from bench.runner import fresh_workload, prepare_topics
from streaming.config import add_run_arguments, config_from_args
from txstream.broker import EmbeddedBroker

__all__ = ["main", "jvm_cpu_s"]


def jvm_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds so far of the JVM ``pid`` and of its live JIT compiler threads."""
    total, threads = thread_cpu_s(pid)
    return total, sum(v for name, v in threads.items()
                      if name.startswith(("C1 CompilerThre", "C2 CompilerThre")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=8)
    parser.add_argument("--rate", type=float, default=1000.0, help="committed tx/s offered")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        config = config_from_args(args, broker.bootstrap_servers)
        workload = fresh_workload("wu")
        prepare_topics(config.kafka, workload, 0, config.topic_partitions)
        cfg = config.with_(topics=workload.topics,
                           checkpoint_dir=Path(tempfile.mkdtemp(prefix="txstream-warmup-")))
        harness = Harness(cfg).start()
        pid = spark_jvm_pid()
        assert pid is not None and harness.log is not None
        offer = threading.Thread(
            target=offer_load, daemon=True,
            args=(config.kafka, workload, args.rate, args.minutes * 60.0, 0, Offered()))
        offer.start()
        print(f"jit {cfg.jit}, {args.rate:,.0f} tx/s offered")
        print(f"{'minute':>6}  {'batches':>7}  {'p50 ms':>7}  {'p90 ms':>7}  "
              f"{'JVM cores':>9}  {'JIT cores':>9}")
        try:
            for minute in range(args.minutes):
                mark = harness.log.mark()
                cpu, jit = jvm_cpu_s(pid)
                time.sleep(60)
                cpu_after, jit_after = jvm_cpu_s(pid)
                busy = [b.duration_ms for b in harness.log.of(cfg.query_name, mark)
                        if b.input_rows]
                p50, p90 = percentile(busy, 0.5), percentile(busy, 0.9)
                print(f"{minute + 1:>6}  {len(busy):>7}  {p50 or 0:>7.0f}  {p90 or 0:>7.0f}  "
                      f"{(cpu_after - cpu) / 60:>9.2f}  {(jit_after - jit) / 60:>9.2f}",
                      flush=True)
                failure = harness.coordinator.failure()
                if failure:
                    print(f"coordinator failed: {failure}", file=sys.stderr)
                    return 1
        finally:
            harness.stop()
            shutil.rmtree(cfg.checkpoint_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
