"""``txstream history TXID``: what the coordinator wrote about one transaction, and when.

Its history notes, and the discard and dead-letter records keyed by it, read from the
console's index (:mod:`txstream.streaming.cli.transaction_trail`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from txstream.console.index import MEMORY, Index
from txstream.console.timeline_text import (
    describe,
    describe_dead_letter,
    describe_discard,
    format_ms,
)
from txstream.streaming.cli.options import add_kafka_arguments, env, settings_of, topics_of
from txstream.streaming.cli.transaction_trail import (
    Trail,
    add_index_argument,
    index_feed,
    trail_of,
)

__all__ = ["add_parser", "history_command", "print_trail", "trail_lines"]


def add_parser(sub: Any) -> None:
    h = sub.add_parser("history", help="what happened to one transaction, and when")
    add_kafka_arguments(h)
    h.add_argument("transaction_id", metavar="TXID")
    h.add_argument("--json", action="store_true", help="the raw history notes, one per line")
    add_index_argument(h, env("index"), "one in memory, for this call")
    h.set_defaults(func=history_command)


def trail_lines(trail: Trail, txid: str) -> list[str]:
    """What ``txstream history TXID`` prints, line by line."""
    lines = [f"transaction {txid}"]
    start = int(trail.notes[0].get("at") or 0) if trail.notes else 0
    for note in trail.notes:
        at = int(note.get("at") or 0)
        lines.append(f"  {format_ms(at)}  +{(at - start) / 1000:7.3f}s  "
                     f"{note.get('event', '?'):<15} {describe(note)}")
    lines += [f"  {describe_discard(event)}" for event in trail.discards]
    lines += [f"  {describe_dead_letter(event)}" for event in trail.dead_letters]
    return lines


def print_trail(trail: Trail, txid: str) -> None:
    print("\n".join(trail_lines(trail, txid)))


def history_command(args: argparse.Namespace) -> int:
    settings, topics = settings_of(args), topics_of(args)
    with Index(args.index or MEMORY) as index:
        with index_feed(index, settings, topics) as feed:
            feed.catch_up()
        trail = trail_of(index, args.transaction_id)
    if args.json:
        for note in trail.notes:
            print(json.dumps(note))
        return 0 if trail else 1
    if not trail:
        print(f"no history for {args.transaction_id} on {topics.history}", file=sys.stderr)
        return 1
    print_trail(trail, args.transaction_id)
    return 0
