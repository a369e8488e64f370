"""``txstream dead-letters release``: committed messages the broker refused, released once the
cause is mended (the topic created, its size limit raised, the coordinator allowed to write).

The sink writes such a release to the dead-letter topic, keyed by its transaction id, with the
topic it was for and its body (or where the body lies in the half topic), and notes
``release_refused`` with where that dead letter lies (:mod:`txstream.sinks.delivery`). This
command reads those notes back from the history topic, leaves out the ones a later note says
were released from their dead letter, and writes each other message to its topic once:

- the release carries an id made from its dead letter's place, and is looked for on its topic
  first (a run that died between the release and its note wrote it already);
- its note (``released``, ``from_dead_letter``) goes to the history once the release is
  acknowledged, under the state key of the refusal's note, so the console and ``txstream
  history`` tell it in order.
"""

from __future__ import annotations

import argparse
import getpass
import os
import time
from dataclasses import dataclass
from typing import Any

from txstream.errors import TxStreamError
from txstream.headers import header_dict
from txstream.kafka import KafkaSettings, PatientConsumer, make_producer
from txstream.kafka.reading import read_range, read_topic
from txstream.outputs import decode_history, encode_history
from txstream.readback.replay import written_ids
from txstream.record_ids import coordinator_tag, record_id
from txstream.refusals import Code
from txstream.sinks.delivery import MissingTopic, missing_topic, refused_by_broker
from txstream.state.effects import NoteKind
from txstream.streaming.cli.options import add_kafka_arguments, settings_of, topics_of
from txstream.topics import Topics
from txstream.wire import H

__all__ = ["add_parser", "dead_letters_command", "NotReleased", "Refused", "refused_releases"]

_TIMEOUT_S = 30.0
_REASONS = (Code.MISSING_TOPIC, Code.REFUSED_BY_BROKER)


class NotReleased(TxStreamError):
    """A refused release that cannot be released yet, and why."""


@dataclass(frozen=True)
class Refused:
    """A refused release the history tells of: its transaction, why, where its dead letter
    lies (partition, offset) and the history key its notes are written under."""

    transaction_id: str
    code: str
    dead_letter: tuple[int, int]
    history_key: bytes | None


def add_parser(sub: Any) -> None:
    d = sub.add_parser("dead-letters", help="act on the dead-letter topic")
    actions = d.add_subparsers(dest="action", required=True)
    r = actions.add_parser("release", help="release again the committed messages the broker "
                                           "refused, once the cause is mended (each once)")
    add_kafka_arguments(r)
    r.add_argument("--reason", action="append", choices=_REASONS,
                   help="only the refusals of this code (repeatable; default: all)")
    r.add_argument("--transaction", action="append", metavar="TXID",
                   help="only this transaction (repeatable)")
    r.add_argument("--dry-run", action="store_true", help="say what would be released")
    r.set_defaults(func=dead_letters_command)


def refused_releases(settings: KafkaSettings, topics: Topics) -> list[Refused]:
    """The refused releases the history tells of that no later note says were released."""
    refused: dict[str, Refused] = {}
    for rec in read_topic(settings, topics.history, _TIMEOUT_S):
        try:
            notes = decode_history(rec.value, rec.key)
        except TxStreamError:
            continue  # not a history record
        for note in notes:
            txid, event = str(note.get("transaction_id")), note.get("event")
            if event == NoteKind.RELEASE_REFUSED and note.get("dead_letter"):
                partition, _, offset = str(note["dead_letter"]).partition("@")
                refused[txid] = Refused(txid, str(note.get("code")),
                                        (int(partition), int(offset)), rec.key)
            elif event == NoteKind.RELEASED:
                refused.pop(txid, None)  # released since: from its dead letter, or again
    return list(refused.values())


def _read_one(settings: KafkaSettings, topic: str, partition: int, offset: int) -> Any:
    consumers = PatientConsumer(settings, role="admin")
    try:
        found = list(read_range(consumers, topic, partition, offset, offset + 1, _TIMEOUT_S,
                                stop_at_end=True))
    finally:
        consumers.close()
    return found[0] if found and getattr(found[0], "offset", None) == offset else None


