"""The web console and its index: a transaction's whole life, at a glance.

``txstream.console.index``: an embedded SQLite index of the coordinator's history, discard and
dead-letter topics (and the half messages' ids and keys), fed incrementally
(``txstream.console.feed``) and queried by transaction id, message id, business key, status and
group (``txstream.console.queries``). ``txstream history`` and ``txstream resolve --wait`` read it
too. ``txstream.console.web``: the pages and the JSON API of ``txstream console`` (Flask, the
``console`` extra); this package's other modules need only the standard library and txstream.
"""

from txstream.console.feed import Feeder, FeedStats, IndexFeed, catch_up
from txstream.console.index import MEMORY, Index
from txstream.console.queries import TimelineRow, TxQuery
from txstream.console.transaction_rows import IndexStatus, TxRow

__all__ = ["Index", "MEMORY", "IndexFeed", "Feeder", "FeedStats", "catch_up", "IndexStatus",
           "TxRow", "TimelineRow", "TxQuery"]
