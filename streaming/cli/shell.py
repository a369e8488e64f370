"""``txstream produce`` and ``txstream consume``: the client library from a shell.

    txstream produce --topic T --group G [--commit | --rollback | --unknown] BODY...
    txstream consume --topic T [--tags "A || B"] [--group G] [--from first|last] [--count N]
                     [--timeout S]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from txstream.client import (
    ConsumeFromWhere,
    ConsumeStatus,
    LocalTransactionState,
    Message,
    PushConsumer,
    TransactionListener,
    TransactionProducer,
)
from txstream.streaming.cli.options import add_kafka_arguments, settings_of, topics_of
from txstream.streaming.cli.signals import interrupt_on_signals

__all__ = ["add_parser", "produce_command", "consume_command", "format_message",
           "FixedListener"]

_FROM = {
    "first": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    "last": ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
}
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


def format_message(msg: Message) -> str:
    """One line per received message: where, tags, keys, id, body."""
    parts = [f"{msg.topic}[{msg.queue_id}]@{msg.queue_offset}"]
    if msg.tags:
        parts.append(f"tags={msg.tags}")
    if msg.keys:
        parts.append(f"keys={msg.keys}")
    parts.append(f"msgId={msg.msg_id}")
    if msg.reconsume_times:
        parts.append(f"reconsumed={msg.reconsume_times}")
    parts.extend(f"{k}={v}" for k, v in sorted(msg.properties.items()))
    return "  ".join(parts) + f"  | {msg.body_text}"


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

    c = sub.add_parser("consume", help="print the messages released to a topic")
    add_kafka_arguments(c)
    c.add_argument("--topic", required=True)
    c.add_argument("--tags", default="*", help='tag expression: "*" or "TagA || TagB"')
    c.add_argument("--group", default=None,
                   help="consumer group (default: a new one each time)")
    c.add_argument("--from", dest="start", choices=sorted(_FROM), default="first",
                   help="where a group without committed offsets starts: 'first' (the "
                        "default here: a shell shows what was released so far) or 'last' "
                        "(only what is released from now on, RocketMQ's default); a group "
                        "resumes at its committed offsets")
    c.add_argument("--count", type=int, default=None, help="stop after N messages")
    c.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="stop after this long (default: run until Ctrl-C)")
    c.set_defaults(func=consume_command)


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


def consume_command(args: argparse.Namespace) -> int:
    # Stop cleanly (commit, leave the group) on SIGTERM and SIGINT.
    with interrupt_on_signals():
        return _consume(args)


def _consume(args: argparse.Namespace) -> int:
    group = args.group or f"txstream-shell-{uuid.uuid4().hex[:8]}"
    received: list[Message] = []
    enough = threading.Event()
    lock = threading.Lock()

    def on_messages(msgs: Sequence[Message]) -> ConsumeStatus:
        with lock:
            for msg in msgs:
                received.append(msg)
                print(format_message(msg), flush=True)
            if args.count is not None and len(received) >= args.count:
                enough.set()
        return ConsumeStatus.CONSUME_SUCCESS

    # One listener thread: a partition's messages are printed in the order they were released.
    consumer = PushConsumer(group, kafka=settings_of(args), topic_prefix=args.topic_prefix,
                            consume_from_where=_FROM[args.start], consume_thread_min=1,
                            consume_thread_max=1)
    consumer.subscribe(args.topic, args.tags)
    consumer.register_message_listener(on_messages)
    print(f"consuming {args.topic} ({args.tags}) as group {group} (without a committed "
          f"offset: from the {args.start})"
          + (f", until {args.count} message(s)" if args.count else "")
          + (f", for at most {args.timeout:g}s" if args.timeout else ""), file=sys.stderr,
          flush=True)
    with consumer:
        try:
            enough.wait(args.timeout)
        except KeyboardInterrupt:
            pass
    print(f"received {len(received)} message(s)", file=sys.stderr, flush=True)
    if args.count is not None and len(received) < args.count:
        return 1
    return 0
