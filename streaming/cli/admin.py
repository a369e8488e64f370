"""``txstream resolve`` and ``txstream history``: an operator's hands on one transaction.

``resolve TXID --commit|--rollback`` writes an end event with ``ADMIN_OPERATOR`` set through
the end topic producers use, so the coordinator applies it like any other end event (in order,
checkpointed) and records it in the history as the operator's decision. ``history TXID`` reads
what the coordinator wrote about the transaction: its history notes, and the discard and
dead-letter records keyed by it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from streaming.cli.options import add_kafka_arguments, format_ms, settings_of, topics_of
from txstream.errors import MalformedRecord, SendFailed
from txstream.kafka import KafkaSettings, TopicReader, make_producer
from txstream.message import Decision, EndEvent
from txstream.topics import Topics, validate_group
from txstream.wire import H, decode_history, encode_end, header_dict

__all__ = ["add_parser", "resolve_command", "history_command", "Trail",
           "read_trail", "describe", "ADMIN_GROUP"]

ADMIN_GROUP = "txstream-admin"


@dataclass
class Trail:
    """Everything the coordinator wrote about one transaction, oldest first."""

    notes: list[dict[str, Any]]
    discards: list[Any]
    dead_letters: list[Any]

    def add(self, records: list[Any], txid: str, topics: Topics) -> None:
        key = txid.encode("utf-8")
        for rec in records:
            if rec.topic == topics.history:
                try:
                    notes = decode_history(rec.value, rec.key)
                except MalformedRecord:
                    continue
                for note in notes:
                    # A replayed micro-batch writes its notes again, identical (same batch time).
                    if note.get("transaction_id") == txid and note not in self.notes:
                        self.notes.append(note)
            elif rec.key != key:
                continue
            elif rec.topic == topics.discard:
                self.discards.append(rec)
            elif rec.topic == topics.dead_letter:
                self.dead_letters.append(rec)
        self.notes.sort(key=lambda n: int(n.get("at") or 0))

    def __bool__(self) -> bool:
        return bool(self.notes or self.discards or self.dead_letters)


def read_trail(reader: TopicReader, txid: str, topics: Topics, trail: Trail | None = None
               ) -> Trail:
    trail = trail or Trail([], [], [])
    trail.add(reader.read_new(), txid, topics)
    return trail


def _reader(settings: KafkaSettings, topics: Topics) -> TopicReader:
    return TopicReader(settings, [topics.history, topics.discard, topics.dead_letter])


def describe(note: dict[str, Any]) -> str:
    """A history note in words."""
    event = str(note.get("event"))
    decision = note.get("decision")
    how = ""
    if note.get("from_check"):
        how += " answering a back-check"
    if note.get("operator"):
        how += f" (admin decision by {note['operator']})"
    remark = f"; remark: {note['remark']}" if note.get("remark") else ""
    if event == "half":
        return (f"half message registered: group {note.get('group')}, real topic "
                f"{note.get('topic')}; first check at {format_ms(note.get('first_check'))}")
    if event == "check_sent":
        return f"back-check #{note.get('check')} sent ({note.get('late_ms')} ms after due)"
    if event == "unknown":
        return (f"{decision}{how}: still unknown, {note.get('checks_answered')} check(s) "
                f"answered{remark}")
    if event == "released":
        return f"{decision}{how}: released to its real topic{remark}"
    if event == "rolled_back":
        return f"{decision}{how}: rolled back, never visible{remark}"
    if event == "end_before_half":
        return f"end event {decision} came before its half message: held until it comes"
    if event == "duplicate":
        return f"duplicate {note.get('of') or decision} ignored (already {note.get('status')})"
    if event in ("discarded", "rejected", "expired"):
        return f"{event}: {note.get('reason')}"
    extra = {k: v for k, v in note.items() if k not in ("at", "event")}
    return f"{event} {json.dumps(extra)}" if extra else event


def _where(rec: Any) -> str:
    return f"{rec.topic}[{rec.partition}]@{rec.offset}"


def print_trail(trail: Trail, txid: str) -> None:
    print(f"transaction {txid}")
    start = int(trail.notes[0].get("at") or 0) if trail.notes else 0
    for note in trail.notes:
        at = int(note.get("at") or 0)
        print(f"  {format_ms(at)}  +{(at - start) / 1000:7.3f}s  {note.get('event', '?'):<15} "
              f"{describe(note)}")
    for rec in trail.discards:
        h = header_dict(rec.headers)
        print(f"  discard record {_where(rec)}: {h.get(H.DISCARD_REASON)} "
              f"(answered checks {h.get(H.CHECK_TIMES)}, real topic {h.get(H.REAL_TOPIC)})")
    for rec in trail.dead_letters:
        h = header_dict(rec.headers)
        kind = h.get(H.COMMIT_OR_ROLLBACK) or ("half message" if h.get(H.TRAN_MSG) else "record")
        print(f"  dead letter {_where(rec)}: {kind} refused: {h.get(H.DLQ_REASON)} (from "
              f"{h.get(H.DLQ_ORIGIN_TOPIC)}[{h.get(H.DLQ_ORIGIN_PARTITION)}]"
              f"@{h.get(H.DLQ_ORIGIN_OFFSET)})")


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
    r.set_defaults(func=resolve_command)

    h = sub.add_parser("history", help="what happened to one transaction, and when")
    add_kafka_arguments(h)
    h.add_argument("transaction_id", metavar="TXID")
    h.add_argument("--json", action="store_true", help="the raw history notes, one per line")
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


def resolve_command(args: argparse.Namespace) -> int:
    settings, topics = settings_of(args), topics_of(args)
    txid, who = args.transaction_id, _operator(args)
    group = validate_group(args.group)
    with _reader(settings, topics) as reader:
        trail = read_trail(reader, txid, topics)
        final = [n for n in trail.notes if n.get("event") in ("released", "rolled_back",
                                                               "discarded")]
        if final:
            print(f"warning: {txid} is already {final[-1]['event']} "
                  f"({format_ms(final[-1].get('at'))}); a contradicting decision goes to the "
                  "dead-letter topic", file=sys.stderr)
        elif not trail:
            print(f"warning: no history for {txid} on {topics.history} (wrong --topic-prefix, "
                  "or a coordinator with --no-history?)", file=sys.stderr)
        born = int(time.time() * 1000)
        event = EndEvent(txid, group, args.decision, operator=who, remark=args.reason,
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
        print(f"{args.decision.value} for {txid} by {who} written to "
              f"{meta.topic}[{meta.partition}]@{meta.offset} at {format_ms(born)}")
        if args.wait <= 0:
            print(f"the coordinator applies it in its next batch: txstream history {txid}")
            return 0
        deadline = time.monotonic() + args.wait
        while True:
            trail = read_trail(reader, txid, topics, trail)
            note = _outcome(trail, who, born - 1000)
            if note is not None:
                print(f"coordinator: {note['event']}: {describe(note)}")
                return 0 if note.get("operator") == who else 1
            if time.monotonic() >= deadline:
                print(f"txstream: the coordinator did not record the decision within "
                      f"{args.wait:g}s (is it running, with the same --topic-prefix?)",
                      file=sys.stderr)
                return 1
            time.sleep(0.5)


def history_command(args: argparse.Namespace) -> int:
    settings, topics = settings_of(args), topics_of(args)
    with _reader(settings, topics) as reader:
        trail = read_trail(reader, args.transaction_id, topics)
    if args.json:
        for note in trail.notes:
            print(json.dumps(note))
        return 0 if trail else 1
    if not trail:
        print(f"no history for {args.transaction_id} on {topics.history}", file=sys.stderr)
        return 1
    print_trail(trail, args.transaction_id)
    return 0
