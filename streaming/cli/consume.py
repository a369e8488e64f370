"""``txstream consume``: print the messages released to a topic, with the client library.

    txstream consume --topic T [--tags "A || B"] [--group G] [--from first|last] [--count N]
                     [--timeout S]
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from txstream.client import ConsumeFromWhere, ConsumeStatus, Message, PushConsumer
from txstream.streaming.cli.options import add_kafka_arguments, settings_of
from txstream.streaming.cli.signals import interrupt_on_signals

__all__ = ["add_parser", "consume_command", "format_message"]

_FROM = {
    "first": ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    "last": ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET,
}


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
