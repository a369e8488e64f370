"""What a new checkpoint's look for a predecessor's releases costs (docs/decisions/0029 and 0031).

``python -m bench.read_back [--records N ...] [--pending P] [--keys K]`` starts the embedded
broker and, per size, fills a real topic of 4 partitions with N releases of this coordinator
(200-byte bodies, an hour old), then has K state keys each ask for their share of P pending
transactions released first, born before everything after them: every key's look reaches back
to the topic's start. It prints the time of all K looks through the process's one index of
releases (``txstream.readback.release_index``), and of the first key's look alone, which is what
each key paid when every key read the topic back for itself.
"""

from __future__ import annotations

import argparse
import sys
import time

from kafka.admin import NewTopic

from bench.workload import BulkProducer
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, make_admin
from txstream.readback.release_index import forget_release_indexes, released_by_others
from txstream.wire import H, Record

_TAG = "0badc0de"


def _fill(settings: KafkaSettings, topic: str, records: int, epoch: int) -> None:
    admin = make_admin(settings)
    try:
        admin.create_topics([NewTopic(topic, 4, -1)])
    finally:
        admin.close()
    producer = BulkProducer(settings)
    try:
        producer.send(Record(topic, None, b"x" * 200, (
            (H.TRANSACTION_ID, f"tx-{i}".encode()),
            (H.RECORD_ID, f"{_TAG}.{i % 64}.{epoch}.{i}".encode()))) for i in range(records))
        producer.flush()
    finally:
        producer.close()


def _looks(settings: KafkaSettings, topic: str, pending: int, keys: int, now: int
           ) -> tuple[float, float, int]:
    """(seconds for the first key's look, for every key's, transactions found)."""
    forget_release_indexes()
    found: set[str] = set()
    started = time.perf_counter()
    first = 0.0
    for key in range(keys):
        wanted = {topic: {f"tx-{i}": now - 7_200_000 for i in range(key, pending, keys)}}
        found |= released_by_others(settings, wanted, _TAG, f"{_TAG}.{key}.{now}.")
        if key == 0:
            first = time.perf_counter() - started
    return first, time.perf_counter() - started, len(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_back",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--records", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--pending", type=int, default=1_000)
    parser.add_argument("--keys", type=int, default=64)
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        now = int(time.time() * 1000)
        for records in args.records:
            topic = f"bench-real-{records}"
            _fill(settings, topic, records, now - 3_600_000)
            first, every, found = _looks(settings, topic, min(args.pending, records),
                                         args.keys, now)
            print(f"{records:>9,} records on 4 partitions, {args.pending:,} pending over "
                  f"{args.keys} keys: every key's look {every:.2f} s ({found:,} found); one "
                  f"key's look {first:.2f} s ({records / first:,.0f} records/s read back), so "
                  f"{args.keys} keys reading for themselves ~{first * args.keys:.0f} s",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
