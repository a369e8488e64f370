"""What a new checkpoint's look for a predecessor's releases costs: one state key's look.

``python -m bench.read_back [--records N ...]`` starts the embedded broker and, per size,
fills a real topic of 4 partitions with N releases of this coordinator (200-byte bodies),
then asks ``released_earlier`` for 50 transactions released first: the whole topic is read
back, as for a state key whose pending transactions are older than everything after them
(docs/decisions/0029-releases-found.md).
"""

from __future__ import annotations

import argparse
import sys
import time

from kafka.admin import NewTopic

from bench.workload import BulkProducer
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, make_admin
from txstream.sinks.replay import released_earlier
from txstream.wire import H, Record

_TAG = "0badc0de"
_ASKED = 50


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
            (H.RECORD_ID, f"{_TAG}.1.{epoch}.{i}".encode()))) for i in range(records))
        producer.flush()
    finally:
        producer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.read_back",
                                     description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--records", type=int, nargs="+", default=[2_000, 20_000, 100_000])
    args = parser.parse_args(argv)
    with EmbeddedBroker() as broker:
        settings = KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
        now = int(time.time() * 1000)
        for records in args.records:
            topic = f"bench-real-{records}"
            _fill(settings, topic, records, now - 60_000)
            wanted = {topic: {f"tx-{i}": now - 120_000 for i in range(_ASKED)}}
            started = time.perf_counter()
            found = released_earlier(settings, wanted, _TAG, f"{_TAG}.1.{now}.")
            took = time.perf_counter() - started
            print(f"{records:>9,} records on 4 partitions: {len(found)} of {_ASKED} found in "
                  f"{took:.2f} s ({records / took:,.0f} records/s read back)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
