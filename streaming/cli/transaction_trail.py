"""What the coordinator wrote about one transaction, read from the console's index: shared by
``txstream resolve`` and ``txstream history``.

Both read the console's index (:mod:`txstream.console.index`), caught up to the topics' ends,
then queried. With ``--index PATH`` that is the console's file, kept between calls; without,
one in memory, read from the topics' beginning for this call.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from txstream.console.feed import IndexFeed
from txstream.console.index import MEMORY, Index
from txstream.console.queries import TimelineRow
from txstream.console.record_entries import Source
from txstream.kafka import KafkaSettings
from txstream.topics import Topics

__all__ = ["Trail", "trail_of", "add_index_argument", "index_feed"]


@dataclass
class Trail:
    """Everything the coordinator wrote about one transaction, oldest first."""

    notes: list[dict[str, Any]]
    discards: list[TimelineRow]
    dead_letters: list[TimelineRow]

    def __bool__(self) -> bool:
        return bool(self.notes or self.discards or self.dead_letters)


def trail_of(index: Index, txid: str) -> Trail:
    """The transaction's history notes (as written), discards and dead letters."""
    events = index.events(txid, (Source.HISTORY, Source.DISCARD, Source.DEAD_LETTER))
    return Trail([e.detail for e in events if e.source == Source.HISTORY],
                 [e for e in events if e.source == Source.DISCARD],
                 [e for e in events if e.source == Source.DEAD_LETTER])


def add_index_argument(p: argparse.ArgumentParser, default: str | None, help_default: str
                       ) -> None:
    p.add_argument("--index", metavar="PATH", default=default,
                   help=f"the console's index, an SQLite file read and brought up to date "
                        f"(env TXSTREAM_INDEX; default {help_default})")


def index_feed(index: Index, settings: KafkaSettings, topics: Topics) -> IndexFeed:
    # An index for this call alone: history shows no message ids or keys, so the half topic
    # (bodies and all) stays unread.
    return IndexFeed(index, settings, topics, read_half=index.path != MEMORY)
