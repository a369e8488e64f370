"""RocketMQ's transaction example, producer side, on txstream.

Sends "Hello RocketMQ 0".."9" (tags TagA..TagE, keys KEY0..KEY9) to TranTest. Every local
transaction answers UNKNOW at first and records i % 3; the back-checks then answer
0 -> UNKNOW (asked again until the coordinator discards it), 1 -> COMMIT, 2 -> ROLLBACK.
So consumers receive exactly messages 1, 4 and 7.

    python examples/transaction_producer.py --bootstrap-servers 127.0.0.1:9092

Keep it running: the back-checks come after the coordinator's transaction timeout.
``run(...)`` does the same from Python (the end-to-end test drives it).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from txstream.client import (
    BoundedExecutor,
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
    TransactionSendResult,
    TxStreamError,
)

__all__ = ["TAGS", "TransactionListenerImpl", "run", "main"]

TAGS = ("TagA", "TagB", "TagC", "TagD", "TagE")


class TransactionListenerImpl(TransactionListener):
    """The seed's listener, as written there (its "local database" is a dict in memory)."""

    def __init__(self) -> None:
        self._index = itertools.count()
        self._lock = threading.Lock()
        self.local_trans: dict[str, int] = {}

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        with self._lock:
            value = next(self._index)
            self.local_trans[msg.transaction_id or ""] = value % 3
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        status = self.local_trans.get(msg.transaction_id or "")
        if status == 0:
            return LocalTransactionState.UNKNOW
        if status == 1:
            return LocalTransactionState.COMMIT_MESSAGE
        if status == 2:
            return LocalTransactionState.ROLLBACK_MESSAGE
        # As in the seed: a transaction this process does not know is committed. A real
        # listener looks it up in durable storage instead, and answers ROLLBACK for one it
        # does not find: a send that raised SendInDoubt may have stored a half message whose
        # local transaction never ran.
        return LocalTransactionState.COMMIT_MESSAGE


def run(
    bootstrap_servers: str | None = None,
    *,
    topic: str = "TranTest",
    topic_prefix: str = "",
    group: str = "please_rename_unique_group_name",
    count: int = 10,
    keep_running_s: float | None = None,
    stop: threading.Event | None = None,
    out: Callable[[str], None] = print,
    listener: TransactionListenerImpl | None = None,
) -> list[TransactionSendResult]:
    """Send the example's messages, then answer back-checks until ``stop`` is set or
    ``keep_running_s`` passed (None: until Ctrl-C, like the seed's 100000 s sleep)."""
    listener = listener or TransactionListenerImpl()
    # The seed's ThreadPoolExecutor(2, 5, ..., ArrayBlockingQueue(2000)).
    executor = BoundedExecutor(max_workers=5, queue_size=2000)
    producer = TransactionProducer(group, bootstrap_servers, listener, executor,
                                   topic_prefix=topic_prefix)
    results: list[TransactionSendResult] = []
    producer.start()
    try:
        for i in range(count):
            msg = Message(topic, f"Hello RocketMQ {i}".encode(), tags=TAGS[i % len(TAGS)],
                          keys=f"KEY{i}")
            try:
                result = producer.send_message_in_transaction(msg, None)
            except TxStreamError as exc:
                out(f"send of message {i} failed: {exc}")
                continue
            results.append(result)
            out(str(result))
            time.sleep(0.01)
        stop = stop or threading.Event()
        try:
            stop.wait(keep_running_s)
        except KeyboardInterrupt:
            pass
    finally:
        producer.shutdown()
        executor.shutdown()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers",
                   default=os.environ.get("TXSTREAM_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--topic-prefix", default=os.environ.get("TXSTREAM_TOPIC_PREFIX", ""),
                   help="the coordinator's --topic-prefix")
    p.add_argument("--topic", default="TranTest")
    p.add_argument("--group", default="please_rename_unique_group_name")
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--keep-running", type=float, default=None, metavar="SECONDS",
                   help="answer back-checks this long after sending (default: until Ctrl-C)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    # kafka-python logs every refused connection and a harmless error on close; our own
    # message says what went wrong in one line.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        run(args.bootstrap_servers, topic=args.topic, topic_prefix=args.topic_prefix,
            group=args.group, count=args.count, keep_running_s=args.keep_running)
    except TxStreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
