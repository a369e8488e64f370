"""Parked transactions: pending ones whose next deadline is far off, kept as fixed-width records.

Why: a bucket's state is one value, and every micro-batch that touches the bucket (with 64
buckets, every batch with input) moves all of it from the state store to Python and back. Kept
as ``Transaction`` objects with their half message, a pending transaction cost ~290 bytes and
~23 us of unpickling and pickling per batch: a million pending made every batch take many
seconds. A parked transaction is a 40-byte record in one NumPy array: no Python object per
transaction, ~7x fewer bytes. Its half message stays where it already is, in the half topic,
referred to by (partition, offset), as RocketMQ refers to its commit log; it is read back
only when the transaction is touched again (an event for it, or its timer).

A record holds everything :class:`~state.lifecycle.Transaction` needs besides the half message,
so a transaction restored from it is equal to the one that was parked and runs through the same
core (:func:`~state.lifecycle.apply`, :func:`~state.lifecycle.on_timeout`): parking changes
where a transaction waits, not what happens to it. Only PENDING transactions with no held end
events are parked (everything else either resolves soon or needs no half message).

On the wire the records follow the bucket's own encoding as a trailer (see :func:`join`), so a
reader that only knows :meth:`Bucket.decode` (which ignores bytes after its pickle) still reads
the hot part.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from state.bucket import Bucket
from state.lifecycle import Status, Transaction
from txstream.message import Message

__all__ = [
    "RECORD",
    "Parked",
    "txid_hash",
    "position",
    "positions",
    "parkable",
    "park",
    "restore",
    "split",
    "join",
]

# Little-endian, packed: 40 bytes a transaction. ``pos``: partition << 40 | offset of its half
# message in the half topic (offsets below 2**40, partitions below 2**23).
RECORD = np.dtype([("h", "<u8"), ("pos", "<i8"), ("deadline", "<i8"), ("next_check", "<i8"),
                   ("sent", "<u4"), ("answered", "<u4")])
_MAGIC = b"TXPK"
_FOOTER = struct.Struct("<II4s")  # record count, trailer version, magic
_VERSION = 1
_OFFSET_BITS = 40


def txid_hash(transaction_id: str) -> int:
    """64 bits, stable across processes (``hash()`` is salted per process).

    A collision only makes an event restore a parked transaction it does not belong to; the
    restored one is still a valid pending transaction and is parked again, so nothing is wrong,
    it only costs a read.
    """
    digest = hashlib.blake2b(transaction_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def position(record: Any) -> tuple[int, int]:
    """(partition, offset) of a record's half message."""
    pos = int(record["pos"])
    return pos >> _OFFSET_BITS, pos & ((1 << _OFFSET_BITS) - 1)


class Parked:
    """The parked transactions of one bucket: records sorted by ``h``."""

    __slots__ = ("records",)

    def __init__(self, records: np.ndarray | None = None) -> None:
        self.records: np.ndarray = records if records is not None else np.empty(0, RECORD)

    def __len__(self) -> int:
        return len(self.records)

    def min_deadline(self) -> int | None:
        return int(self.records["deadline"].min()) if len(self.records) else None

    def find(self, transaction_ids: Iterable[str]) -> np.ndarray:
        """Indices of the records whose hash one of ``transaction_ids`` has."""
        if not len(self.records):
            return np.empty(0, np.int64)
        wanted = np.fromiter((txid_hash(t) for t in transaction_ids), np.uint64)
        hashes = self.records["h"]
        at = np.searchsorted(hashes, wanted)
        inside = at < len(hashes)
        hit = at[inside][hashes[at[inside]] == wanted[inside]]
        unique: np.ndarray = np.unique(hit)
        return unique

    def due(self, now: int) -> np.ndarray:
        """Indices of the records whose deadline has come."""
        return np.flatnonzero(self.records["deadline"] <= now)

    def take(self, indices: np.ndarray) -> np.ndarray:
        """Remove and return the records at ``indices``."""
        if not len(indices):
            return np.empty(0, RECORD)
        taken: np.ndarray = self.records[indices]
        self.records = np.delete(self.records, indices)
        return taken

    def add(self, records: np.ndarray) -> None:
        if not len(records):
            return
        merged = np.concatenate([self.records, records])
        self.records = merged[np.argsort(merged["h"], kind="stable")]

    def encode(self) -> bytes:
        return self.records.tobytes() if len(self.records) else b""

    @classmethod
    def decode(cls, raw: bytes | memoryview, count: int) -> Parked:
        # A copy: the state blob's buffer is not ours to keep, and take/add replace it anyway.
        return cls(np.frombuffer(raw, RECORD, count).copy())


def parkable(tx: Transaction, now: int, park_after: int) -> bool:
    """PENDING, nothing held, its half's position known, and its deadline ``park_after`` away."""
    half = tx.half
    return (
        tx.status is Status.PENDING
        and not tx.held
        and half is not None
        and half.queue_id is not None
        and half.queue_offset is not None
        and tx.next_check is not None
        and 0 <= half.queue_offset < (1 << _OFFSET_BITS)
        and 0 <= half.queue_id < (1 << 23)
        and tx.deadline - now >= park_after
    )


def park(bucket: Bucket, parked: Parked, now: int, park_after: int) -> int:
    """Move every parkable transaction of ``bucket`` into ``parked``; returns how many."""
    chosen = [tx for tx in bucket.transactions.values() if parkable(tx, now, park_after)]
    if not chosen:
        return 0
    records = np.empty(len(chosen), RECORD)
    for i, tx in enumerate(chosen):
        half = tx.half
        assert half is not None and half.queue_id is not None and half.queue_offset is not None
        assert tx.next_check is not None
        records[i] = (txid_hash(tx.transaction_id),
                      (half.queue_id << _OFFSET_BITS) | half.queue_offset,
                      tx.deadline, tx.next_check, tx.checks_sent, tx.checks_answered)
        del bucket.transactions[tx.transaction_id]
    parked.add(records)
    return len(chosen)


def restore(record: Any, half: Message) -> Transaction:
    """The parked transaction, whole again, from its record and its half message as read."""
    assert half.transaction_id is not None
    return Transaction(
        transaction_id=half.transaction_id,
        status=Status.PENDING,
        deadline=int(record["deadline"]),
        producer_group=half.producer_group,
        half=half,
        held=(),
        checks_sent=int(record["sent"]),
        checks_answered=int(record["answered"]),
        next_check=int(record["next_check"]),
    )


def split(blob: bytes | None) -> tuple[bytes | None, Parked]:
    """A state value -> (the bucket's own encoding, its parked records)."""
    if not blob or len(blob) < _FOOTER.size or blob[-4:] != _MAGIC:
        return blob, Parked()
    count, version, _ = _FOOTER.unpack_from(blob, len(blob) - _FOOTER.size)
    if version != _VERSION:
        raise ValueError(f"parked-records format {version} is not {_VERSION}")
    size = count * RECORD.itemsize
    end = len(blob) - _FOOTER.size
    view = memoryview(blob)
    return bytes(view[: end - size]), Parked.decode(view[end - size: end], count)


def join(bucket_blob: bytes, parked: Parked) -> bytes:
    """The bucket's encoding, then the records and a footer (nothing extra when none)."""
    if not len(parked):
        return bucket_blob
    return b"".join((bucket_blob, parked.encode(),
                     _FOOTER.pack(len(parked), _VERSION, _MAGIC)))


def positions(records: Sequence[Any] | np.ndarray) -> list[tuple[int, int]]:
    return [position(r) for r in records]
