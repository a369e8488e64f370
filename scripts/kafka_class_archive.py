"""Writes the class-data archive of Apache Kafka's broker (AppCDS) beside its jars, for
txstream/kafka_node.py: each node then starts seconds sooner. scripts/setup.sh runs it once
the jars are copied:

    .venv/bin/python scripts/kafka_class_archive.py

It runs one node with ``-XX:ArchiveClassesAtExit``, has it do what tests do (create topics,
a transaction, a consumer group), and stops it: the JVM writes the classes it loaded as it
exits. Without the archive everything works, only slower; a failure here says so and exits 1.
"""

from __future__ import annotations

import sys

from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError

from txstream.errors import TxStreamError
from txstream.kafka_broker import KafkaBroker
from txstream.kafka_node import class_archive, kafka_libs


def exercise(servers: str) -> None:
    producer = KafkaProducer(bootstrap_servers=servers, transactional_id="archive")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("archive", value=b"classes").get(timeout=60)
        producer.commit_transaction()
    finally:
        producer.close()
    consumer = KafkaConsumer("archive", bootstrap_servers=servers, group_id="archive",
                             isolation_level="read_committed", auto_offset_reset="earliest")
    try:
        for _ in range(20):
            if consumer.poll(timeout_ms=500):
                consumer.commit()
                break
    finally:
        consumer.close()


def main() -> int:
    libs = kafka_libs()
    target = class_archive(libs)
    written = target.with_name(target.name + ".partial")  # renamed once whole
    written.unlink(missing_ok=True)
    broker = KafkaBroker(archive_to=written)
    try:
        broker.start()
        exercise(broker.bootstrap_servers)
    except (TxStreamError, KafkaError, OSError) as exc:
        print(f"kafka_class_archive: no archive ({exc}); Kafka starts without it",
              file=sys.stderr)
        broker.stop()
        return 1
    broker.stop(timeout_s=120)  # the archive is written as the JVM exits
    if not written.is_file():
        print("kafka_class_archive: the JVM wrote no archive; Kafka starts without it",
              file=sys.stderr)
        return 1
    written.replace(target)
    print(f"kafka_class_archive: wrote {target} ({target.stat().st_size // 2**20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
