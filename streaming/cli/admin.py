"""``txstream resolve`` and ``txstream history``: an operator's hands on one transaction.

``resolve TXID --commit|--rollback`` writes an end event with ``ADMIN_OPERATOR`` set through
the end topic producers use, so the coordinator applies it like any other end event (in order,
checkpointed) and records it in the history as the operator's decision; the console's resolve
buttons write it the same way (:func:`send_decision`). ``history TXID`` tells what the
coordinator wrote about the transaction: its history notes, and the discard and dead-letter
records keyed by it. Both read the console's index (:mod:`txstream.console.index`): caught up to the
topics' ends, then queried. With ``--index PATH`` that is the console's file, kept between
calls; without, one in memory, read from the topics' beginning for this call.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from txstream.console.describe import describe, describe_dead_letter, describe_discard
from txstream.console.entries import Source
from txstream.console.feed import IndexFeed
from txstream.console.index import MEMORY, Index
from txstream.console.queries import EventRow
from txstream.errors import SendFailed
from txstream.kafka import KafkaSettings, make_producer
from txstream.message import Decision, EndEvent
from txstream.streaming.cli.options import (
    add_kafka_arguments,
    env,
    format_ms,
    settings_of,
    topics_of,
)
from txstream.topics import Topics, validate_group
from txstream.wire import encode_end

__all__ = ["add_parser", "resolve_command", "history_command", "Trail", "trail_of",
           "describe", "send_decision", "Written", "add_index_argument", "ADMIN_GROUP"]

ADMIN_GROUP = "txstream-admin"


@dataclass
class Trail:
    """Everything the coordinator wrote about one transaction, oldest first."""

    notes: list[dict[str, Any]]
    discards: list[EventRow]
    dead_letters: list[EventRow]

    def __bool__(self) -> bool:
        return bool(self.notes or self.discards or self.dead_letters)


def trail_of(index: Index, txid: str) -> Trail:
    """The transaction's history notes (as written), discards and dead letters."""
    events = index.events(txid, (Source.HISTORY, Source.DISCARD, Source.DEAD_LETTER))
    return Trail([e.detail for e in events if e.source == Source.HISTORY],
                 [e for e in events if e.source == Source.DISCARD],
                 [e for e in events if e.source == Source.DEAD_LETTER])


def print_trail(trail: Trail, txid: str) -> None:
    print(f"transaction {txid}")
    start = int(trail.notes[0].get("at") or 0) if trail.notes else 0
    for note in trail.notes:
        at = int(note.get("at") or 0)
        print(f"  {format_ms(at)}  +{(at - start) / 1000:7.3f}s  {note.get('event', '?'):<15} "
              f"{describe(note)}")
    for event in trail.discards:
        print(f"  {describe_discard(event)}")
    for event in trail.dead_letters:
        print(f"  {describe_dead_letter(event)}")


class Written(NamedTuple):
    """Where an operator's decision was written, and when."""

    topic: str
    partition: int
    offset: int
    born_ms: int


def send_decision(settings: KafkaSettings, topics: Topics, txid: str, decision: Decision,
                  operator: str, reason: str | None = None, group: str = ADMIN_GROUP
                  ) -> Written:
    """Write an operator's decision for ``txid`` to the end topic, with ``ADMIN_OPERATOR``
    and the remark: the coordinator applies it in order and records it as the operator's."""
    born = int(time.time() * 1000)
    event = EndEvent(txid, validate_group(group), decision, operator=operator, remark=reason,
                     born_timestamp=born)
    record = encode_end(event, topics)
    producer = make_producer(settings)
    try:
        meta = producer.send(record.topic, key=record.key, value=record.value,
                             headers=list(record.headers)).get(timeout=30)
    except Exception as exc:
        raise SendFailed(f"end event for {txid} not acknowledged: {exc}") from exc
    finally:
        producer.close(timeout=5)
    return Written(meta.topic, meta.partition, meta.offset, born)


def add_index_argument(p: argparse.ArgumentParser, default: str | None, help_default: str
                       ) -> None:
    p.add_argument("--index", metavar="PATH", default=default,
                   help=f"the console's index, an SQLite file read and brought up to date "
                        f"(env TXSTREAM_INDEX; default {help_default})")


def _feed(index: Index, settings: KafkaSettings, topics: Topics) -> IndexFeed:
    # An index for this call alone: history shows no message ids or keys, so the half topic
    # (bodies and all) stays unread.
    return IndexFeed(index, settings, topics, read_half=index.path != MEMORY)


