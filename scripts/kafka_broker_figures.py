"""The figures of Apache Kafka as txstream starts it (docs/operations.md): start to ready for
1 and 3 nodes, each node's memory once idle, and the time to stop.

    .venv/bin/python scripts/kafka_broker_figures.py [--runs 3] [--jvm-option OPT ...]

Each run starts a cluster, waits 10 s idle, reads each node's RSS (/proc) and stops it. A
``--jvm-option`` replaces the default JVM options (txstream.kafka_node.JVM_OPTIONS).
"""

from __future__ import annotations

import argparse
import statistics
import time

from txstream.kafka_broker import KafkaBroker
from txstream.kafka_node import JVM_OPTIONS


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def one_run(nodes: int, options: tuple[str, ...]) -> tuple[float, list[float], float]:
    broker = KafkaBroker(nodes=nodes, jvm_options=options)
    started = time.monotonic()
    broker.start()
    ready = time.monotonic() - started
    time.sleep(10)
    rss = [rss_mib(pid) for pid in broker.pids if pid is not None]
    stopping = time.monotonic()
    broker.stop()
    return ready, rss, time.monotonic() - stopping


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--jvm-option", action="append", default=None)
    args = parser.parse_args()
    options = tuple(args.jvm_option) if args.jvm_option else JVM_OPTIONS
    print("JVM options:", " ".join(options))
    for nodes in args.nodes:
        runs = [one_run(nodes, options) for _ in range(args.runs)]
        ready = [r[0] for r in runs]
        rss = [m for r in runs for m in r[1]]
        stop = [r[2] for r in runs]
        print(f"{nodes} node(s): ready in {statistics.median(ready):.1f} s (median of "
              f"{len(ready)}: {', '.join(f'{s:.1f}' for s in ready)}); RSS per node idle "
              f"{min(rss):.0f}-{max(rss):.0f} MiB; stop {statistics.median(stop):.1f} s",
              flush=True)


if __name__ == "__main__":
    main()
