"""How long the client's calls take: send_message_in_transaction, check answers, consuming.

    python examples/client_latency.py                 # against an embedded tansu broker
    python examples/client_latency.py --bootstrap-servers HOST:PORT --count 2000

No coordinator is needed: the check requests are written here, as the coordinator would.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import threading
import time
import uuid
from contextlib import ExitStack

from client import (
    ConsumeStatus,
    LocalTransactionState,
    Message,
    PushConsumer,
    Topics,
    TransactionListener,
    TransactionProducer,
)
from txstream.broker import EmbeddedBroker
from txstream.kafka import KafkaSettings, make_producer
from txstream.wire import Record, encode_check, encode_visible

__all__ = ["main"]


class _Commit(TransactionListener):
    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _ms(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000


def _write(settings: KafkaSettings, records: list[Record]) -> None:
    producer = make_producer(settings)
    try:
        for f in [producer.send(r.topic, key=r.key, value=r.value, headers=list(r.headers))
                  for r in records]:
            f.get(timeout=30)
    finally:
        producer.close()


def measure(servers: str, count: int, threads: int) -> None:
    settings = KafkaSettings(bootstrap_servers=servers)
    run = uuid.uuid4().hex[:8]
    topics = Topics.with_prefix(f"lat{run}_")
    body = b"x" * 200
    with TransactionProducer(f"lat_{run}", servers, _Commit(), topics=topics) as p:
        for _ in range(50):  # connections, metadata, topic creation
            p.send_message_in_transaction(Message("Latency", body))
        lat = []
        for i in range(count):
            t0 = time.perf_counter()
            p.send_message_in_transaction(Message("Latency", body, keys=str(i)))
            lat.append(time.perf_counter() - t0)
        print(f"send_message_in_transaction, 1 thread, {count} x 200 B: p50 {_ms(lat, .5):.2f} "
              f"ms, p90 {_ms(lat, .9):.2f} ms, p99 {_ms(lat, .99):.2f} ms, "
              f"{count / sum(lat):.0f} tx/s")

        def work() -> None:
            for _ in range(count // threads):
                p.send_message_in_transaction(Message("Latency", body))

        workers = [threading.Thread(target=work) for _ in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rate = count // threads * threads / (time.perf_counter() - t0)
        print(f"{threads} sending threads: {rate:.0f} tx/s")

        while not p.check_partitions:
            time.sleep(0.05)
        before = p.checks_answered
        checks = [encode_check(Message("Latency", body, transaction_id=f"c{i}", msg_id=f"c{i}",
                                       producer_group=p.producer_group, born_timestamp=1), 1,
                               topics) for i in range(count)]
        t0 = time.perf_counter()
        _write(settings, checks)
        while p.checks_answered - before < count:
            time.sleep(0.002)
        el = time.perf_counter() - t0
        print(f"{count} back-checks answered (each answer acknowledged by the broker): "
              f"{el:.2f} s, {count / el:.0f}/s")

    topic = f"latency_consume_{run}"
    _write(settings, [encode_visible(Message(topic, body, keys=str(i % 64),
                                             transaction_id=(m := uuid.uuid4().hex), msg_id=m))
                      for i in range(count)])
    got: list[float] = []
    done = threading.Event()

    def listener(msgs: object) -> ConsumeStatus:
        got.append(time.perf_counter())
        if len(got) >= count:
            done.set()
        return ConsumeStatus.CONSUME_SUCCESS

    consumer = PushConsumer(f"lat_{run}", servers)
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    t0 = time.perf_counter()
    with consumer:
        done.wait(300)
    gap = statistics.median(b - a for a, b in itertools.pairwise(got)) * 1e3
    print(f"PushConsumer: first message {got[0] - t0:.1f} s after start (group join), then "
          f"{count} messages at {count / (got[-1] - got[0] or 1e-9):.0f} msg/s "
          f"(median gap {gap:.3f} ms)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap-servers", help="default: start an embedded tansu broker")
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=8)
    args = ap.parse_args(argv)
    with ExitStack() as stack:
        servers = args.bootstrap_servers or stack.enter_context(EmbeddedBroker()).bootstrap_servers
        measure(servers, args.count, args.threads)


if __name__ == "__main__":
    main()
