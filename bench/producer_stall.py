"""How often a fresh sink producer stalls on a burst that meets a new topic.

``python -m bench.producer_stall [--rounds 150] [--busy 2] [--wait-s 12]``

The case of a worker's first micro-batch after a (re)start: a fresh producer gets 5,000
records for a topic that exists and one for a topic the broker creates on that write. Each
round uses new client settings (so the sink builds a new producer) and a new topic; ``--busy``
processes spin beside it, because the stall was seen on CPU-starved machines. A round that has
not finished after ``--wait-s`` counts as a stall. Prints one line per stall and the totals.
Before :class:`txstream.kafka.TopicTrackingProducer`, 13 rounds of 150 stalled here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import threading
import time
from typing import Any

from sinks.kafka_sink import SinkOptions, send_rows
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings
from txstream.wire import pack_headers

__all__ = ["stall_rounds"]

RECORDS = 5000


def _spin() -> None:
    while True:
        pass


def _one_round(options: SinkOptions, rows: list[tuple[Any, ...]], wait_s: float) -> float | None:
    """Seconds the round took, or None if it was still sending after ``wait_s``."""
    started = time.perf_counter()
    worker = threading.Thread(target=send_rows, args=(options, rows), daemon=True)
    worker.start()
    worker.join(wait_s)
    return None if worker.is_alive() else time.perf_counter() - started


def stall_rounds(settings: KafkaSettings, rounds: int, wait_s: float) -> tuple[int, list[float]]:
    """(stalled rounds, durations of the others)."""
    known = f"stall-known-{time.time_ns()}"
    send_rows(SinkOptions(kafka=settings), [("visible", known, b"k", b"v", None)])
    headers = pack_headers([("UNIQ_KEY", b"m"), ("PGROUP", b"g")])
    body = bytes(300)
    stalls, durations = 0, []
    for round_ in range(rounds):
        fresh = KafkaSettings(settings.bootstrap_servers,
                              extra={"client_id": f"stall-{round_}-{time.time_ns()}"})
        rows = [("visible", known, b"k%d" % i, body, headers) for i in range(RECORDS)]
        rows.append(("check", f"{known}-new{round_}", b"k", b"check", None))
        took = _one_round(SinkOptions(kafka=fresh, flush_timeout_s=wait_s + 5), rows, wait_s)
        if took is None:
            stalls += 1
            print(f"round {round_}: still sending after {wait_s:.0f} s", flush=True)
        else:
            durations.append(took)
    return stalls, durations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.producer_stall")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside it")
    parser.add_argument("--wait-s", type=float, default=12.0)
    args = parser.parse_args(argv)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:
        spinner.start()
    broker = EmbeddedBroker().start()
    try:
        stalls, durations = stall_rounds(KafkaSettings(broker.bootstrap_servers),
                                         args.rounds, args.wait_s)
    finally:
        broker.stop()
        for spinner in spinners:
            spinner.terminate()
    durations.sort()
    slowest = f", slowest {durations[-1]:.2f} s" if durations else ""
    median = f"median {durations[len(durations) // 2]:.2f} s" if durations else "none finished"
    print(f"stalled {stalls} of {args.rounds} rounds; the others: {median}{slowest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