def _release_of(settings: KafkaSettings, dead: Any, txid: str) -> tuple[str, Any, Any, list[Any]]:
    """The release a dead letter holds: its topic, key, body and headers."""
    h = header_dict(dead.headers)
    body = dead.value
    if H.DLQ_ORIGINAL_BYTES in h:  # too large for a dead letter: read it where it lies
        half = _read_one(settings, h[H.DLQ_ORIGIN_TOPIC], int(h[H.DLQ_ORIGIN_PARTITION]),
                         int(h[H.DLQ_ORIGIN_OFFSET]))
        if half is None or half.key != txid.encode():
            raise TxStreamError(f"the body of {txid} is no longer in {h[H.DLQ_ORIGIN_TOPIC]}")
        body = half.value
    headers = [(k, v) for k, v in dead.headers
               if not k.startswith("DLQ_") and k not in (H.REAL_TOPIC, H.RECORD_ID)]
    key = h[H.KEYS].encode() if h.get(H.KEYS) else None
    return h[H.REAL_TOPIC], key, body, headers


def _release(settings: KafkaSettings, topics: Topics, refused: Refused, dry_run: bool) -> str:
    """Release one refused message; what became of it, in words. Raises NotReleased."""
    partition, offset = refused.dead_letter
    dead = _read_one(settings, topics.dead_letter, partition, offset)
    if dead is None or dead.key != refused.transaction_id.encode():
        raise NotReleased(f"its dead letter {partition}@{offset} is gone (retention?)")
    topic, key, body, headers = _release_of(settings, dead, refused.transaction_id)
    if missing_topic(settings, topic):
        raise NotReleased(f"{topic} still does not exist (txstream topics create)")
    tag = coordinator_tag(topics)
    rid = record_id(tag, f"dl{partition}", offset, 0)
    if written_ids(settings, {topic: {rid}}, dead.timestamp):
        action = "released before (its note was not written): noted now"
    elif dry_run:
        return f"would be released to {topic}"
    else:
        _send(settings, topic, key, body, [*headers, (H.RECORD_ID, rid.encode())])
        action = f"released to {topic}"
    if not dry_run:
        _note(settings, topics, refused, record_id(tag, f"dl{partition}", offset, 1))
    return action


def _send(settings: KafkaSettings, topic: str, key: Any, value: Any, headers: list[Any]
          ) -> None:
    producer = make_producer(settings, role="admin")
    try:
        producer.send(topic, key=key, value=value, headers=headers).get(timeout=_TIMEOUT_S)
    except Exception as exc:
        if refused_by_broker(exc):  # the cause is not mended yet
            raise NotReleased(f"the broker refused it again: {type(exc).__name__}: {exc}"
                              ) from None
        raise
    finally:
        producer.close()


def _note(settings: KafkaSettings, topics: Topics, refused: Refused, rid: str) -> None:
    partition, offset = refused.dead_letter
    detail = {"decision": "COMMIT_MESSAGE", "from_dead_letter": f"{partition}@{offset}",
              "operator": os.environ.get("TXSTREAM_OPERATOR") or getpass.getuser()}
    lines = [(refused.transaction_id, int(time.time() * 1000), NoteKind.RELEASED.value, detail)]
    [(record, _)] = encode_history(lines, refused.history_key, topics)
    _send(settings, topics.history, record.key, record.value, [(H.RECORD_ID, rid.encode())])


def dead_letters_command(args: argparse.Namespace) -> int:
    settings, topics = settings_of(args), topics_of(args)
    wanted = [r for r in refused_releases(settings, topics)
              if (not args.reason or r.code in args.reason)
              and (not args.transaction or r.transaction_id in args.transaction)]
    if not wanted:
        print("no refused release waits on the dead-letter topic")
        return 0
    failed = 0
    for refused in wanted:
        try:
            what = _release(settings, topics, refused, args.dry_run)
        except (TxStreamError, MissingTopic) as exc:  # NotReleased among them
            what, failed = f"not released: {exc}", failed + 1
        print(f"{refused.transaction_id} ({refused.code}): {what}")
    return 1 if failed else 0
