"""The coordinator's own releases on a real topic partition, read once for every state key's look.

A new checkpoint looks on the real topics for releases its predecessor wrote but did not note
(docs/decisions/0029-releases-found.md). Each state key holding such transactions asks; read
per key, a partition was read again by every key, back to each key's oldest born time: after
a new checkpoint over long-pending transactions, quadratic. Here a worker process reads each
partition at most once: backwards as far as the oldest time any key asked for, forwards as new
records come, keeping of each record of this coordinator (its id tag) the transaction it
carries and the prefix of the id it was written under (``tag.key.epoch.``: which state key of
which checkpoint wrote it). Every key's question is then a lookup.

What is kept is two 8-byte hashes a record (Python's string hash, stable within the process
that made them): 16 MB for a million releases. Two ids with the same 64-bit hash would be
taken for one; at a million releases the odds of any such pair are 3 in 10^8, and the look
compares the whole prefix of the key that asks.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from txstream.kafka import ConsumerRecord, EndProbe, KafkaSettings, PatientConsumer
from txstream.kafka.partition_health import unless_held, unless_held_before_ends
from txstream.kafka.read_back import READ_BACK_CHUNK, SKEW_MARGIN_MS, header_text, read_back
from txstream.kafka.reading import Unreadable, read_range
from txstream.wire import H

__all__ = ["released_by_others", "forget_release_indexes", "MAX_PARTITIONS"]

_READ_TIMEOUT_S = 30.0
MAX_PARTITIONS = 256  # partitions indexed per process, the least recently asked dropped first


def _prefix(record_id: str) -> str:
    return record_id.rsplit(".", 1)[0] + "."


class _PartitionIndex:
    """The records of ``[low, high)`` of one partition that a coordinator with ``tag`` wrote:
    per record, the hash of its transaction id and of its id's prefix."""

    def __init__(self, tag: str, end: int) -> None:
        self.tag = tag
        self.low = self.high = end
        self.oldest_own: int | None = None  # the oldest timestamp of a record of ``tag``
        self._txids, self._prefixes = array("q"), array("q")
        self._sorted: tuple[Any, Any] | None = None

    def covers(self, since_ms: int) -> bool:
        """Whether every record of ``tag`` sent after ``since_ms`` below ``high`` is indexed."""
        return self.low <= 0 or (self.oldest_own is not None
                                 and self.oldest_own < since_ms - SKEW_MARGIN_MS)

    def own(self, rec: ConsumerRecord) -> bool:
        rid = header_text(rec.headers, H.RECORD_ID)
        return rid is not None and rid.split(".", 1)[0] == self.tag

    def add(self, records: Iterable[ConsumerRecord | Unreadable]) -> None:
        for rec in records:
            if isinstance(rec, Unreadable) or not self.own(rec):
                continue
            txid = header_text(rec.headers, H.TRANSACTION_ID)
            rid = header_text(rec.headers, H.RECORD_ID)
            if txid is None or rid is None:
                continue
            self._txids.append(hash(txid))
            self._prefixes.append(hash(_prefix(rid)))
            ts = rec.timestamp if isinstance(rec.timestamp, int) and rec.timestamp >= 0 else None
            if ts is not None and (self.oldest_own is None or ts < self.oldest_own):
                self.oldest_own = ts
            self._sorted = None

    def found(self, txids: Iterable[str], ours: str) -> set[str]:
        """Those of ``txids`` with a record under an id prefix other than ``ours``."""
        if self._sorted is None:
            keys = np.frombuffer(self._txids, dtype=np.int64)
            order = np.argsort(keys, kind="stable")
            self._sorted = (keys[order], np.frombuffer(self._prefixes, dtype=np.int64)[order])
        keys, prefixes = self._sorted
        mine = hash(ours)
        out = set()
        for txid in txids:
            h = hash(txid)
            first, last = np.searchsorted(keys, h), np.searchsorted(keys, h, side="right")
            if first < last and bool((prefixes[first:last] != mine).any()):
                out.add(txid)
        return out


_INDEXES: OrderedDict[tuple[str, str, str, int], _PartitionIndex] = OrderedDict()
_LOCK = threading.Lock()


def forget_release_indexes() -> None:
    """Drop every index (a simulated process that dies takes them with it)."""
    with _LOCK:
        _INDEXES.clear()


def _index(settings: KafkaSettings, tag: str, topic: str, partition: int, end: int
           ) -> _PartitionIndex:
    key = (settings.bootstrap_servers, tag, topic, partition)
    with _LOCK:
        index = _INDEXES.get(key)
        if index is None or index.high > end:  # a topic created again: start over
            index = _INDEXES[key] = _PartitionIndex(tag, end)
        _INDEXES.move_to_end(key)
        while len(_INDEXES) > MAX_PARTITIONS:
            _INDEXES.popitem(last=False)
        return index


def _indexed_to(settings: KafkaSettings, tag: str, topic: str) -> dict[tuple[str, int], int]:
    """Where the indexes of ``topic``'s partitions end."""
    with _LOCK:
        return {(topic, partition): index.high
                for (servers, tag_, topic_, partition), index in _INDEXES.items()
                if (servers, tag_, topic_) == (settings.bootstrap_servers, tag, topic)}


def _extend(consumers: PatientConsumer, topic: str, partition: int, index: _PartitionIndex,
            end: int, since_ms: int) -> None:
    """Read what the index lacks: the records after ``high`` up to ``end``, and backwards from
    ``low`` until it covers ``since_ms``."""
    if end > index.high:
        index.add(read_range(consumers, topic, partition, index.high, end, _READ_TIMEOUT_S))
        index.high = end
    if index.covers(since_ms):
        return
    for chunk in read_back(consumers, topic, partition, index.low, since_ms, index.own,
                           _READ_TIMEOUT_S):
        index.add(chunk)
        index.low = chunk.start


def released_by_others(settings: KafkaSettings, wanted: Mapping[str, Mapping[str, int]],
                       tag: str, ours: str) -> set[str]:
    """Which of ``wanted`` ({real topic: {transaction id: since ms}}) a record of coordinator
    ``tag`` carries on its real topic under an id whose prefix is not ``ours``, sent after the
    transaction's ``since``."""
    wanted = {t: ids for t, ids in wanted.items() if ids}
    if not wanted:
        return set()
    # The process's clients, kept for the next key's look: every key of a recovery asks.
    probe = EndProbe(settings, role="sink", kept_as=("look-ends", settings.bootstrap_servers))
    consumers = PatientConsumer(settings, role="sink", max_poll_records=READ_BACK_CHUNK,
                                kept_as=("look", settings.bootstrap_servers))
    found: set[str] = set()
    for topic, ids in wanted.items():
        # A topic that does not exist yet holds nothing. Asked where the index ends: the
        # broker then sends back next to no records.
        unless_held_before_ends(settings, topic, f"{len(ids)} message(s) were released")
        ends = probe.topic_ends([topic], _indexed_to(settings, tag, topic), _READ_TIMEOUT_S)
        since = min(ids.values())
        for (_, partition), end in sorted(ends.items()):
            index = _index(settings, tag, topic, partition, end)
            _extend(consumers, topic, partition, index, end, since)
            found |= index.found(set(ids) - found, ours)
        if ends and set(ids) - found:
            unless_held(settings, topic, f"{len(set(ids) - found)} message(s) were released")
    return found
