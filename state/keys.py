"""Which state key holds a transaction: the time window its id was made in, and a shard.

Why not one key per transaction: ``applyInPandasWithState`` costs a Python call and a pandas
frame per key per micro-batch (~2-5 ms here), so transactions share keys. Why not a fixed set
of hash buckets: then every key is touched by every busy micro-batch, and each batch decodes
and re-encodes every transaction the coordinator holds (pending ones, and resolved ones kept
for duplicates): the cost of a batch grows with everything held, not with its own work.

So a key is a slice of *time*. The client library's transaction ids are UUIDv7 (RFC 9562),
which carry the millisecond they were made in; every event of a transaction names its id, so
all of them reach the same key, computed from the event alone (a replay routes the same way).
A key holds the transactions of one ``window_ms`` window and one of ``shards`` shards. New
traffic lands in new keys; a key is touched while its transactions arrive and resolve and when
their timers fire, then it empties and is dropped. A transaction that stays pending for hours
sits in a key nobody touches, at no cost per batch.

Shards spread a window over Spark's tasks. Spark sends a key to shuffle partition
``pmod(murmur3(key), partitions)``; the key values are chosen (:func:`spark_partition`) so that
shard ``s`` lands on partition ``s % partitions``: with as many shards as partitions, each
window's work splits evenly over the tasks, and a batch touches as few keys as possible.

An id without a time (any other string a producer chose) falls back to one of
``fallback_buckets`` hash buckets (negative keys): correct as well, but such a bucket is
touched by every batch that has one of its events, whatever else it holds.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from functools import lru_cache

__all__ = ["KeyLayout", "UNROUTABLE", "PROGRESS_KEY", "id_time_ms", "state_key", "key_window",
           "spark_partition"]

# Records with no usable transaction id: they are only dead-lettered, never stored.
UNROUTABLE = -(2**62)
# The source's one progress row per micro-batch (sources.progress): it holds no transaction.
PROGRESS_KEY = UNROUTABLE + 1

_HEX = frozenset("0123456789abcdefABCDEF")
_VARIANT = frozenset("89abAB")  # RFC 9562 variant bits 10xx
# Candidate key values per (window, shard): enough that one lands on the wanted partition
# (with 2 partitions, all 64 miss with probability 2**-64; with 8, 0.02 %).
_SPREAD = 64


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """How transactions map to state keys. Fixed for a checkpoint's life (see
    ``txstream.streaming.engine.query.pin_layout``): another layout would route events to keys that
    never saw their transaction. ``partitions``: Spark's shuffle partitions of the query."""

    window_ms: int = 1000
    shards: int = 2
    fallback_buckets: int = 16
    partitions: int = 2

    def __post_init__(self) -> None:
        if self.window_ms < 1:
            raise ValueError("window_ms must be at least 1")
        if min(self.shards, self.fallback_buckets, self.partitions) < 1:
            raise ValueError("shards, fallback_buckets and partitions must be at least 1")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def id_time_ms(transaction_id: str) -> int | None:
    """The creation time of a UUIDv7 id (32 hex digits, or 36 with dashes); None otherwise."""
    if len(transaction_id) == 32:
        compact = transaction_id
    elif len(transaction_id) == 36 and transaction_id[8] == transaction_id[13] == "-" \
            and transaction_id[18] == transaction_id[23] == "-":
        compact = transaction_id.replace("-", "")
        if len(compact) != 32:
            return None
    else:
        return None
    if compact[12] != "7" or compact[16] not in _VARIANT or not _HEX.issuperset(compact):
        return None
    return int(compact[:12], 16)


def state_key(transaction_id: str, layout: KeyLayout) -> int:
    """The state key of a transaction id: a window's shard, or a negative fallback bucket."""
    spread = zlib.crc32(transaction_id.encode("utf-8"))
    born = id_time_ms(transaction_id)
    if born is None:
        bucket = spread % layout.fallback_buckets
        return _placed(-1 - bucket, bucket % layout.partitions, layout.partitions)
    shard = spread % layout.shards
    slot = (born // layout.window_ms) * layout.shards + shard
    return _placed(slot, shard % layout.partitions, layout.partitions)


def key_window(key: int, layout: KeyLayout) -> tuple[int, int] | None:
    """The [start, end) ms of a time-window key; None for a fallback bucket or UNROUTABLE
    (whose keys are all negative)."""
    if key < 0:
        return None
    start = (key // _SPREAD // layout.shards) * layout.window_ms
    return start, start + layout.window_ms


@lru_cache(maxsize=65536)
def _placed(slot: int, partition: int, partitions: int) -> int:
    """The first of ``slot``'s candidate key values that Spark sends to ``partition``: the
    ``_SPREAD`` values from ``slot * _SPREAD`` away from zero (negative slots stay negative)."""
    step = 1 if slot >= 0 else -1
    base = slot * _SPREAD
    for candidate in range(base, base + step * _SPREAD, step):
        if spark_partition(candidate, partitions) == partition:
            return candidate
    return base  # only balance suffers


_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _mix_k1(k: int) -> int:
    return (_rotl((k * 0xCC9E2D51) & _M32, 15) * 0x1B873593) & _M32


def _mix_h1(h: int, k: int) -> int:
    return (_rotl(h ^ k, 13) * 5 + 0xE6546B64) & _M32


def spark_partition(key: int, partitions: int) -> int:
    """The shuffle partition Spark gives a bigint grouping key: ``pmod(hash(key), n)``, where
    ``hash`` is Spark's Murmur3 x86_32 of the long with seed 42 (``Murmur3_x86_32.hashLong``)."""
    value = key & 0xFFFFFFFFFFFFFFFF
    h = _mix_h1(_mix_h1(42, _mix_k1(value & _M32)), _mix_k1(value >> 32))
    h ^= 8  # the length in bytes
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & _M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & _M32
    h ^= h >> 16
    signed = h - (1 << 32) if h & 0x80000000 else h
    return signed % partitions
