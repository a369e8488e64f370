"""RocketMQ's transaction example, consumer side, on txstream.

Subscribes to every tag of TranTest and prints each body; with the producer example and a
running coordinator it prints "Hello RocketMQ 1", "4" and "7" (the committed ones). The
listener runs on a pool of threads (20, as Java's), so bodies may print in any order.

    python examples/transaction_consumer.py --bootstrap-servers 127.0.0.1:9092

``run(...)`` does the same from Python (the end-to-end test drives it).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence

from txstream.client import ConsumeFromWhere, ConsumeStatus, Message, PushConsumer, TxStreamError

__all__ = ["run", "main"]


def run(
    bootstrap_servers: str | None = None,
    *,
    topic: str = "TranTest",
    topic_prefix: str = "",
    group: str = "consumer_test_clustering",
    duration_s: float | None = None,
    stop: threading.Event | None = None,
    out: Callable[[str], None] = print,
    on_message: Callable[[Message], None] | None = None,
    started: threading.Event | None = None,
) -> int:
    """Consume until ``stop`` is set or ``duration_s`` passed (None: until Ctrl-C).

    Returns how many messages were consumed.
    """
    consumed = 0
    lock = threading.Lock()  # the listener is called from several threads at once

    def listener(msgs: Sequence[Message]) -> ConsumeStatus:
        nonlocal consumed
        try:
            for msg in msgs:
                out(f"Consumer===  MessageBody: {msg.body.decode('utf-8')}")
                if on_message is not None:
                    on_message(msg)
        except Exception as exc:
            out(f"failed: {exc!r}")
            return ConsumeStatus.RECONSUME_LATER  # try again later
        with lock:
            consumed += len(msgs)
        return ConsumeStatus.CONSUME_SUCCESS

    # start() returns before the group has joined (seconds on a small broker), and the
    # producer may start right after: with RocketMQ's default, CONSUME_FROM_LAST_OFFSET, a
    # message released in between would be skipped. A new group reading from the first offset
    # misses none; a group that consumed before resumes at its committed offsets either way.
    consumer = PushConsumer(group, bootstrap_servers, topic_prefix=topic_prefix,
                            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET)
    consumer.subscribe(topic, "*")
    consumer.register_message_listener(listener)
    consumer.start()
    out("Consumer===Successful start-up!")
    if started is not None:
        started.set()
    try:
        (stop or threading.Event()).wait(duration_s)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.shutdown()
    return consumed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers",
                   default=os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--topic-prefix", default=os.environ.get("TXSTREAM_TOPIC_PREFIX", ""),
                   help="prefix of this group's retry and dead-letter topics")
    p.add_argument("--topic", default="TranTest")
    p.add_argument("--group", default="consumer_test_clustering")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="stop after this long (default: until Ctrl-C)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    # kafka-python logs every refused connection and a harmless error on close; our own
    # message says what went wrong in one line.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        run(args.bootstrap_servers, topic=args.topic, topic_prefix=args.topic_prefix,
            group=args.group, duration_s=args.duration)
    except TxStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
