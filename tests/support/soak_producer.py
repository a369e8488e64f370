"""One producer process of the soak (tests/system/test_soak.py): a ``client.TransactionProducer`` of
the soak's producer group, sending transactions at a steady rate until told to stop.

    python tests/support/soak_producer.py --bootstrap-servers H:P --topic-prefix P --group G
        --topics A,B --ledger DIR --name p0 --seed N [--rate 6]

Each transaction's outcome is drawn at random: commit, rollback, or UNKNOW at first with the
final decision left for the back-check. The decision is recorded in the ledger
(tests/support/soak_ledger.py) before the end event is sent; checks are answered from the ledgers of
all the group's producers, by transaction id.

Signals: SIGUSR1: the next local transaction records its decision, then hangs (the test kills
the process there: committed locally, no end event sent); SIGUSR2: it hangs before recording
one (the local transaction never ran). SIGTERM: stop and exit. The file ``DIR/stop-sending``:
stop sending and keep answering checks.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.support.soak_ledger import (
    DECISION,
    HALF_FAILED,
    HUNG,
    IDLE,
    SENT,
    STARTED,
    Ledger,
    append,
    ledger_path,
)
from txstream.client import TransactionListener, TransactionProducer
from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings
from txstream.message import Decision, Message
from txstream.topics import Topics

__all__ = ["LedgerListener", "plan", "main", "STOP_SENDING", "NO_RECORD_GRACE_MS"]

COMMIT, ROLLBACK, UNKNOW = Decision.COMMIT_MESSAGE, Decision.ROLLBACK_MESSAGE, Decision.UNKNOW
STOP_SENDING = "stop-sending"
# A check about a transaction with no recorded decision is answered ROLLBACK (its local
# transaction never ran) only once the transaction is this old: until then it may be one whose
# half message was acknowledged a moment ago and whose decision is being written right now.
NO_RECORD_GRACE_MS = 5000


def plan(rng: random.Random) -> tuple[Decision, Decision]:
    """(what the local transaction answers, its final decision)."""
    roll = rng.random()
    if roll < 0.45:
        return COMMIT, COMMIT
    if roll < 0.70:
        return ROLLBACK, ROLLBACK
    return UNKNOW, COMMIT if roll < 0.85 else ROLLBACK


class LedgerListener(TransactionListener):
    """Runs the "local transaction" (a ledger line) and answers checks from every ledger."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = ledger_path(folder, name)
        self.ledger = Ledger(folder)
        self.hang: str | None = None  # set by the signal handlers: "before" or "after"

    def execute_local_transaction(self, msg: Message, arg: object) -> Decision:
        first, final = arg  # type: ignore[misc]
        txid = msg.transaction_id or ""
        if self.hang == "before":
            self._hang_forever(txid, "before")
        append(self.path, DECISION, txid=txid, decision=final.value, first=first.value)
        if self.hang == "after":
            self._hang_forever(txid, "after")
        return first

    def _hang_forever(self, txid: str, mode: str) -> None:
        append(self.path, HUNG, txid=txid, mode=mode)
        while True:  # until the test's SIGKILL
            time.sleep(1)

    def check_local_transaction(self, msg: Message) -> Decision:
        txid = msg.transaction_id or ""
        recorded = self.ledger.decision(txid)
        if recorded is not None:
            return Decision(recorded)
        born = msg.born_timestamp or 0
        if time.time() * 1000 - born < NO_RECORD_GRACE_MS:
            return UNKNOW
        return ROLLBACK


def _start(group: str, kafka: KafkaSettings, topics: Topics, listener: LedgerListener
           ) -> TransactionProducer:
    """Start, retrying while the broker is paused by the test."""
    for attempt in range(10):
        try:
            return TransactionProducer(group, kafka=kafka, topics=topics,
                                       listener=listener).start()
        except Exception as exc:
            if attempt == 9:
                raise
            logging.warning("producer start failed (%s); retrying", exc)
            time.sleep(2)
    raise AssertionError("unreachable")


def _send_one(producer: TransactionProducer, listener: LedgerListener, rng: random.Random,
              topics: list[str], body: str) -> None:
    first, final = plan(rng)
    topic = rng.choice(topics)
    keys = f"k{rng.randrange(7)}" if rng.random() < 0.4 else None
    msg = Message(topic, body.encode(), tags=rng.choice(("TagA", "TagB")), keys=keys)
    try:
        result = producer.send_message_in_transaction(msg, (first, final))
    except SendFailed as exc:
        append(listener.path, HALF_FAILED, error=str(exc)[:300], body=body)
        return
    append(listener.path, SENT, txid=result.transaction_id, first=first.value,
           end_ack=result.end_acknowledged, topic=topic, body=body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for flag in ("--bootstrap-servers", "--topic-prefix", "--group", "--topics", "--ledger",
                 "--name"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--rate", type=float, default=6.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    folder = Path(args.ledger)
    listener = LedgerListener(folder, args.name)
    stopping: list[bool] = []

    def on_signal(signum: int, _frame: Any) -> None:
        if signum == signal.SIGTERM:
            stopping.append(True)
        else:
            listener.hang = "after" if signum == signal.SIGUSR1 else "before"

    for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, on_signal)
    producer = _start(args.group, KafkaSettings(bootstrap_servers=args.bootstrap_servers),
                      Topics.with_prefix(args.topic_prefix), listener)
    append(listener.path, STARTED)
    rng, topics = random.Random(args.seed), args.topics.split(",")
    started, i, sent, idle = time.monotonic(), 0, 0, False
    while not stopping:
        if (folder / STOP_SENDING).exists():
            if not idle:
                append(listener.path, IDLE)
                idle = True
            time.sleep(0.2)
            continue
        _send_one(producer, listener, rng, topics, f"{args.name}.{os.getpid()}-{sent}")
        i, sent = i + 1, sent + 1
        lag = started + i / args.rate - time.monotonic()
        if lag > 0:
            time.sleep(lag)
        elif lag < -1.0:  # fell behind (a broker pause): go on at the rate, no burst
            started, i = time.monotonic(), 0
    producer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