def add_parser(sub: Any) -> None:
    r = sub.add_parser("resolve", help="commit or roll back a pending transaction by hand")
    add_kafka_arguments(r)
    r.add_argument("transaction_id", metavar="TXID")
    decision = r.add_mutually_exclusive_group(required=True)
    decision.add_argument("--commit", dest="decision", action="store_const",
                          const=Decision.COMMIT_MESSAGE)
    decision.add_argument("--rollback", dest="decision", action="store_const",
                          const=Decision.ROLLBACK_MESSAGE)
    r.add_argument("--group", default=ADMIN_GROUP,
                   help=f"producer group written in the end event (default {ADMIN_GROUP}; an "
                        "operator's decision is accepted whatever the transaction's group)")
    r.add_argument("--operator", default=None, help="who decides (default: $USER)")
    r.add_argument("--reason", default=None, help="remark kept in the history")
    r.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for the coordinator to record the decision")
    add_index_argument(r, env("index"), "one in memory, for this call")
    r.set_defaults(func=resolve_command)

    h = sub.add_parser("history", help="what happened to one transaction, and when")
    add_kafka_arguments(h)
    h.add_argument("transaction_id", metavar="TXID")
    h.add_argument("--json", action="store_true", help="the raw history notes, one per line")
    add_index_argument(h, env("index"), "one in memory, for this call")
    h.set_defaults(func=history_command)


def _operator(args: argparse.Namespace) -> str:
    if args.operator:
        return str(args.operator)
    try:
        return os.environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return "unknown-operator"


def _outcome(trail: Trail, who: str, since_ms: int) -> dict[str, Any] | None:
    """The note recording our decision (or refusing it), if the coordinator wrote it yet."""
    for note in trail.notes:
        if note.get("operator") == who and note.get("event") in ("released", "rolled_back"):
            return note
        if int(note.get("at") or 0) >= since_ms and note.get("event") in (
            "rejected", "duplicate", "end_before_half"
        ):
            return note
    return None


def _warn_before(trail: Trail, txid: str, topics: Topics) -> None:
    final = [n for n in trail.notes if n.get("event") in ("released", "rolled_back",
                                                           "discarded")]
    if final:
        print(f"warning: {txid} is already {final[-1]['event']} "
              f"({format_ms(final[-1].get('at'))}); a contradicting decision goes to the "
              "dead-letter topic", file=sys.stderr)
    elif not trail:
        print(f"warning: no history for {txid} on {topics.history} (wrong --topic-prefix, "
              "or a coordinator with --no-history?)", file=sys.stderr)


def _await_verdict(feed: IndexFeed, txid: str, who: str, since_ms: int, wait_s: float
                   ) -> int:
    deadline = time.monotonic() + wait_s
    while True:
        feed.catch_up()
        note = _outcome(trail_of(feed.index, txid), who, since_ms)
        if note is not None:
            print(f"coordinator: {note['event']}: {describe(note)}")
            return 0 if note.get("operator") == who else 1
        if time.monotonic() >= deadline:
            print(f"txstream: the coordinator did not record the decision within "
                  f"{wait_s:g}s (is it running, with the same --topic-prefix?)",
                  file=sys.stderr)
            return 1
        time.sleep(0.5)


def resolve_command(args: argparse.Namespace) -> int:
    settings, topics = settings_of(args), topics_of(args)
    txid, who = args.transaction_id, _operator(args)
    group = validate_group(args.group)
    with Index(args.index or MEMORY) as index, _feed(index, settings, topics) as feed:
        feed.catch_up()
        _warn_before(trail_of(index, txid), txid, topics)
        written = send_decision(settings, topics, txid, args.decision, who, args.reason, group)
        print(f"{args.decision.value} for {txid} by {who} written to "
              f"{written.topic}[{written.partition}]@{written.offset} at "
              f"{format_ms(written.born_ms)}")
        if args.wait <= 0:
            print(f"the coordinator applies it in its next batch: txstream history {txid}")
            return 0
        return _await_verdict(feed, txid, who, written.born_ms - 1000, args.wait)


def history_command(args: argparse.Namespace) -> int:
    settings, topics = settings_of(args), topics_of(args)
    with Index(args.index or MEMORY) as index:
        with _feed(index, settings, topics) as feed:
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
