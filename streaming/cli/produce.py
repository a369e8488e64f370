"""``txstream produce``: send transactional messages from a shell, with the client library.

    txstream produce --topic T --group G [--commit | --rollback | --unknown] BODY...
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any

from txstream.client import (
    LocalTransactionState,
    Message,
    TransactionListener,
    TransactionProducer,
)
from txstream.streaming.cli.options import add_kafka_arguments, settings_of, topics_of

__all__ = ["add_parser", "produce_command", "FixedListener"]

_DECISIONS = {
    "commit": LocalTransactionState.COMMIT_MESSAGE,
    "rollback": LocalTransactionState.ROLLBACK_MESSAGE,
    "unknown": LocalTransactionState.UNKNOW,
}


class FixedListener(TransactionListener):
    """Answers every local transaction, and every back-check, with one decision."""

    def __init__(self, decision: LocalTransactionState) -> None:
        self.decision = decision
        self.checks = 0

    def execute_local_transaction(self, msg: Message, arg: object) -> LocalTransactionState:
        return self.decision

    def check_local_transaction(self, msg: Message) -> LocalTransactionState:
        self.checks += 1
        return self.decision


def add_parser(sub: Any) -> None:
    p = sub.add_parser("produce", help="send transactional messages from the shell")
    add_kafka_arguments(p)
    p.add_argument("--topic", required=True, help="real topic the messages are released to")
    p.add_argument("--group", required=True, help="producer group")
    decision = p.add_mutually_exclusive_group()
    for name in _DECISIONS:
        decision.add_argument(f"--{name}", dest="decision", action="store_const", const=name,
                              help=f"the local transaction answers {name}"
                                   + (" (default)" if name == "commit" else ""))
    p.add_argument("--tags", help="RocketMQ tag of every message")
    p.add_argument("--keys", help="RocketMQ keys of every message (the released record's key)")
    p.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                   help="user property (repeatable)")
    p.add_argument("--stay", type=float, default=0.0, metavar="SECONDS",
                   help="keep answering this group's back-checks (with the same decision) "
                        "for this long after sending")
    p.add_argument("bodies", nargs="+", metavar="BODY", help="one message per BODY")
    p.set_defaults(func=produce_command, decision="commit")


def _properties(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"txstream produce: --property needs NAME=VALUE, got {pair!r}")
        out[name] = value
    return out


def produce_command(args: argparse.Namespace) -> int:
    listener = FixedListener(_DECISIONS[args.decision])
    props = _properties(args.property)
    producer = TransactionProducer(
        args.group, listener=listener, kafka=settings_of(args), topics=topics_of(args),
        # Joining the check group costs seconds on small brokers: only when asked to stay.
        answer_checks=args.stay > 0,
    )
    failed = 0
    with producer:
        for body in args.bodies:
            msg = Message(args.topic, body.encode("utf-8"), tags=args.tags, keys=args.keys,
                          properties=dict(props))
            result = producer.send_message_in_transaction(msg)
            ok = result.end_acknowledged
            failed += 0 if ok else 1
            print(f"{result.transaction_id}  {result.local_transaction_state.value:<16} "
                  f"half {result.half_topic}[{result.half_partition}]@{result.half_offset}"
                  f"{'' if ok else '  (end event NOT acknowledged: a back-check decides)'}"
                  f"  | {body}", flush=True)
        if args.stay > 0:
            print(f"answering back-checks of group {args.group} for {args.stay:g}s", flush=True)
            time.sleep(args.stay)
            print(f"answered {producer.checks_answered} back-check(s)", flush=True)
    return 1 if failed else 0
