"""How the test broker's cost per fetch grows with what a partition holds.

``python -m bench.broker_tail [--held 0,100000,1000000] [--rounds 50]``

The pending curve loads up to a million half messages into the half topic and then measures
the coordinator reading a few hundred new records per micro-batch at the tail. If the broker's
own cost of a tail fetch grows with the log, part of that curve is the broker's, not the
coordinator's. This reads the tail the way the source does (one offsets fetch, then the new
records from their offsets), ``--rounds`` times per point, with 100 new records per round,
and prints the wall time and the broker's CPU per round at each number of held records.
"""

from __future__ import annotations

import argparse
import sys
import time

from bench.procmem import tree_cpu_s
from bench.workload import BulkProducer, Workload, create_topics
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, make_consumer
from txstream.topics import Topics

__all__ = ["tail_rounds"]

PER_ROUND = 100


def tail_rounds(settings: KafkaSettings, workload: Workload, producer: BulkProducer,
                rounds: int) -> float:
    """Seconds for ``rounds`` of (offsets fetch, produce PER_ROUND, read them back)."""
    from kafka import TopicPartition

    reader = make_consumer(settings, fetch_max_wait_ms=5)
    offsets = make_consumer(settings, fetch_max_wait_ms=1, max_partition_fetch_bytes=1)
    tps = [TopicPartition(workload.topics.half, p) for p in (0, 1)]
    reader.assign(tps)
    last = {tp: 0 for tp in tps}
    began = time.monotonic()
    try:
        for _ in range(rounds):
            offsets.assign([])
            offsets.assign(tps)
            for tp in tps:
                offsets.seek(tp, last[tp])
            while any(offsets.highwater(tp) is None for tp in tps):
                offsets.poll(timeout_ms=20, max_records=1)
            last = {tp: offsets.highwater(tp) for tp in tps}
            born = int(time.time() * 1000)
            producer.send(workload.half(workload.txid("tail", i), born) for i in range(PER_ROUND))
            producer.flush()
            for tp in tps:
                reader.seek(tp, last[tp])
            got, deadline = 0, time.monotonic() + 10
            while got < PER_ROUND and time.monotonic() < deadline:
                got += sum(len(v) for v in reader.poll(timeout_ms=20).values())
        return time.monotonic() - began
    finally:
        reader.close()
        offsets.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", default="0,100000,1000000",
                        help="records held in the half topic at each point (ascending)")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    points = sorted(int(x) for x in args.held.split(","))
    with EmbeddedBroker() as broker:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        workload = Workload(Topics.with_prefix("tail_"), "bench-tail", "tail_real")
        create_topics(settings, [*workload.topics.system(), workload.real_topic], 2)
        producer = BulkProducer(settings)
        held = 0
        assert broker.pid is not None
        print(f"{'held':>10}  {'ms/round':>9}  {'broker CPU ms/round':>20}")
        for point in points:
            while held < point:
                n = min(20_000, point - held)
                producer.send(workload.half(workload.txid("held", held + i), 0, 6 * 3600)
                              for i in range(n))
                held += n
            producer.flush()
            cpu = tree_cpu_s(broker.pid)
            wall = tail_rounds(settings, workload, producer, args.rounds)
            cpu = tree_cpu_s(broker.pid) - cpu
            print(f"{held:>10,}  {wall * 1000 / args.rounds:>9.1f}  "
                  f"{cpu * 1000 / args.rounds:>20.1f}", flush=True)
        producer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
