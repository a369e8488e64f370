"""``txstream resolve TXID --commit|--rollback``: an operator's hands on one transaction.

It writes an end event with ``ADMIN_OPERATOR`` set through the end topic producers use
(:func:`~txstream.streaming.cli.operator_decision.send_decision`, as the console's resolve
buttons do), so the coordinator applies it like any other end event and records it in the
history as the operator's decision; with ``--wait`` it waits for that record in the console's
index (:mod:`txstream.streaming.cli.transaction_trail`). Like the console, it refuses an id the
history does not know, or one already ended, unless ``--force``.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
import time
from typing import Any

from txstream.console.feed import IndexFeed
from txstream.console.index import MEMORY, Index
from txstream.console.timeline_text import describe, format_ms
from txstream.message import Decision
from txstream.state.effects import NoteKind
from txstream.streaming.cli.operator_decision import ADMIN_GROUP, send_decision
from txstream.streaming.cli.options import add_kafka_arguments, env, settings_of, topics_of
from txstream.streaming.cli.transaction_trail import (
    Trail,
    add_index_argument,
    index_feed,
    trail_of,
)
from txstream.topics import Topics, validate_group

__all__ = ["add_parser", "resolve_command"]

# The notes that answer an operator's decision: taken, or refused.
_TAKEN = (NoteKind.RELEASED, NoteKind.ROLLED_BACK)
_REFUSED = (NoteKind.REJECTED, NoteKind.DUPLICATE, NoteKind.END_BEFORE_HALF)
_ENDED = (NoteKind.RELEASED, NoteKind.ROLLED_BACK, NoteKind.DISCARDED)


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
    r.add_argument("--force", action="store_true",
                   help="write the decision even for a transaction with no history or one "
                        "already ended (the console refuses both, with 409)")
    r.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                   help="wait this long for the coordinator to record the decision")
    add_index_argument(r, env("index"), "one in memory, for this call")
    r.set_defaults(func=resolve_command)


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
        if note.get("operator") == who and note.get("event") in _TAKEN:
            return note
        if int(note.get("at") or 0) >= since_ms and note.get("event") in _REFUSED:
            return note
    return None


def _refusal(trail: Trail, txid: str, topics: Topics) -> str | None:
    """Why a decision for ``txid`` would not be taken, as the console refuses it: no history
    (the coordinator never registered it) or already ended. None: it is pending."""
    final = [n for n in trail.notes if n.get("event") in _ENDED]
    if final:
        return (f"{txid} is already {final[-1]['event']} ({format_ms(final[-1].get('at'))}); "
                "a contradicting decision goes to the dead-letter topic")
    if not trail:
        return (f"no history for {txid} on {topics.history} (not registered yet, a wrong "
                "--topic-prefix, or a coordinator with --no-history?): a decision for it "
                "waits as an early end event and is dead-lettered if its half message "
                "never comes")
    return None


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
    with Index(args.index or MEMORY) as index, index_feed(index, settings, topics) as feed:
        feed.catch_up()
        refusal = _refusal(trail_of(index, txid), txid, topics)
        if refusal is not None and not args.force:
            print(f"txstream: refused: {refusal}. Nothing was written; --force writes it.",
                  file=sys.stderr)
            return 1
        if refusal is not None:
            print(f"warning: {refusal} (--force)", file=sys.stderr)
        written = send_decision(settings, topics, txid, args.decision, who, args.reason, group)
        print(f"{args.decision.value} for {txid} by {who} written to "
              f"{written.topic}[{written.partition}]@{written.offset} at "
              f"{format_ms(written.born_ms)}")
        if args.wait <= 0:
            print(f"the coordinator applies it in its next batch: txstream history {txid}")
            return 0
        return _await_verdict(feed, txid, who, written.born_ms - 1000, args.wait)
